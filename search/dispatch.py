"""Ray dispatch: one task per unit to profile, one per candidate to confirm.

Ray starts locally by default (and is stopped at the end); ``address`` joins an existing
cluster.  Each task asks for the resources of ``[hosts]`` for its tp, so it lands only on
a node that has them.  Results come back as each task finishes (``ray.wait``), so the
caller can write them to the cache at once.  A task that fails is retried by Ray
(``max_retries`` for a lost worker, ``retry_exceptions`` for an exception) and then
reported with its error, never dropped.

A failure that a retry would only repeat (a user mistake, out of device memory, a
runner's refusal, a bucket that stayed impossible to measure) is caught inside the task
and returned as its result: Ray neither retries it nor logs its traceback, and the
caller gets one line.

Every task first reports that it started (it is a streaming generator: a "started"
item, then its result), so a per-task timeout counts from the moment the task runs, not
from when it was queued behind others; a task past its timeout is cancelled with its
worker (``ray.cancel(force=True)``) and reported as failed with the reason.  While tasks
run, a ``tick`` callback is called every ``tick_s`` seconds (the search renews its
claims on the units there).
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from lens.errors import UnitCannotRun, UserError, one_line
from lens.probes import NoisyMeasurement
from lens.types import Candidate, Requests, Target
from spaces import ProfileSettings

if TYPE_CHECKING:
    from .drift_check import DriftCheck, DriftOutcome

#: resources Ray names as arguments rather than in ``resources``
_BUILTIN = {"CPU": "num_cpus", "GPU": "num_gpus"}


@dataclass(frozen=True)
class TaskStarted:
    """The first item of a profiling task: where it runs."""

    pid: int
    node_id: str
    host: str


def _started() -> TaskStarted:
    import ray

    return TaskStarted(pid=os.getpid(), node_id=ray.get_runtime_context().get_node_id(), host=socket.gethostname())


#: failures that a retry would only repeat (a noisy bucket was already measured `attempts` times)
_PERMANENT = (UserError, UnitCannotRun, NoisyMeasurement)


def _measure_task(target: Target, tp: int, batch: int, buckets, all_buckets, profile: ProfileSettings):
    import dataclasses

    from search.profiler import measure_unit

    started = _started()
    yield started
    try:
        m = measure_unit(target, tp=tp, batch=batch, buckets=buckets, all_buckets=all_buckets, profile=profile)
    except _PERMANENT as exc:
        yield _Permanent.of(exc)
        return
    yield dataclasses.replace(m, node_id=started.node_id)


@dataclass(frozen=True)
class ConfirmRun:
    """What a confirmation task measured: the workload (each request's median over the passes), the host-drift
    check around it, and the passes themselves."""

    workload: Any
    #: the reference probe's runs, the drift and what was done about it (None: no reference to run)
    drift: "DriftOutcome | None" = None
    #: each pass's run (a served workload is summarized pass by pass: lens.serving_metrics.summarize_serving_passes)
    passes: tuple = ()


def _confirm_task(target: Target, candidate: Candidate, requests: Requests, check: "DriftCheck | None",
                  repeats: int):
    import dataclasses

    from lens.types import Unit, WorkloadRun
    from runners import get_runner
    from search.drift_check import checked

    yield _started()
    try:
        runner = get_runner(target)
        runner.check_mode(target.serving, requests)  # before compiling anything
        warm = runner.run_workload(candidate, requests.head(candidate.batch))  # compile and warm every graph
        # the same arrivals as predicted, ``repeats`` passes between rounds of the drift check's probes
        # (search.drift_check); each request's median over the passes is what is judged (a served workload's
        # summary: the median of the passes' own)
        runs, drift = checked(runner, Unit(target, candidate.tp, candidate.batch), check,
                              [lambda: runner.run_workload(candidate, requests, mode=target.serving)] * repeats)
        run = WorkloadRun.median_of(runs)
    except _PERMANENT as exc:
        yield _Permanent.of(exc)
        return
    # the warm-up compiled every graph: its seconds are hardware seconds of the confirmation too
    run = dataclasses.replace(run, compile_s=warm.compile_s + run.compile_s, run_s=warm.run_s + run.run_s)
    yield ConfirmRun(run, drift, tuple(runs))


@dataclass(frozen=True)
class _Permanent:
    """A failure that a retry would only repeat (bad input, out of device memory, a refusal)."""

    error: str
    #: the class name of a ``UnitCannotRun``: the unit fails so on every try (remembered in the cache)
    cannot_run: str | None = None

    @classmethod
    def of(cls, exc: BaseException) -> "_Permanent":
        return cls(one_line(exc), type(exc).__name__ if isinstance(exc, UnitCannotRun) else None)


#: the environment variables of Ray's token authentication (docs.ray.io, "token authentication")
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")


def check_address(address: str, *, timeout_s: float = 3.0) -> None:
    """Fail within seconds, with a clear message, when a cluster address does not answer or
    wants a token this process does not have."""
    if address in ("auto", "local") or address.startswith("ray://"):
        hostport = address[len("ray://"):] if address.startswith("ray://") else None
        if hostport is None:
            return
    else:
        hostport = address
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--ray-address {address!r}: give HOST:PORT of the cluster's head (e.g. 127.0.0.1:6379)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise UserError(f"--ray-address {address}: nothing answers there ({exc.strerror or exc}); start the head with "
                        f"`ray start --head` or drop --ray-address to run locally") from None
    if not address.startswith("ray://"):
        _check_token(address)


def _check_token(address: str) -> None:
    """One call to the cluster's control store: a cluster that refuses this process's token
    (or its lack of one) is a user error, said in one line, before Ray retries for half a
    minute and anything is written."""
    try:
        from ray._raylet import GcsClient  # the client ray.init itself uses first
        from ray.exceptions import AuthenticationError
    except ImportError:  # another Ray: ray.init's own error (mapped in Dispatcher.start) says it
        return
    with _stderr_held() as held:
        try:
            GcsClient(address=address)
        except AuthenticationError:
            held.drop()  # Ray's C++ warning, already said by the message below
            mode = os.environ.get("RAY_AUTH_MODE", "")
            if mode == "token":
                why = (f"refuses the token of RAY_AUTH_TOKEN_PATH={os.environ.get('RAY_AUTH_TOKEN_PATH', '(unset)')}; "
                       f"point RAY_AUTH_TOKEN_PATH at the token file the cluster's nodes were started with")
            else:
                why = ("wants a token (token authentication) and this process has none: export RAY_AUTH_MODE=token "
                       "and RAY_AUTH_TOKEN_PATH=<the token file the cluster's nodes were started with>")
            raise UserError(f"--ray-address {address}: the Ray cluster {why}, then run again") from None
        except Exception:  # noqa: BLE001  (anything else: ray.init meets it too and says it)
            return


class _stderr_held:
    """Hold what this process's file descriptor 2 receives (Ray's C++ logs write there
    directly); on exit it is written out, unless ``drop()`` was called."""

    def __enter__(self) -> "_stderr_held":
        import tempfile

        sys.stderr.flush()
        self._saved = os.dup(2)
        self._tmp = tempfile.TemporaryFile()
        os.dup2(self._tmp.fileno(), 2)
        self._keep = True
        return self

    def drop(self) -> None:
        self._keep = False

    def __exit__(self, *exc_info: object) -> None:
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        if self._keep:
            self._tmp.seek(0)
            held = self._tmp.read()
            if held:
                os.write(2, held)
        self._tmp.close()


@dataclass
class TaskOutcome:
    key: Any
    value: Any = None
    error: str | None = None
    #: with ``error``: the class name of a ``UnitCannotRun`` (the failure would repeat on any try)
    cannot_run: str | None = None


class Dispatcher:
    """Owns the Ray connection for one search."""

    def __init__(self, *, resources_for, address: str | None = None, max_retries: int = 2, num_cpus: int | None = None):
        self.resources_for = resources_for
        self.address = address
        self.max_retries = max_retries
        self.num_cpus = num_cpus
        self._started_here = False
        self.tasks_dispatched = 0
        #: key -> where its task runs now (profiling tasks, while they run)
        self.running: dict[Any, TaskStarted] = {}
        #: key -> where its last task started (kept after it ended: where a failure happened)
        self.last_started: dict[Any, TaskStarted] = {}

    def start(self) -> None:
        import ray

        if ray.is_initialized():
            return
        if self.address:
            check_address(self.address)
            try:
                ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False)
            except (ConnectionError, RuntimeError, ray.exceptions.RayError) as exc:
                raise UserError(f"--ray-address {self.address}: could not join the Ray cluster ({one_line(exc, 300)}); "
                                f"check that its head runs there (`ray status --address {self.address}`), and with "
                                f"token authentication that {' and '.join(AUTH_ENV)} are exported here as on its "
                                f"nodes") from None
        else:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(address="local", num_cpus=self.num_cpus or os.cpu_count(), include_dashboard=False,
                     logging_level=logging.ERROR, log_to_driver=False)
            self._started_here = True

    def stop(self) -> None:
        import ray

        if self._started_here and ray.is_initialized():
            ray.shutdown()
        self._started_here = False

    def _options(self, tp: int) -> dict[str, Any]:
        res = dict(self.resources_for(tp))
        opts: dict[str, Any] = {"max_retries": self.max_retries, "retry_exceptions": True, "num_cpus": 0}
        custom = {}
        for k, v in res.items():
            if k in _BUILTIN:
                opts[_BUILTIN[k]] = v
            else:
                custom[k] = v
        if custom:
            opts["resources"] = custom
        return opts

    def unplaceable(self, tp: int) -> str | None:
        """Why no node of the cluster can run a unit of this tp (None if one can)."""
        import ray

        need = dict(self.resources_for(tp))
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            have = node.get("Resources", {})
            if all(have.get(k, 0) >= v for k, v in need.items()):
                return None
        return f"no node of the Ray cluster offers {need} for tp {tp}"

    @staticmethod
    def _get(key: Any, ref) -> TaskOutcome | Any:
        import ray

        try:
            value = ray.get(ref)
        except Exception as exc:  # reported to the caller with the cause, never dropped
            return TaskOutcome(key, error=one_line(getattr(exc, "cause", None) or exc))
        if isinstance(value, _Permanent):
            return TaskOutcome(key, error=value.error, cannot_run=value.cannot_run)
        if isinstance(value, TaskStarted):
            return value
        return TaskOutcome(key, value=value)

    def _run(self, fn, jobs: Sequence[tuple[Any, int, tuple]], *, timeout_s: float | None = None,
             timeout_key: str = "", tick: Callable[[list], None] | None = None,
             tick_s: float = 30.0) -> Iterator[TaskOutcome]:
        """Run ``fn`` (a task that yields its ``TaskStarted``, then its result) once per job."""
        import ray

        remote = ray.remote(fn)
        pending: dict[Any, Any] = {}
        began: dict[Any, float] = {}  # key -> when its TaskStarted arrived (this clock)
        for key, tp, args in jobs:
            opts = {**self._options(tp), "num_returns": "streaming"}
            ref = remote.options(**opts).remote(*args)
            pending[ref] = key
            self.tasks_dispatched += 1
        last_tick = time.monotonic()
        try:
            while pending:
                now = time.monotonic()
                waits = []
                if tick is not None:
                    waits.append(last_tick + tick_s - now)
                deadlines = [began[k] + timeout_s for k in pending.values() if k in began] if timeout_s else []
                if deadlines:  # (a task that starts makes ray.wait return: its TaskStarted arrives)
                    waits.append(min(deadlines) - now)
                wait_s = max(0.0, min(waits)) if waits else None
                done, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
                for ref in done:
                    key = pending[ref]
                    try:
                        item = next(ref)
                    except StopIteration:
                        pending.pop(ref)
                        self.running.pop(key, None)
                        yield TaskOutcome(key, error="RuntimeError: the task ended without a result")
                        continue
                    got = self._get(key, item)
                    if isinstance(got, TaskStarted):
                        began.setdefault(key, time.monotonic())
                        self.running[key] = self.last_started[key] = got
                        continue
                    pending.pop(ref)
                    self.running.pop(key, None)
                    yield got
                now = time.monotonic()
                if timeout_s:
                    for ref, key in list(pending.items()):
                        if key in began and now - began[key] >= timeout_s:
                            ray.cancel(ref, force=True)  # stops the worker, and what it started
                            pending.pop(ref)
                            self.running.pop(key, None)
                            yield TaskOutcome(key, error=f"TimeoutError: still running after {timeout_s:g} s "
                                                         f"({timeout_key}); the task was cancelled and its worker stopped")
                if tick is not None and now - last_tick >= tick_s:
                    tick(list(pending.values()))
                    last_tick = now
        finally:
            for ref in pending:  # the caller stopped early (budget spent, interrupted): free the workers
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # best effort: Ray may be shutting down
                    pass
            for key in pending.values():
                self.running.pop(key, None)

    def profile_units(self, target: Target, units: Mapping[tuple[int, int], Sequence[int]], *, all_buckets,
                      profile: ProfileSettings, tick: Callable[[list], None] | None = None,
                      tick_s: float = 30.0) -> Iterator[TaskOutcome]:
        """One task per unit measuring its listed buckets (one compilation for all of them).

        ``profile.timeout_s``: most seconds a task may run from its start (a retry after a
        lost worker continues the same clock); ``tick(keys of the tasks still pending)`` is
        called every ``tick_s`` seconds while they run.
        """
        jobs = [((tp, b), tp, (target, tp, b, tuple(sorted(bk)), tuple(all_buckets), profile))
                for (tp, b), bk in units.items()]
        return self._run(_measure_task, jobs, timeout_s=profile.timeout_s, timeout_key="profile.timeout_s", tick=tick,
                         tick_s=tick_s)

    def confirm(self, target: Target, candidates: Sequence[Candidate], requests: Requests,
                checks: "Mapping[Candidate, DriftCheck | None] | None" = None, *,
                repeats: int, timeout_s: float | None = None) -> Iterator[TaskOutcome]:
        """One task per candidate: a warm-up run that compiles its graphs, then ``repeats``
        passes of the workload (``budget.confirm_repeats``; their per-request median is the
        run returned) between rounds of its drift check's probes (``checks``, if any:
        ``search.drift_check``).

        ``timeout_s`` (``budget.confirm_timeout_s``): most seconds a task may run from its start.
        """
        checks = checks or {}
        jobs = [(c, c.tp, (target, c, requests, checks.get(c), repeats)) for c in candidates]
        return self._run(_confirm_task, jobs, timeout_s=timeout_s, timeout_key="budget.confirm_timeout_s")
