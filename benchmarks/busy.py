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
