"""A competing CPU load for benchmarks: busy processes that this process starts and stops itself."""
from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

#: a process that keeps one core busy until it is stopped
BUSY_CODE = "while True:\n    pass\n"


@contextmanager
def competing_load(processes: int = 1) -> Iterator[list[int]]:
    """Start ``processes`` busy processes (each keeps a core busy); stop them, by pid, on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_CODE], stdin=subprocess.DEVNULL) for _ in range(processes)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


@contextmanager
def no_load() -> Iterator[list[int]]:
    yield []


def load_of(loaded: bool):
    """The context manager of a quiet (no process started) or a loaded run."""
    return competing_load(1) if loaded else no_load()


def host_jitter(runs: int = 20, seed: int = 0) -> float:
    """The host's own run-to-run spread, in percent of the median: the robust standard deviation
    (``lens.noise.spread``, half the central 68% range) of a fixed ~40 ms computation (a loop of
    256x256 float32 matrix products) timed ``runs`` times.

    Nothing a profile or a prediction does can make a measurement on this host steadier than
    this: it is the floor that per-request errors are read against.
    """
    import time

    import numpy as np

    a = np.random.default_rng(seed).random((256, 256), dtype=np.float32)
    a @ a  # load the library's kernels before timing
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(100):
            a @ a
        times.append(time.perf_counter() - t0)
    from lens.noise import spread

    t = np.asarray(times)
    return float(spread(t) / np.median(t) * 100)
