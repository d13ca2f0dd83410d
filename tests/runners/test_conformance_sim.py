"""The runner conformance suite against ``sim`` (a simulated inf2)."""
from __future__ import annotations

from lens.types import ModelShape, Target
from runners.conformance import RunnerConformance


class TestSimConformance(RunnerConformance):
    def make_target(self, *, model: ModelShape | None = None, policy: str = "exclusive") -> Target:
        return Target(
            name="conformance-sim",
            runner="sim",
            hardware="inf2",
            bucket_policy=policy,
            dtype="bfloat16",
            model=model or self.model,
            options=(("noise", 0.01),),
        )
