"""The runner conformance suite against ``command`` running the example program toy_npu.py."""
from __future__ import annotations

from pathlib import Path

from lens.types import ModelShape, Target
from runners.conformance import RunnerConformance

TOY = Path(__file__).resolve().parents[2] / "examples" / "command_runner" / "toy_npu.py"


def command_target(argv, *, model: ModelShape, policy: str = "exclusive", **options) -> Target:
    opts = {"argv": list(argv), "timeout_s": 60.0, **options}
    return Target(
        name="conformance-command",
        runner="command",
        hardware="toy-npu",
        bucket_policy=policy,
        dtype="bfloat16",
        model=model,
        options=tuple(sorted(opts.items())),
    )


class TestCommandConformance(RunnerConformance):
    prefills = ("sequential",)  # toy-npu encodes prompts one at a time and refuses "batched"

    def make_target(self, *, model: ModelShape | None = None, policy: str = "exclusive") -> Target:
        return command_target(["{python}", str(TOY)], model=model or self.model, policy=policy)

    def make_unusable_target(self) -> Target:
        return command_target(["/nonexistent/lensopt-no-such-program", "--flag"], model=self.model)
