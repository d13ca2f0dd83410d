"""Waiting for a wall-clock release time: shared by the runners that serve arrivals for real."""
from __future__ import annotations

import time

#: below this many seconds before a release the host spins instead of sleeping
SPIN_S = 2e-3


def wait_until(deadline: float) -> None:
    """Sleep, then spin the last couple of milliseconds, until ``perf_counter() >= deadline``.

    ``time.sleep`` overshoots by up to a scheduler tick on a busy host; spinning the last
    ``SPIN_S`` keeps a release within microseconds of its arrival time.
    """
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        if left > SPIN_S:
            time.sleep(left - SPIN_S)
