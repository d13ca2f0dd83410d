"""Space-file texts the test folders share: the tiny model of the space-file tests (small enough
that simulating, loading or profiling it costs nothing) and the simulated search space of the
search and fault tests, each written once so one change reaches every test."""
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


#: the simulated search space of the search and fault tests (8 layers, 2 tp x 2 batch units,
#: 4 buckets); ``sim_space`` fills what differs and leaves ``{options}`` and ``{extra}``
SIM_TEMPLATE = """
[target]
name = "{name}"
runner = "sim"
hardware = "inf2"
bucket_policy = "exclusive"
dtype = "bfloat16"

[target.model]
layers = 8
hidden = 1024
heads = 16
kv_heads = 8
intermediate = 4096
vocab = 32000

[target.options]
noise = 0.01
{{options}}

[space]
tp = [1, 2]
batch = [1, 4]
buckets = [128, 256, 512, 1024]

[workload]
distribution = "sharegpt"
length_scale = 0.5
drop_longer = true
requests = {requests}
seed = 0

[budget]
trials = {trials}
top_k = {top_k}
{{extra}}
"""


def sim_space(*, name: str, requests: int, trials: int, top_k: int) -> str:
    """SIM_TEMPLATE with its name, workload size and budget; ``{options}`` and ``{extra}`` stay to fill."""
    return SIM_TEMPLATE.format(name=name, requests=requests, trials=trials, top_k=top_k)
