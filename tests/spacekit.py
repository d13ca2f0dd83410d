"""The tiny model that space-file tests share: small enough that simulating, loading or
profiling it costs nothing, the same shape everywhere so one change reaches every test."""
from __future__ import annotations

TINY_MODEL = """[target.model]
layers = 2
hidden = 256
heads = 4
kv_heads = 2
intermediate = 512
vocab = 1000
"""


def tiny_target(name: str, *, runner: str = "sim", hardware: str = "inf2", extra: str = "") -> str:
    """A ``[target]`` table of the tiny model; ``extra`` lines go under ``[target]`` before the model."""
    return f'[target]\nname = "{name}"\nrunner = "{runner}"\nhardware = "{hardware}"\n{extra}' + TINY_MODEL


def space_table(*, tp: tuple[int, ...] = (1,), batch: tuple[int, ...] = (2,),
                buckets: tuple[int, ...] = (64, 128)) -> str:
    """A ``[space]`` table: one unit and two buckets unless told otherwise."""
    def arr(xs: tuple[int, ...]) -> str:
        return "[" + ", ".join(map(str, xs)) + "]"
    return f"[space]\ntp = {arr(tp)}\nbatch = {arr(batch)}\nbuckets = {arr(buckets)}\n"
