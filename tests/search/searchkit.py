"""The search tests' kit: the simulated space file they share.

(A module of its own rather than conftest.py: pytest loads every folder's conftest.py under
one module name, so `from conftest import` reads whichever folder's came last.)
"""
import textwrap

SIM_SPACE = """
[target]
name = "sim-small"
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
{options}

[space]
tp = [1, 2]
batch = [1, 4]
buckets = [128, 256, 512, 1024]

[workload]
distribution = "sharegpt"
length_scale = 0.5
drop_longer = true
requests = 60
seed = 0

[budget]
trials = 40
top_k = 2
{extra}
"""


def write_space(tmp_path, name="space.toml", options="", extra=""):
    p = tmp_path / name
    p.write_text(SIM_SPACE.format(options=options, extra=textwrap.dedent(extra)))
    return p
