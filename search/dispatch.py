"""Ray dispatch: one task per unit to profile, one per candidate to confirm.

Ray starts locally by default (and is stopped at the end); ``address`` joins an existing
cluster.  Each task asks for the resources of ``[hosts]`` for its tp, so it lands only on
a node that has them.  Results come back as each task finishes (``ray.wait``), so the
caller can write them to the cache at once.  A task that fails is retried by Ray
(``max_retries`` for a lost worker, ``retry_exceptions`` for an exception) and then
reported with its error, never dropped.

A profiling task first reports that it started (it is a streaming generator: a
"started" item, then its result), so a per-task timeout counts from the moment the
task runs, not from when it was queued behind others; a task past its timeout is
cancelled with its worker (``ray.cancel(force=True)``) and reported as failed with the
reason.  While tasks run, a ``tick`` callback is called every ``tick_s`` seconds (the
search renews its claims on the units there).
"""
from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from lens.errors import DeviceOutOfMemory, UserError
from lens.probes import NoisyMeasurement
from lens.types import Candidate, Requests, Target
from spaces import ProfileSettings

#: resources Ray names as arguments rather than in ``resources``
_BUILTIN = {"CPU": "num_cpus", "GPU": "num_gpus"}


@dataclass(frozen=True)
class TaskStarted:
    """The first item of a profiling task: where it runs."""

    pid: int
    node_id: str
    host: str


def _measure_task(target: Target, tp: int, batch: int, buckets, all_buckets, profile: ProfileSettings):
    import dataclasses

    import ray

    from search.profiler import measure_unit

    node_id = ray.get_runtime_context().get_node_id()
    yield TaskStarted(pid=os.getpid(), node_id=node_id, host=socket.gethostname())
    try:
        m = measure_unit(target, tp=tp, batch=batch, buckets=buckets, all_buckets=all_buckets, profile=profile)
    except (UserError, DeviceOutOfMemory, NoisyMeasurement) as exc:
        # would fail the same way again (a noisy bucket was already measured `attempts` times)
        yield _Permanent(f"{type(exc).__name__}: {exc}")
        return
    yield dataclasses.replace(m, node_id=node_id)


def _confirm_task(target: Target, candidate: Candidate, requests: Requests):
    from runners import get_runner

    try:
        runner = get_runner(target)
        runner.run_workload(candidate, requests.head(candidate.batch))  # compile and warm every graph
        return runner.run_workload(candidate, requests)
    except (UserError, DeviceOutOfMemory) as exc:
        return _Permanent(f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class _Permanent:
    """A failure that a retry would only repeat (bad input, out of device memory)."""

    error: str


def check_address(address: str, *, timeout_s: float = 3.0) -> None:
    """Fail within seconds, with a clear message, when a cluster address does not answer."""
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


@dataclass
class TaskOutcome:
    key: Any
    value: Any = None
    error: str | None = None


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

    def start(self) -> None:
        import ray

        if ray.is_initialized():
            return
        if self.address:
            check_address(self.address)
            ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False)
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
            cause = getattr(exc, "cause", None) or exc
            msg = " ".join(str(cause).split())  # the whole message: summary and any stderr tail
            return TaskOutcome(key, error=f"{type(cause).__name__}: {msg[:2000]}")
        if isinstance(value, _Permanent):
            return TaskOutcome(key, error=value.error)
        if isinstance(value, TaskStarted):
            return value
        return TaskOutcome(key, value=value)

    def _run(self, fn, jobs: Sequence[tuple[Any, int, tuple]], *, streaming: bool = False,
             timeout_s: float | None = None, tick: Callable[[list], None] | None = None,
             tick_s: float = 30.0) -> Iterator[TaskOutcome]:
        import ray

        remote = ray.remote(fn)
        pending: dict[Any, Any] = {}
        began: dict[Any, float] = {}  # key -> when its TaskStarted arrived (this clock)
        for key, tp, args in jobs:
            opts = self._options(tp)
            if streaming:
                opts["num_returns"] = "streaming"
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
                    if streaming:
                        try:
                            item = next(ref)
                        except StopIteration:
                            pending.pop(ref)
                            self.running.pop(key, None)
                            yield TaskOutcome(key, error="RuntimeError: the task ended without a result")
                            continue
                        got = self._get(key, item)
                    else:
                        got = self._get(key, ref)
                    if isinstance(got, TaskStarted):
                        began.setdefault(key, time.monotonic())
                        self.running[key] = got
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
                                                         f"(profile.timeout_s); the task was cancelled and its worker stopped")
                if tick is not None and now - last_tick >= tick_s:
                    tick(list(pending.values()))
                    last_tick = now
        finally:
            for ref in pending:  # the caller stopped early (budget spent, interrupted): free the workers
                try:
                    ray.cancel(ref, force=streaming)
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
        return self._run(_measure_task, jobs, streaming=True, timeout_s=profile.timeout_s, tick=tick, tick_s=tick_s)

    def confirm(self, target: Target, candidates: Sequence[Candidate], requests: Requests) -> Iterator[TaskOutcome]:
        jobs = [(c, c.tp, (target, c, requests)) for c in candidates]
        return self._run(_confirm_task, jobs)
