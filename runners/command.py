"""``command``: any vendor's stack, through an external program that speaks JSON.

The program is named by ``[target.options] argv`` (a list: the program and its arguments,
started without a shell). Each call of the runner starts it once, writes one JSON request
to its stdin and reads one JSON reply from its stdout; stderr is free for the program's
logs. The protocol (version 1) is documented in ``docs/command-protocol.md``; an example
program that simulates a bucketed device is ``examples/command_runner/toy_npu.py``.

Options:

- ``argv`` (required): list of strings. An element that is exactly ``"{python}"`` becomes
  the interpreter running lensopt (``sys.executable``). A relative program path resolves
  against ``cwd`` when given, else against lensopt's current directory (on a Ray cluster:
  each worker's, so prefer absolute paths there).
- ``timeout_s`` (default 600): seconds one call may take; past it the program (and its
  process group) is killed.
- ``env``: extra environment variables (strings) on top of lensopt's environment.
- ``cwd``: the program's working directory.

Every failure of the program (cannot start, non-zero exit, timeout, malformed or
ill-shaped reply, a reply of another protocol version, an error it reports) raises
``RunnerError`` with the exit status and the tail of its stderr, before anything is
returned, so a failed unit never reaches the profile cache. An error the program marks
``"kind": "out_of_memory"`` or ``"refused"`` raises ``DeviceOutOfMemory`` or
``UnitRefused``: it would come back the same, so it is neither retried nor measured again.

The fingerprint holds the version string the program reports (``describe``, asked once per
runner on first use, never in the constructor) and ``argv`` as written in the space file.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np

from lens.buckets import check_policy, select_index, validate_buckets
from lens.errors import DeviceOutOfMemory, RunnerError, UnitRefused, UserError
from lens.types import Candidate, Probe, ProbeRun, ProfileResult, Requests, Target, Unit, WorkloadRun

from .base import MODES, Runner

#: the protocol version this runner speaks; a reply must carry the same number
PROTOCOL = 1
#: an ``argv`` element equal to this is replaced by the interpreter running lensopt
PYTHON_PLACEHOLDER = "{python}"
DEFAULT_TIMEOUT_S = 600.0
#: how much of the program's stderr an error message carries
STDERR_TAIL_LINES = 20
STDERR_TAIL_CHARS = 2000
#: seconds to collect what a killed program left in its pipes
_DRAIN_S = 5.0
#: an error document's "kind" -> the failure it is: these would come back the same on every try
ERROR_KINDS: dict[str, type[RunnerError]] = {"out_of_memory": DeviceOutOfMemory, "refused": UnitRefused}

__all__ = ["PROTOCOL", "PYTHON_PLACEHOLDER", "CommandRunner"]


class _BadReply(Exception):
    """A reply that breaks the protocol; turned into a ``RunnerError`` with the call's context."""


@dataclass(frozen=True)
class _Call:
    """What one finished run of the program left behind."""

    op: str
    returncode: int
    stdout: bytes
    stderr: bytes


