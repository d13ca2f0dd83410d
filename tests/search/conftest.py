import os
import textwrap

import pytest

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


@pytest.fixture(scope="session")
def _ray_for_session():
    """Shuts the session's local Ray down at the end (whichever test started it last)."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    yield ray
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def ray_local(_ray_for_session):
    """One local Ray shared by the tests: the search leaves an already-started Ray running.

    Started again when a test between them shut it down (the multi-node cluster tests free
    the cores for their own nodes): without it each search would start and stop a Ray of
    its own, several seconds each.
    """
    ray = _ray_for_session
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    return ray
