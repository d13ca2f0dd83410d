"""Continuous serving in a space file: [target] serving, [target.scheduler], workload arrivals,
and the serving objectives, each declared once in the schema and checked with the file named."""
from __future__ import annotations

import re

import numpy as np
import pytest

from lens.errors import SpaceError, UserError
from lens.types import Scheduler
from spaces import load_space
from spaces.workload import load_requests
from spacekit import space_table, tiny_target

# {target}: lines under [target]; {scheduler}: a [target.scheduler] table
BASE = tiny_target("t", extra="{target}\n") + "{scheduler}\n" + space_table() + "[workload]\n{workload}\n{rest}\n"


def space(tmp_path, *, target="", scheduler="", workload='distribution = "sharegpt"\nlength_scale = 0.1',
          rest=""):
    p = tmp_path / "s.toml"
    p.write_text(BASE.format(target=target, scheduler=scheduler, workload=workload, rest=rest))
    return p


def test_static_is_the_default_and_the_scheduler_defaults_are_vllm_on_neuron(tmp_path):
    sp = load_space(space(tmp_path))
    assert sp.target.serving == "static" and sp.target.scheduler == Scheduler()
    assert (sp.target.scheduler.max_prefills, sp.target.scheduler.prefill_priority) == (0, "prefill")


def test_a_continuous_space_with_its_scheduler(tmp_path):
    p = space(tmp_path, target='serving = "continuous"',
              scheduler='[target.scheduler]\nmax_prefills = 1\nprefill_priority = "decode"',
              workload='distribution = "sharegpt"\nlength_scale = 0.1\ndrop_longer = true\narrival_rate = 2.5\n'
                       'requests = 50',
              rest='[objectives]\nthroughput = "goodput_req_s_per_chip"\n[slo]\nttft_p90_s = 0.3')
    sp = load_space(p)
    assert sp.target.scheduler == Scheduler(max_prefills=1, prefill_priority="decode")
    req, desc = load_requests(sp)
    assert desc.arrivals == "poisson" and desc.arrival_rate == 2.5
    assert req.arrival_s[0] == 0.0 and (np.diff(req.arrival_s) >= 0).all()
    again, _ = load_requests(sp)
    np.testing.assert_array_equal(req.arrival_s, again.arrival_s)  # seeded


@pytest.mark.parametrize(("kw", "message"), [
    (dict(scheduler="[target.scheduler]\nmax_prefills = -1"), "target.scheduler.max_prefills = -1"),
    (dict(scheduler='[target.scheduler]\nprefill_priority = "fifo"'), "target.scheduler.prefill_priority = 'fifo'"),
    (dict(scheduler="[target.scheduler]\nprefills = 2"), "[target.scheduler] has unknown key(s) 'prefills'"),
    (dict(target='serving = "streaming"'), "target.serving = 'streaming' is not one of static, continuous"),
    (dict(workload='distribution = "sharegpt"\narrival_rate = 3.0'), "arrival_rate = 3 is read by continuous"),
    (dict(workload='distribution = "sharegpt"\narrival_rate = 0.0', target='serving = "continuous"'),
     "workload.arrival_rate = 0.0 must be a positive number"),
    # vllm bench's "all at once": the error says what to give instead
    (dict(workload='distribution = "sharegpt"\narrival_rate = inf', target='serving = "continuous"'),
     "workload.arrival_rate = inf is not a finite number: for every request at once (vllm bench's inf) give a rate "
     "far above what the unit serves, e.g. 1e6"),
    (dict(target='serving = "continuous"'), "needs arrivals: set workload.arrival_rate"),
    (dict(rest='[objectives]\nthroughput = "goodput_req_s_per_chip"'), "is a continuous-serving metric"),
    (dict(rest="[objectives]\nmax_queue_growth = -0.1"), "objectives.max_queue_growth = -0.1"),
])
def test_bad_serving_settings_name_the_file_and_the_key(tmp_path, kw, message):
    with pytest.raises(SpaceError, match=re.escape(message)) as exc:
        load_space(space(tmp_path, **kw))
    assert str(tmp_path / "s.toml") in str(exc.value)


def _trace(tmp_path, with_time=True):
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens" if with_time else "input_len,output_len"]
    for i in range(40):
        t = f"2023-11-16 18:00:{i // 2:02d}.{(i % 2) * 5}00000"
        rows.append(f"{t},{10 + i},{5 + i % 7}" if with_time else f"{10 + i},{5 + i % 7}")
    p = tmp_path / "trace.csv"
    p.write_text("\n".join(rows) + "\n")
    return p


def test_a_trace_brings_its_arrivals_as_a_window_of_consecutive_rows(tmp_path):
    _trace(tmp_path)
    sp = load_space(space(tmp_path, target='serving = "continuous"', workload='trace = "trace.csv"\nrequests = 10'))
    req, desc = load_requests(sp)
    assert desc.arrivals == "trace" and desc.arrival_rate == pytest.approx(2.0)
    np.testing.assert_allclose(np.diff(req.arrival_s), 0.5)  # consecutive rows, their gaps kept
    assert (np.diff(req.input_len) == 1).all()
    sp = load_space(space(tmp_path, target='serving = "continuous"',
                          workload='trace = "trace.csv"\nrequests = 10\narrival_rate = 8.0'))
    req, desc = load_requests(sp)
    assert desc.arrivals == "trace, rescaled"
    np.testing.assert_allclose(np.diff(req.arrival_s), 0.125)


def test_a_trace_without_arrival_times_needs_a_rate(tmp_path):
    _trace(tmp_path, with_time=False)
    sp = load_space(space(tmp_path, target='serving = "continuous"', workload='trace = "trace.csv"'))
    with pytest.raises(UserError, match=r"s\.toml: \[workload\] .*trace\.csv: continuous serving needs arrival times"):
        load_requests(sp)
    _trace(tmp_path)
    sp = load_space(space(tmp_path, target='serving = "continuous"',
                          workload='trace = "trace.csv"\narrival_rate = 2.0\nburstiness = 0.5'))
    with pytest.raises(UserError, match="leave burstiness at 1"):
        load_requests(sp)
