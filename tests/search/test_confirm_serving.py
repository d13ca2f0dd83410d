"""A served confirmation is read pass by pass: each figure the median of the passes' own, as the accuracy
benchmark reads them, not the percentiles of each request's median over the passes."""
import numpy as np
import pytest

from lens.serving_metrics import summarize_serving
from lens.types import Candidate, WorkloadRun
from search.confirm import confirm_front
from search.dispatch import ConfirmRun, TaskOutcome, _confirm_task
from search.evaluate import Evaluator
from search.ledger import RunLedger
from search.measure import measure_unit
from spaces import load_requests, load_space
from test_search_serving import SERVING


class InProcess:
    """A dispatcher that runs each confirmation task here, in the test's process (a local Ray only tells the task
    where it runs), on the simulated runner."""

    def __init__(self):
        self.runs: dict[Candidate, ConfirmRun] = {}

    def confirm(self, target, candidates, requests, checks=None, *, repeats, timeout_s=None):
        for c in candidates:
            run = [x for x in _confirm_task(target, c, requests, (checks or {}).get(c), repeats)
                   if isinstance(x, ConfirmRun)][0]
            self.runs[c] = run
            yield TaskOutcome(c, run)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("confirm") / "serving.toml"
    path.write_text(SERVING.replace("[budget]\n", "[budget]\nconfirm_repeats = 3\n", 1))
    space = load_space(path)
    requests, _ = load_requests(space)
    bk = tuple(space.search.buckets)
    m = measure_unit(space.target, tp=1, batch=4, buckets=bk, all_buckets=bk, profile=space.profile)
    ev = Evaluator(space, requests)
    ev.set_measured((1, 4), m.profiles)
    front = [ev.evaluate(Candidate(1, 4, bk, bk), with_prediction=True)]
    return space, requests, front


def test_a_served_confirmation_task_keeps_its_passes_and_their_per_request_median(served, ray_local):
    space, requests, front = served
    out = [x for x in _confirm_task(space.target, front[0].candidate, requests, None, 3) if isinstance(x, ConfirmRun)]
    run = out[0]
    assert len(run.passes) == 3 and {p.mode for p in run.passes} == {"continuous"}
    assert np.allclose(run.workload.ttft_s, np.median(np.stack([p.ttft_s for p in run.passes]), axis=0))


def test_a_served_confirmation_is_judged_on_the_median_of_its_passes_own_figures(served, ray_local):
    space, requests, front = served
    disp = InProcess()
    got = confirm_front(front, 1, space=space, requests=requests, dispatcher=disp, ledger=RunLedger(),
                        log=lambda m: None, progress=False)
    assert len(got) == 1 and got[0].error is None
    passes = disp.runs[front[0].candidate].passes
    each = [summarize_serving(requests, ttft_s=p.ttft_s, e2e_s=p.e2e_s, total_s=p.total_s) for p in passes]
    for key in ("ttft_p90_s", "ttft_p50_s", "tpot_p50_s", "e2e_p90_s"):
        assert got[0].measured[key] == pytest.approx(float(np.median([m[key] for m in each]))), key
    # not the percentiles of each request's median, which strip the jitter the simulated host puts in each pass
    med = WorkloadRun.median_of(passes)
    stripped = summarize_serving(requests, ttft_s=med.ttft_s, e2e_s=med.e2e_s, total_s=med.total_s)
    assert any(got[0].measured[k] != pytest.approx(stripped[k]) for k in ("ttft_p90_s", "e2e_p90_s", "tpot_p50_s"))
