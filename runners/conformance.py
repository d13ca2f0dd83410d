"""The runner conformance suite: the same tests for every backend, shipped for runner authors.

Use it by subclassing in a ``test_*.py`` file of your own (pytest must be installed;
``import runners`` itself never loads this module or pytest)::

    from runners.conformance import RunnerConformance

    class TestMyConformance(RunnerConformance):
        def make_target(self, *, model=None, policy="exclusive") -> Target:
            return Target(...)  # a target of the runner under test

pytest collects the subclass (its name starts with ``Test``); this base class is not
collected. Class attributes size the work (``buckets``, ``model``, ``tp``, ``batch``,
``max_output``, ``repeats``) so a backend that compiles for real can keep the suite fast;
``policies`` names the bucket policies the backend is checked under, ``prefills`` the
prefill modes (``Target.prefill``) it executes; it must refuse the others, naming the
setting, when constructed or on first use. Continuous batching
(docs/serving.md) is checked for a runner whose ``modes`` list it, and refused otherwise. A hardware-only
backend marks its subclass (``pytest.mark.neuron`` ...) and skips it when the hardware is
absent. ``make_unusable_target`` (optional) gives a target the runner must construct
without complaint but fail on first use (e.g. a program that does not exist).
docs/command-protocol.md shows a vendor's file for a ``command`` program.
"""
from __future__ import annotations

import builtins
import math
import re
import socket
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from lens.errors import LensoptError, RunnerError, UserError
from lens.probes import plan_probes, solve
from lens.types import PREFILLS, Candidate, ModelShape, ProfileResult, Requests, Target, Unit, WorkloadRun
from runners import Runner, get_runner, runner_class

SMALL_MODEL = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256)