class CommandRunner(Runner):
    """Runs an external program per call (see the module docstring and docs/command-protocol.md)."""

    name = "command"
    options_schema: dict[str, tuple[type, Any]] = {
        "argv": (list, ...),  # required: the loader reports a missing target.options.argv
        "timeout_s": (float, DEFAULT_TIMEOUT_S),
        "env": (dict, {}),
        "cwd": (str, None),
    }

    def __init__(self, target: Target):
        super().__init__(target)
        check_policy(target.bucket_policy)
        where = f"target {target.name!r}"
        opts = dict(target.options)
        unknown = sorted(set(opts) - set(self.options_schema))
        if unknown:
            raise UserError(
                f"command runner: unknown option(s) {', '.join(map(repr, unknown))} in [target.options] of {where}; "
                f"accepted: {', '.join(sorted(self.options_schema))}"
            )
        argv = opts.get("argv")
        if argv is None:
            raise UserError(
                f"command runner: {where} needs target.options.argv, the program and its arguments as a list, "
                f'e.g. argv = ["{PYTHON_PLACEHOLDER}", "examples/command_runner/toy_npu.py"]'
            )
        if isinstance(argv, (str, bytes)) or not isinstance(argv, (list, tuple)) or not argv:
            raise UserError(
                f"command runner: target.options.argv of {where} = {argv!r} must be a non-empty list of strings "
                f"(the program, then its arguments; no shell parses it)"
            )
        for i, a in enumerate(argv):
            if not isinstance(a, str):
                raise UserError(f"command runner: target.options.argv[{i}] of {where} = {a!r} is not a string")
            if "\0" in a:
                raise UserError(f"command runner: target.options.argv[{i}] of {where} contains a NUL character")
        if not argv[0]:
            raise UserError(f"command runner: target.options.argv[0] of {where} is empty; name the program to run")
        timeout = opts.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (math.isfinite(timeout) and timeout > 0):
            raise UserError(f"command runner: target.options.timeout_s of {where} = {timeout!r} must be a positive number of seconds")
        env = opts.get("env", {})
        if not isinstance(env, dict):
            raise UserError(f"command runner: target.options.env of {where} = {env!r} must be a table of strings")
        for k, v in env.items():
            if not isinstance(k, str) or not k or "=" in k or "\0" in k:
                raise UserError(f"command runner: target.options.env of {where}: {k!r} is not a valid variable name")
            if not isinstance(v, str) or "\0" in v:
                raise UserError(f"command runner: target.options.env.{k} of {where} = {v!r} must be a string")
        cwd = opts.get("cwd")
        if cwd is not None and (not isinstance(cwd, str) or not cwd):
            raise UserError(f"command runner: target.options.cwd of {where} = {cwd!r} must be a non-empty directory path")
        self.argv_spec: tuple[str, ...] = tuple(argv)
        self.timeout_s = float(timeout)
        self.env: dict[str, str] = dict(env)
        self.cwd: str | None = cwd
        self._described: dict[str, Any] | None = None

    # -- identity ------------------------------------------------------------------------
    @property
    def argv(self) -> list[str]:
        """The argv actually executed (``{python}`` replaced by this interpreter)."""
        return [sys.executable if a == PYTHON_PLACEHOLDER else a for a in self.argv_spec]

    def describe(self) -> dict[str, Any]:
        """The program's ``describe`` reply (version, device, simulated); asked once, then kept."""
        if self._described is None:
            self._described = self._call("describe", {"target": self.target.to_dict()}, _parse_describe)
        return dict(self._described)

    @property
    def simulated(self) -> bool:  # type: ignore[override]
        return bool(self.describe()["simulated"])

    @property
    def modes(self) -> tuple[str, ...]:  # type: ignore[override]
        """The serving modes the program declares in ``describe`` (static only when it names none)."""
        return tuple(self.describe()["modes"])

    def versions(self) -> dict[str, str]:
        d = self.describe()
        return {"program": d["version"], "device": d["device"], "protocol": str(PROTOCOL)}

    def fingerprint_fields(self) -> dict[str, Any]:
        fields = super().fingerprint_fields()
        d = self.describe()
        # the device string is provenance (it may name a host); the version string is the
        # program's statement of everything that changes a measurement
        fields["versions"] = {"program": d["version"], "protocol": PROTOCOL}
        fields["simulated"] = bool(d["simulated"])
        fields["argv"] = list(self.argv_spec)  # as written: "{python}" stays portable
        return fields

    # -- checks --------------------------------------------------------------------------
    def check_unit(self, unit: Unit) -> None:
        m, tp, batch = self.target.model, unit.tp, unit.batch
        if isinstance(tp, bool) or not isinstance(tp, (int, np.integer)) or tp < 1:
            raise UserError(f"command runner: tp {tp!r} must be a positive integer")
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise UserError(f"command runner: batch {batch!r} must be a positive integer")
        if m.heads % tp or m.kv_heads % tp:
            raise UserError(
                f"command runner: tp {tp} must divide the model's heads ({m.heads}) and kv_heads ({m.kv_heads})"
            )

    # -- profile -------------------------------------------------------------------------
    def profile(self, unit: Unit, probes: Sequence[Probe]) -> ProfileResult:
        self.check_unit(unit)
        probes = list(probes)
        if not probes:
            raise UserError("command runner: profile needs at least one probe")
        for p in probes:
            for f in ("bucket", "input_len", "output_len", "repeats"):
                v = getattr(p, f)
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                    raise UserError(f"command runner: probe {p}: {f} must be an integer >= 1")
        buckets = validate_buckets(sorted({int(p.bucket) for p in probes}), what="probe buckets")
        policy = self.target.bucket_policy
        b = np.asarray(buckets)
        for p in probes:
            lengths = np.arange(p.input_len, p.input_len + p.output_len)  # the prompt, then each decode context
            idx = select_index(lengths, b, policy)
            if (idx < 0).any() or (b[np.maximum(idx, 0)] != p.bucket).any():
                raise UserError(
                    f"command runner: probe {p} leaves bucket {p.bucket} of the compiled buckets {list(buckets)} "
                    f"under the {policy} policy"
                )
        described = self.describe()  # a program that cannot say what it is fails before the long run
        request = {
            "target": self.target.to_dict(),
            "unit": {"tp": int(unit.tp), "batch": int(unit.batch)},
            "buckets": list(buckets),
            "policy": policy,
            "probes": [
                {"bucket": int(p.bucket), "input_len": int(p.input_len), "output_len": int(p.output_len), "repeats": int(p.repeats)}
                for p in probes
            ],
        }
        runs, compile_s, run_s, host = self._call("profile", request, lambda r: _parse_profile(r, probes))
        return ProfileResult(
            runs=runs,
            compile_s=compile_s,
            run_s=run_s,
            host=host,
            versions=self.versions(),
            simulated=bool(described["simulated"]),
        )

    # -- workload ------------------------------------------------------------------------
    def run_workload(self, candidate: Candidate, requests: Requests, *, mode: str = "static") -> WorkloadRun:
        self.check_mode(mode, requests)
        self.check_unit(Unit(self.target, candidate.tp, candidate.batch))
        ctx = validate_buckets(candidate.ctx_buckets, what="ctx_buckets")
        tkg = validate_buckets(candidate.tkg_buckets, what="tkg_buckets")
        policy = self.target.bucket_policy
        lin, lout = requests.input_len, requests.output_len
        n = len(requests)
        if n == 0:
            raise UserError("command runner: run_workload needs at least one request")
        bad = np.flatnonzero((lin < 1) | (lout < 1))
        if bad.size:
            i = int(bad[0])
            raise UserError(f"command runner: request {i} has input {lin[i]} / output {lout[i]}; both must be >= 1")
        bad = np.flatnonzero(select_index(lin, ctx, policy) < 0)
        if bad.size:
            i = int(bad[0])
            raise UserError(
                f"command runner: request {i}: input length {lin[i]} fits no ctx bucket of {list(ctx)} ({policy} policy); "
                f"add a larger bucket or shorten the request"
            )
        last = lin + lout - 1
        bad = np.flatnonzero((lout > 1) & (select_index(last, tkg, policy) < 0))
        if bad.size:
            i = int(bad[0])
            raise UserError(
                f"command runner: request {i}: context {last[i]} of its last decode step fits no tkg bucket of "
                f"{list(tkg)} ({policy} policy); add a larger bucket or shorten the request"
            )
        described = self.describe()
        request = {
            "target": self.target.to_dict(),
            "candidate": {"tp": int(candidate.tp), "batch": int(candidate.batch), "ctx_buckets": list(ctx), "tkg_buckets": list(tkg)},
            "policy": policy,
            "requests": {"input_len": lin.tolist(), "output_len": lout.tolist()},
        }
        if mode == "continuous":  # sent only then: a program that declares no modes never sees the keys
            request["mode"] = mode
            request["requests"]["arrival_s"] = [float(a) for a in requests.arrival_s]
            request["scheduler"] = asdict(self.target.scheduler)
        ttft, e2e, total_s, compile_s, run_s, host = self._call("run_workload", request, lambda r: _parse_workload(r, n))
        return WorkloadRun(
            ttft_s=ttft,
            e2e_s=e2e,
            total_s=total_s,
            compile_s=compile_s,
            run_s=run_s,
            host=host,
            simulated=bool(described["simulated"]),
            mode=mode,
        )

    # -- the process ---------------------------------------------------------------------
    def _command(self) -> str:
        return shlex.join(self.argv)

    def _call(self, op: str, payload: dict[str, Any], parse: Callable[[dict[str, Any]], Any]) -> Any:
        """Run the program once for ``op``; return ``parse(reply)`` or raise ``RunnerError``."""
        data = json.dumps({"protocol": PROTOCOL, "op": op, **payload}, allow_nan=False).encode("utf-8")
        call = self._run_process(op, data)
        reply: dict[str, Any] | None = None
        problem: str | None = None
        kind: type[RunnerError] = RunnerError
        try:
            reply = _decode(call.stdout)
        except _BadReply as exc:
            problem = str(exc)
        if reply is not None:
            proto = reply.get("protocol")
            if isinstance(proto, bool) or proto != PROTOCOL:
                problem = (
                    f"the reply has no protocol number; every reply carries \"protocol\": {PROTOCOL}"
                    if proto is None
                    else f"the reply speaks protocol {proto!r}, this lensopt speaks protocol {PROTOCOL}: "
                    f"update the program or lensopt so they agree (docs/command-protocol.md)"
                )
            elif "error" in reply:
                msg = reply["error"]
                problem = f"the program reported an error: {msg if isinstance(msg, str) else json.dumps(msg)}"
                kind = ERROR_KINDS.get(reply.get("kind"), RunnerError) if isinstance(reply.get("kind"), str) else kind
        if call.returncode != 0:
            raise self._error(call, problem if reply is not None and "error" in reply else None, kind)
        if problem is not None:
            raise self._error(call, problem, kind)
        assert reply is not None
        try:
            return parse(reply)
        except _BadReply as exc:
            raise self._error(call, f"bad reply: {exc}") from None

    def _run_process(self, op: str, data: bytes) -> _Call:
        argv = self.argv
        env = {**os.environ, **self.env} if self.env else None
        posix = os.name == "posix"
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.cwd,
                env=env,
                shell=False,
                # its own process group, so a timeout kills whatever it started as well
                start_new_session=posix,
            )
        except OSError as exc:
            where = self.cwd or os.getcwd()
            raise RunnerError(
                f"command runner ({self.target.name}): cannot start `{self._command()}` for {op}: "
                f"{exc.strerror or exc} (target.options.argv[0] = {argv[0]!r}; relative paths resolve against {where}"
                f"{'' if self.cwd else ', the current directory'})"
            ) from None
        try:
            out, err = proc.communicate(data, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self._kill(proc, posix)
            out, err = self._drain(proc)
            raise RunnerError(
                f"command runner ({self.target.name}): `{self._command()}` did not finish {op} within the timeout of "
                f"{self.timeout_s:g} s (target.options.timeout_s) and was killed"
                + _stderr_tail(err)
            ) from None
        except BaseException:
            self._kill(proc, posix)
            self._drain(proc)
            raise
        return _Call(op, int(proc.returncode), out or b"", err or b"")

    @staticmethod
    def _kill(proc: subprocess.Popen, posix: bool) -> None:
        if posix:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
                return
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.kill()
        except ProcessLookupError:
            pass

    @staticmethod
    def _drain(proc: subprocess.Popen) -> tuple[bytes, bytes]:
        try:
            out, err = proc.communicate(timeout=_DRAIN_S)
            return out or b"", err or b""
        except subprocess.TimeoutExpired:  # a descendant outside the group still holds the pipes
            for f in (proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
            proc.wait()
            return b"", b""

    def _error(self, call: _Call, problem: str | None, kind: type[RunnerError] = RunnerError) -> RunnerError:
        rc = call.returncode
        if rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = f"signal {-rc}"
            status = f"was killed by {sig} (exit status {rc})"
        else:
            status = f"exited with status {rc}"
        head = f"command runner ({self.target.name}): `{self._command()}` {call.op}: {status}"
        if problem:
            head += f"; {problem}"
        elif rc != 0:
            head += "; the measurement failed"
        return kind(head + _stderr_tail(call.stderr))


# -- reply parsing (pure) -------------------------------------------------------------------
def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def _decode(stdout: bytes) -> dict[str, Any]:
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _BadReply(f"malformed JSON on stdout: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise _BadReply("malformed JSON on stdout: the program printed nothing; it must print one JSON document")
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        start = text.strip()[:120]
        raise _BadReply(f"malformed JSON on stdout ({exc}); stdout began with {start!r}") from None
    if not isinstance(doc, dict):
        raise _BadReply(f"malformed reply: stdout holds a JSON {type(doc).__name__}, not an object")
    return doc


def _number(d: dict[str, Any], key: str, where: str = "", *, positive: bool = False) -> float:
    name = f"{where}{key}"
    if key not in d:
        raise _BadReply(f"{name} is missing")
    return _check_number(d[key], name, positive=positive)


def _check_number(v: Any, name: str, *, positive: bool) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _BadReply(f"{name} = {v!r} is not a number")
    f = float(v)
    if not math.isfinite(f):
        raise _BadReply(f"{name} = {v!r} is not finite")
    if f < 0 or (positive and f == 0):
        raise _BadReply(f"{name} = {v!r} must be {'positive' if positive else 'non-negative'}")
    return f


def _numbers(d: dict[str, Any], key: str, n: int, where: str = "") -> np.ndarray:
    name = f"{where}{key}"
    if key not in d:
        raise _BadReply(f"{name} is missing")
    v = d[key]
    if not isinstance(v, list):
        raise _BadReply(f"{name} must be a list of numbers, got {type(v).__name__}")
    if len(v) != n:
        raise _BadReply(f"{name} has {len(v)} values, expected {n}")
    return np.array([_check_number(x, f"{name}[{i}]", positive=True) for i, x in enumerate(v)], dtype=float)


def _string(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v:
        raise _BadReply(f"{key} = {v!r} must be a non-empty string")
    return v


def _parse_describe(reply: dict[str, Any]) -> dict[str, Any]:
    sim = reply.get("simulated")
    if not isinstance(sim, bool):
        raise _BadReply(f"simulated = {sim!r} must be true or false")
    modes = reply.get("modes", ["static"])
    if not isinstance(modes, list) or "static" not in modes \
            or any(not isinstance(m, str) or m not in MODES for m in modes):
        raise _BadReply(f"modes = {modes!r} must be a list of serving modes ({', '.join(MODES)}) that holds \"static\"")
    return {"version": _string(reply, "version"), "device": _string(reply, "device"), "simulated": sim,
            "modes": tuple(dict.fromkeys(modes))}


def _parse_profile(reply: dict[str, Any], probes: Sequence[Probe]) -> tuple[tuple[ProbeRun, ...], float, float, str]:
    runs = reply.get("runs")
    if not isinstance(runs, list):
        raise _BadReply(f"runs must be a list with one entry per probe, got {type(runs).__name__}")
    if len(runs) != len(probes):
        raise _BadReply(f"wrong number of runs: {len(runs)} for {len(probes)} probes (one per probe, in request order)")
    out = []
    for i, (p, r) in enumerate(zip(probes, runs)):
        if not isinstance(r, dict):
            raise _BadReply(f"runs[{i}] must be an object")
        for f in ("bucket", "input_len", "output_len"):
            v = r.get(f)
            if isinstance(v, bool) or v != getattr(p, f):
                raise _BadReply(
                    f"runs[{i}].{f} = {v!r}, but probe {i} has {f} = {getattr(p, f)} "
                    f"(runs must answer the probes one for one, in request order)"
                )
        times = _numbers(r, "times_s", int(p.repeats), where=f"runs[{i}].")
        out.append(ProbeRun(p, tuple(float(t) for t in times)))
    return tuple(out), _number(reply, "compile_s"), _number(reply, "run_s"), _string(reply, "host")


def _parse_workload(reply: dict[str, Any], n: int):
    ttft = _numbers(reply, "ttft_s", n)
    e2e = _numbers(reply, "e2e_s", n)
    bad = np.flatnonzero(e2e < ttft)
    if bad.size:
        i = int(bad[0])
        raise _BadReply(f"e2e_s[{i}] = {e2e[i]!r} is shorter than ttft_s[{i}] = {ttft[i]!r}")
    return ttft, e2e, _number(reply, "total_s"), _number(reply, "compile_s"), _number(reply, "run_s"), _string(reply, "host")


def _stderr_tail(err: bytes) -> str:
    text = (err or b"").decode("utf-8", errors="replace").rstrip()
    if not text:
        return "\nstderr: (empty)"
    lines = text.splitlines()
    tail = lines[-STDERR_TAIL_LINES:]
    body = "\n".join(tail)
    if len(body) > STDERR_TAIL_CHARS:
        body = "..." + body[-STDERR_TAIL_CHARS:]
    cut = len(lines) > len(tail) or body.startswith("...")
    return f"\nstderr ({'last lines' if cut else 'all of it'}):\n{body}"
