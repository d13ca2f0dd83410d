"""The runner conformance suite against ``jax`` (real XLA execution on this CPU)."""
from __future__ import annotations

import pytest
from conformance import RunnerConformance

from lens.types import ModelShape, Target

pytest.importorskip("jax")


class TestJaxConformance(RunnerConformance):
    def make_target(self, *, model: ModelShape | None = None, policy: str = "exclusive") -> Target:
        return Target(name="conformance-jax", runner="jax", hardware="cpu", bucket_policy=policy, dtype="float32",
                      model=model or self.model)
