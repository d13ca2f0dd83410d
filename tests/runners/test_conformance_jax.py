"""The runner conformance suite against ``jax`` (real XLA execution on this CPU)."""
from __future__ import annotations

import pytest

from lens.types import ModelShape, Target
from runners.conformance import RunnerConformance

pytest.importorskip("jax")


class TestJaxConformance(RunnerConformance):
    # real timings on a shared host: enough decode steps and repeats that T2 - T1 stands
    # clear of scheduling hiccups (a 15-step difference of a tiny model is ~1 ms)
    buckets = (64, 128, 256)
    max_output = 64
    repeats = 5

    def make_target(self, *, model: ModelShape | None = None, policy: str = "exclusive") -> Target:
        return Target(name="conformance-jax", runner="jax", hardware="cpu", bucket_policy=policy, dtype="float32",
                      model=model or self.model)