class RunnerConformance:
    """Base class of the conformance tests; see the module docstring."""

    #: candidate bucket set of the tiny plan (the largest is the longest request)
    buckets: tuple[int, ...] = (32, 64, 128)
    model: ModelShape = SMALL_MODEL
    tp: int = 1
    batch: int = 2
    max_output: int = 16
    repeats: int = 2
    #: bucket policies the backend must honour
    policies: tuple[str, ...] = ("exclusive", "inclusive")
    #: prefill modes the backend executes (``make_target`` gives one of them)
    prefills: tuple[str, ...] = PREFILLS

    # -- what a subclass provides ----------------------------------------------------------
    def make_target(self, *, model: ModelShape | None = None, policy: str = "exclusive") -> Target:
        """A target of the runner under test with ``model`` (default ``self.model``) and ``policy``."""
        raise NotImplementedError("a conformance subclass implements make_target")

    def make_unusable_target(self) -> Target | None:
        """A target whose runner constructs fine but fails when used (None: not applicable)."""
        return None

    def other_model(self) -> ModelShape:
        """A model that differs from ``self.model`` in a way that changes measurements."""
        return replace(self.model, layers=self.model.layers + 1)

    def bad_tp(self) -> int:
        """A tp that divides neither heads nor kv_heads of ``self.model``."""
        m = self.model
        return next(t for t in range(2, 4 * m.heads + 2) if m.heads % t and m.kv_heads % t)

    # -- shared, computed once per class (class-scoped fixtures are classmethods) ----------
    @pytest.fixture(scope="class")
    @classmethod
    def runner(cls) -> Runner:
        r = get_runner(cls().make_target())
        yield r
        r.close()

    @pytest.fixture(scope="class")
    @classmethod
    def plan(cls):
        return plan_probes(cls.buckets, policy="exclusive", max_output=cls.max_output, repeats=cls.repeats)

    @pytest.fixture(scope="class")
    @classmethod
    def profiled(cls, runner, plan) -> ProfileResult:
        return runner.profile(Unit(runner.target, cls.tp, cls.batch), plan)

    @pytest.fixture(scope="class")
    @classmethod
    def workload(cls) -> Requests:
        """Requests of every bucket, short and long outputs, a short last batch."""
        top = cls.buckets[-1]
        lin = [1, top // 2, 3, top - 20, cls.buckets[0], 7, top // 4]
        lout = [4, 10, 1, 18, 2, 12, 5]
        if cls.batch > 1 and len(lin) % cls.batch == 0:
            lin, lout = lin[:-1], lout[:-1]
        return Requests(np.asarray(lin), np.asarray(lout))

    @pytest.fixture(scope="class")
    @classmethod
    def candidate(cls) -> Candidate:
        return Candidate(cls.tp, cls.batch, tuple(cls.buckets), tuple(cls.buckets))

    @pytest.fixture(scope="class")
    @classmethod
    def ran(cls, runner, candidate, workload) -> WorkloadRun:
        return runner.run_workload(candidate, workload)

    # -- identity ------------------------------------------------------------------------------
    def test_constructor_does_no_io(self, monkeypatch):
        target = self.make_target()
        cls = runner_class(target.runner)  # importing the backend may read files; constructing may not

        def refuse(*args, **kwargs):
            raise AssertionError("a runner constructor did I/O")

        monkeypatch.setattr(subprocess, "Popen", refuse)
        monkeypatch.setattr(socket, "socket", refuse)
        monkeypatch.setattr(builtins, "open", refuse)
        runner = cls(target)
        assert runner.target == target
        monkeypatch.undo()
        runner.close()

    def test_unusable_target_fails_on_use_not_construction(self):
        target = self.make_unusable_target()
        if target is None:
            pytest.skip("this runner has no target that constructs but cannot run")
        runner = get_runner(target)  # must not fail yet
        probes = plan_probes(self.buckets, policy=target.bucket_policy, max_output=self.max_output, repeats=1)
        with pytest.raises(LensoptError):
            runner.profile(Unit(target, self.tp, self.batch), probes)

    def test_fingerprint_is_stable_and_follows_the_model(self, runner):
        fp = runner.fingerprint()
        assert isinstance(fp, str) and re.fullmatch(r"[0-9a-f]{8,}", fp)
        assert get_runner(self.make_target()).fingerprint() == fp
        assert get_runner(self.make_target(model=self.other_model())).fingerprint() != fp
        other = "inclusive" if runner.target.bucket_policy == "exclusive" else "exclusive"
        if other in self.policies:
            assert get_runner(self.make_target(policy=other)).fingerprint() != fp
        else:  # a backend with one policy refuses the other, naming the setting, instead of fingerprinting it
            with pytest.raises(UserError, match=f"bucket_policy = '{other}'"):
                get_runner(self.make_target(policy=other))

    def test_check_unit_rejects_a_tp_that_does_not_divide_the_heads(self, runner):
        with pytest.raises(UserError):
            runner.check_unit(Unit(runner.target, self.bad_tp(), self.batch))
        runner.check_unit(Unit(runner.target, self.tp, self.batch))

    # -- profile -------------------------------------------------------------------------------
    def test_profile_returns_one_run_per_probe_in_order(self, profiled, plan):
        assert isinstance(profiled, ProfileResult)
        assert len(profiled.runs) == len(plan)
        for probe, run in zip(plan, profiled.runs):
            assert run.probe == probe
            assert len(run.times_s) == probe.repeats
            assert all(math.isfinite(t) and t > 0 for t in run.times_s), run
        assert math.isfinite(profiled.compile_s) and profiled.compile_s >= 0
        assert math.isfinite(profiled.run_s) and profiled.run_s > 0
        assert isinstance(profiled.host, str) and profiled.host
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in profiled.versions.items())

    def test_solve_gives_positive_ttft_and_tbt_for_every_bucket(self, runner, profiled):
        profiles = solve(profiled.runs, batch=self.batch, prefill=runner.target.prefill, simulated=profiled.simulated)
        assert sorted(profiles) == sorted(self.buckets)
        for b, p in profiles.items():
            assert p.ttft_s > 0 and p.tbt_s > 0, (b, p)
            assert math.isfinite(p.ttft_s) and math.isfinite(p.tbt_s)

    def test_profile_honours_each_bucket_policy(self, runner, profiled, plan):
        for policy in self.policies:
            if policy == runner.target.bucket_policy == "exclusive":
                # the class's own profile ran this policy's plan: checked on it, not compiled again
                assert [r.probe for r in profiled.runs] == plan
                assert solve(profiled.runs, batch=self.batch, prefill=runner.target.prefill).keys() == set(self.buckets)
                continue
            target = self.make_target(policy=policy)
            runner = get_runner(target)
            try:
                # three repeats, as a real profile takes: one repeat of a millisecond run can land on
                # a host hiccup five times its length (seen on a 2-core CI host: T1 4.95 ms, T2 3.85 ms)
                probes = plan_probes(self.buckets, policy=policy, max_output=self.max_output, repeats=3)
                res = runner.profile(Unit(target, self.tp, self.batch), probes)
                assert [r.probe for r in res.runs] == probes
                assert solve(res.runs, batch=self.batch, prefill=target.prefill).keys() == set(self.buckets)
            finally:
                runner.close()

    # -- workload ------------------------------------------------------------------------------
    def test_run_workload_shapes_and_order(self, ran, workload, candidate):
        n = len(workload)
        assert isinstance(ran, WorkloadRun)
        ttft, e2e = np.asarray(ran.ttft_s, dtype=float), np.asarray(ran.e2e_s, dtype=float)
        assert ttft.shape == (n,) and e2e.shape == (n,)
        assert np.isfinite(ttft).all() and np.isfinite(e2e).all()
        assert (ttft > 0).all() and (e2e > 0).all()
        assert (ttft <= e2e).all()
        for s in range(0, n, candidate.batch):  # one by one or in one call, first tokens never go back in time
            assert (np.diff(ttft[s : s + candidate.batch]) >= 0).all(), ttft
        assert math.isfinite(ran.total_s) and ran.total_s >= e2e.max() * (1 - 1e-6)
        assert math.isfinite(ran.compile_s) and ran.compile_s >= 0
        assert math.isfinite(ran.run_s) and ran.run_s >= 0

    def test_each_prefill_mode_runs_as_the_estimator_composes_it_or_is_refused(self, runner, ran, profiled, candidate,
                                                                               workload, plan):
        """``sequential``: a batch's first tokens come one after another; ``batched``: all at the end
        of one call. A mode the backend does not run is refused, naming the setting."""
        assert self.make_target().prefill in self.prefills
        B, n = candidate.batch, len(workload)
        for mode in PREFILLS:
            target = replace(self.make_target(), prefill=mode)
            if mode == runner.target.prefill:
                # the class's runner runs this mode: its run and profile are checked, not made again
                self._check_prefill(mode, np.asarray(ran.ttft_s, dtype=float), profiled, B, n)
                continue
            if mode not in self.prefills:
                with pytest.raises(LensoptError, match="prefill"):
                    other = get_runner(target)  # refused here (a space file naming it fails to load) ...
                    try:
                        other.run_workload(candidate, workload)  # ... or on first use
                    finally:
                        other.close()
                continue
            other = get_runner(target)
            try:
                ttft = np.asarray(other.run_workload(candidate, workload).ttft_s, dtype=float)
                res = other.profile(Unit(target, self.tp, self.batch), plan)
            finally:
                other.close()
            self._check_prefill(mode, ttft, res, B, n)

    def _check_prefill(self, mode: str, ttft: np.ndarray, res: ProfileResult, B: int, n: int) -> None:
        for s in range(0, n, B):
            t = ttft[s : s + B]
            if mode == "batched":
                assert np.ptp(t) <= 1e-9 * t.max(), (mode, ttft)
            else:
                assert (np.diff(t) >= 0).all(), (mode, ttft)
        profiles = solve(res.runs, batch=self.batch, prefill=mode)
        assert all(p.ttft_s > 0 and p.tbt_s > 0 for p in profiles.values()), profiles

    def test_a_request_longer_than_the_largest_bucket_is_named(self, runner, candidate):
        top = self.buckets[-1]
        reqs = Requests(np.asarray([4, top + 5, 3]), np.asarray([2, 2, 2]))
        with pytest.raises(UserError, match=r"request 1\b"):
            runner.run_workload(candidate, reqs)
        reqs = Requests(np.asarray([4, 5, top - 2]), np.asarray([2, 2, 10]))  # prompt fits, decode leaves
        with pytest.raises(UserError, match=r"request 2\b"):
            runner.run_workload(candidate, reqs)

    def test_simulated_flag_is_consistent(self, runner, profiled, ran):
        assert isinstance(runner.simulated, bool)
        assert profiled.simulated == runner.simulated
        assert ran.simulated == runner.simulated
        profiles = solve(profiled.runs, batch=self.batch, prefill=runner.target.prefill, simulated=profiled.simulated)
        sources = {p.source for p in profiles.values()}
        assert sources == {"simulated" if runner.simulated else "measured"}

    # -- continuous batching ---------------------------------------------------------------------
    @pytest.fixture(scope="class")
    @classmethod
    def arrivals(cls) -> Requests:
        """batch + 2 requests at once (two must wait for a slot), a one-token one, then a late one."""
        top = cls.buckets[-1]
        n = cls.batch + 2
        lin = [3 + (7 * i) % (top // 2) for i in range(n)] + [5, top // 3]
        lout = [6 + (5 * i) % 9 for i in range(n)] + [1, 4]
        arr = [0.0] * n + [0.0, 0.05]
        return Requests(np.asarray(lin), np.asarray(lout), np.asarray(arr))

    @pytest.fixture(scope="class")
    @classmethod
    def served(cls, runner, candidate, arrivals) -> WorkloadRun:
        if "continuous" not in runner.modes:
            pytest.skip(f"runner {runner.name!r} does not declare continuous mode (modes {runner.modes})")
        return runner.run_workload(candidate, arrivals, mode="continuous")

    def test_modes_declare_static_and_refuse_the_rest(self, runner, candidate, arrivals):
        assert isinstance(runner.modes, tuple) and "static" in runner.modes
        if "continuous" not in runner.modes:
            with pytest.raises(UserError, match="continuous"):
                runner.run_workload(candidate, arrivals, mode="continuous")
        with pytest.raises(UserError, match="mode"):
            runner.run_workload(candidate, arrivals, mode="no-such-mode")

    def test_continuous_run_shapes_and_clock(self, served, arrivals, runner):
        n = len(arrivals)
        ttft, e2e = np.asarray(served.ttft_s, dtype=float), np.asarray(served.e2e_s, dtype=float)
        assert served.mode == "continuous" and served.simulated == runner.simulated
        assert ttft.shape == (n,) and e2e.shape == (n,)
        assert np.isfinite(ttft).all() and (ttft > 0).all() and (ttft <= e2e).all()
        one = int(np.flatnonzero(arrivals.output_len == 1)[0])
        assert e2e[one] == pytest.approx(ttft[one])  # done at its first token
        done = arrivals.arrival_s + e2e
        assert served.total_s >= (done.max() - arrivals.arrival_s.min()) * (1 - 1e-6)

    def test_continuous_admits_fifo_into_batch_slots(self, served, arrivals, candidate):
        """Semantics, whatever the timings: first tokens in arrival order, and the request after the
        first ``batch`` (all arriving at once) gets its first token only after a slot has freed."""
        ttft, e2e = np.asarray(served.ttft_s, dtype=float), np.asarray(served.e2e_s, dtype=float)
        order = np.argsort(arrivals.arrival_s, kind="stable")
        first = (arrivals.arrival_s + ttft)[order]
        assert (np.diff(first) >= -1e-9).all(), first
        B = candidate.batch
        assert ttft[B] >= e2e[:B].min() * (1 - 1e-9)

    def test_failures_are_lensopt_errors(self, runner):
        """A probe that leaves its bucket is refused before anything runs."""
        from lens.types import Probe

        bad = [Probe(bucket=self.buckets[0], input_len=self.buckets[-1], output_len=2, repeats=1)]
        with pytest.raises((UserError, RunnerError)):
            runner.profile(Unit(runner.target, self.tp, self.batch), bad)
