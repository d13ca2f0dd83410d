"""The host side of a simulated device: its clock, its costs, its stalls and its drift.

- A graph call (a prefill, a decode step, a cache copy) costs the host ``host_overhead_s``
  to prepare inputs, launch and synchronise: constant per call.
- ``row_host``: after every decode step the host handles each row still generating --
  sampling or receiving its token, checking stop conditions, detokenizing and streaming
  it. vLLM's output processor and NxD Inference's generation loop do this per row in
  Python, some 10-30 us each, so a step gets cheaper as a static batch's rows finish.
- ``launch``: every generate call tokenizes, pads and uploads its batch and sets up
  sampling (``LLM.generate`` in vLLM, HF ``generate`` through NxD's adapter): a few ms
  per call, paid once however many rows the call has.
- ``stragglers``: host hiccups -- a garbage-collection pause, a page fault, the serving
  thread preempted by the OS -- make a rare graph call take several times its usual time
  (by default 1 call in 250 takes 4x). They are rare enough to vanish from a median and
  frequent enough to lengthen every long request a little.
- ``drift``: host speed wanders over minutes (CPU frequency and thermal state, noisy
  neighbours on a shared VM): a smooth, seeded function of the clock scales every host
  cost by up to ``drift_amplitude``. It is driven by a clock, not by call counts, so a
  profile made early and a measurement made minutes later see different host speeds.

The clock reads the simulated seconds the device has spent (compiling and running),
optionally offset by wall time so that runs minutes apart in different processes see
different points of the drift; tests give the runner a clock of their own.
"""
from __future__ import annotations

import hashlib
import time
from typing import Any, Callable

import numpy as np

from .options import SimOptions


def rng_for(*parts: Any) -> np.random.Generator:
    """A generator seeded from ``parts`` (stable across processes)."""
    h = hashlib.sha256(repr(parts).encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:16], "big"))


class SimClock:
    """Seconds on a simulated device's clock: ``start_s`` + seconds spent (+ ``wall()`` if given)."""

    def __init__(self, *, start_s: float = 0.0, wall: Callable[[], float] | None = None):
        self._start = float(start_s)
        self._spent = 0.0
        self._wall = wall

    def now(self) -> float:
        return self._start + self._spent + (self._wall() if self._wall is not None else 0.0)

    def advance(self, seconds: float) -> None:
        self._spent += float(seconds)

    @classmethod
    def for_option(cls, clock: str) -> "SimClock":
        """The clock the ``clock`` option names (``wall``: offset by the time since the epoch)."""
        return cls(wall=time.time if clock == "wall" else None)


class Host:
    """Host costs of one simulated device (see the module docstring)."""

    #: sine components of the drift: few enough to stay smooth over one generate call
    _COMPONENTS = 3

    def __init__(self, opts: SimOptions, *, seed: int):
        self.o = opts
        r = rng_for("drift", seed)
        self._periods = opts.drift_period_s * r.uniform(0.5, 2.0, self._COMPONENTS)
        self._phases = r.uniform(0.0, 2 * np.pi, self._COMPONENTS)
        w = r.uniform(0.5, 1.0, self._COMPONENTS)
        self._weights = w / w.sum()  # the sum of the sines stays within [-1, 1]

    def speed_factor(self, t) -> np.ndarray:
        """Multiplier of host seconds at clock time(s) ``t``: 1 without drift, else 1 +- amplitude."""
        t = np.asarray(t, float)
        if not self.o.drift or self.o.drift_amplitude == 0.0:
            return np.ones_like(t)
        wave = (self._weights * np.sin(2 * np.pi * t[..., None] / self._periods + self._phases)).sum(axis=-1)
        return 1.0 + self.o.drift_amplitude * wave

    def launch_s(self) -> float:
        return self.o.launch_s if self.o.launch else 0.0

    def step_s(self, live_rows: np.ndarray) -> np.ndarray:
        """Host seconds of each decode step with ``live_rows`` rows still generating."""
        per_row = self.o.row_overhead_s if self.o.row_host else 0.0
        return self.o.host_overhead_s + per_row * np.asarray(live_rows, float)

    def stall_factors(self, rng: np.random.Generator, calls: int) -> np.ndarray:
        """How many times its usual time each of ``calls`` graph calls takes."""
        if not self.o.stragglers or self.o.straggler_rate == 0.0:
            return np.ones(calls)
        return np.where(rng.random(calls) < self.o.straggler_rate, self.o.straggler_factor, 1.0)
