"""deploy/space.toml: the chosen candidate, pinned with what the search served it under, loadable from anywhere."""
from __future__ import annotations

import os

from lens.types import Candidate
from search.deploy import pinned_space
from spaces import WorkloadDescription, load_space
from spacekit import space_table, tiny_target

CAND = Candidate(1, 2, (64, 128), (64, 128))


def _description(source: str, *, override: bool, requests: int = 7, seed: int = 3) -> WorkloadDescription:
    return WorkloadDescription(source=source, requests=requests, seed=seed, input_mean=10.0, output_mean=5.0,
                               input_max=20, output_max=9, override=override)


def _write_trace(path) -> None:
    path.write_text("input_len,output_len,arrival_s\n" + "".join(f"{5 + i},{3 + i},{i * 0.5}\n" for i in range(30)))


def test_a_relative_trace_is_pinned_by_its_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "spaces").mkdir()
    _write_trace(tmp_path / "trace.csv")
    src = tmp_path / "spaces" / "s.toml"
    src.write_text(tiny_target("pin").replace('runner = "sim"', 'runner = "sim"\nserving = "continuous"', 1)
                   + '\n[target.scheduler]\nmax_prefills = 1\nprefill_priority = "decode"\n'
                   + space_table() + '\n[workload]\ntrace = "../trace.csv"\nrequests = 20\nburstiness = 1.0\n'
                   + '\n[slo]\nttft_p90_s = 0.5\ne2e_p99_s = 4.0\n')
    monkeypatch.chdir(tmp_path)
    space = load_space(os.path.relpath(src))  # as `lensopt run spaces/s.toml` loads it
    out = tmp_path / "results" / "run" / "deploy"
    out.mkdir(parents=True)
    (out / "space.toml").write_text(pinned_space(space, CAND))
    pinned = load_space(out / "space.toml")
    assert pinned.workload.trace == (tmp_path / "trace.csv").resolve()
    assert pinned.workload.requests == 20 and "burstiness" not in (out / "space.toml").read_text()  # a default
    assert pinned.target.serving == "continuous" and pinned.target.scheduler == space.target.scheduler
    assert pinned.slo == space.slo and pinned.search.batch == (2,) and pinned.search.buckets == (64, 128)


def test_the_sample_a_search_drew_on_the_command_line_is_pinned(tmp_path):
    """`lensopt run --workload X --requests N --seed S`: the pinned file reproduces that sample, not the space's."""
    _write_trace(tmp_path / "other.csv")
    src = tmp_path / "s.toml"
    src.write_text(tiny_target("pin") + space_table() + '\n[workload]\ndistribution = "sharegpt"\nrequests = 50\n'
                   'length_scale = 0.1\ndrop_longer = true\n')
    space = load_space(src)
    for drawn, want in ((_description(str(tmp_path / "other.csv"), override=True), ("trace", "other.csv")),
                        (_description("azure_code", override=True), ("distribution", "azure_code")),
                        (_description("sharegpt", override=False), ("distribution", "sharegpt"))):
        (tmp_path / "p.toml").write_text(pinned_space(space, CAND, drawn))
        w = load_space(tmp_path / "p.toml").workload
        got = w.trace.name if want[0] == "trace" else w.distribution
        assert got == want[1] and (w.requests, w.seed) == (7, 3)
        assert w.length_scale == 0.1 and w.drop_longer  # the space's other settings still apply
        assert (w.trace is None) != (w.distribution is None)
    # a static space pins static serving and no scheduler table
    text = pinned_space(space, CAND)
    assert 'serving = "static"' in text and "[target.scheduler]" not in text and "[slo]" not in text



def test_a_runner_option_that_is_a_table_is_pinned_as_an_inline_table(tmp_path):
    """The command runner's env = { ... } (any table-valued option) is written so that the file loads back."""
    src = tmp_path / "s.toml"
    src.write_text(tiny_target("pin", runner="command", hardware="toy-npu") + space_table()
                   + '[target.options]\nargv = ["python3", "prog.py"]\n'
                   + 'env = { TOY_NPU_MODE = "drift", "A B" = "1.2" }\n')
    space = load_space(src)
    (tmp_path / "p.toml").write_text(pinned_space(space, CAND))
    assert load_space(tmp_path / "p.toml").target.options == space.target.options
