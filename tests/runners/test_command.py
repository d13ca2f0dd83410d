"""The ``command`` runner: option validation, protocol parsing and every failure path."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lens.errors import RunnerError, SpaceError, UserError
from lens.probes import plan_probes
from lens.types import Candidate, ModelShape, Probe, Requests, Target, Unit
from runners import get_runner
from runners.command import PROTOCOL, STDERR_TAIL_CHARS, CommandRunner
from search.profiler import measure_unit, profile_missing
from spaces import ProfileSettings
from spaces.loader import load_space
from store import ProfileCache

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "command_runner" / "toy_npu.py"
MODEL = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256)
BUCKETS = (32, 64, 128)
#: lease of the unit claims profile_missing takes (the space file's [profile] lease_s)
LEASE_S = 60.0


def target(argv=None, **options) -> Target:
    opts = {"argv": ["{python}", str(TOY)] if argv is None else argv, "timeout_s": 30.0, **options}
    return Target("cmd-test", "command", "toy-npu", "exclusive", "bfloat16", MODEL, tuple(sorted(opts.items())))


def toy(*args, **options) -> CommandRunner:
    return CommandRunner(target(["{python}", str(TOY), *args], **options))


def probes(repeats=1):
    return plan_probes(BUCKETS, policy="exclusive", max_output=8, repeats=repeats)


def unit(r: CommandRunner, tp=1, batch=2) -> Unit:
    return Unit(r.target, tp, batch)


def cand() -> Candidate:
    return Candidate(1, 2, BUCKETS, BUCKETS)


REQS = Requests(np.asarray([5, 40, 100]), np.asarray([3, 8, 20]))


# -- options ---------------------------------------------------------------------------------
def test_registered_and_constructed_by_name():
    r = get_runner(target())
    assert isinstance(r, CommandRunner) and r.name == "command"


@pytest.mark.parametrize(
    "argv",
    [[], "python3 toy.py", ["python3", 3], [""], None, [["python3"]], ["python3", "a\0b"]],
)
def test_argv_must_be_a_non_empty_list_of_strings(argv):
    opts = (("argv", argv),) if argv is not None else ()
    t = Target("cmd-test", "command", "toy-npu", "exclusive", "bfloat16", MODEL, opts)
    with pytest.raises(UserError, match=r"target\.options\.argv"):
        CommandRunner(t)


@pytest.mark.parametrize(
    "options, field",
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": -1.0}, "timeout_s"),
        ({"timeout_s": "10"}, "timeout_s"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"env": ["A=1"]}, "env"),
        ({"env": {"A": 1}}, "env"),
        ({"env": {"A=B": "1"}}, "env"),
        ({"cwd": ""}, "cwd"),
        ({"cwd": 3}, "cwd"),
        ({"shell": True}, "unknown option"),
    ],
)
def test_other_options_are_validated(options, field):
    with pytest.raises(UserError, match=field):
        CommandRunner(target(**options))


def test_space_file_needs_argv(tmp_path):
    space = (ROOT / "spaces" / "command-example.toml").read_text()
    bad = space.replace("argv = ", "argv_typo = ")
    assert bad != space
    p = tmp_path / "s.toml"
    p.write_text(bad)
    with pytest.raises(SpaceError, match="argv"):
        load_space(p)


def test_the_shipped_example_space_loads():
    sp = load_space(ROOT / "spaces" / "command-example.toml")
    assert sp.target.runner == "command"
    assert sp.target.option("argv")[-1] == "examples/command_runner/toy_npu.py"
    r = get_runner(sp.target)
    for tp in sp.search.tp:
        r.check_unit(Unit(sp.target, tp, 1))


def test_constructing_does_no_io_and_a_missing_program_fails_on_use(tmp_path):
    r = CommandRunner(target([str(tmp_path / "no-such-program")]))  # no error yet
    with pytest.raises(RunnerError, match=r"cannot start .*target\.options\.argv\[0\]"):
        r.fingerprint()
    with pytest.raises(RunnerError, match="cannot start"):
        r.profile(unit(r), probes())


def test_python_placeholder_is_this_interpreter():
    r = toy()
    assert r.argv[0] == sys.executable and r.argv_spec[0] == "{python}"


# -- the protocol ----------------------------------------------------------------------------
def test_describe_is_asked_once_and_feeds_the_fingerprint(tmp_path, monkeypatch):
    r = toy()
    calls = []
    real = r._run_process
    monkeypatch.setattr(r, "_run_process", lambda op, data: calls.append(op) or real(op, data))
    fp = r.fingerprint()
    assert r.versions()["program"] == "toy-npu 1.0" and r.simulated is True
    assert r.fingerprint() == fp
    assert calls == ["describe"]
    fields = r.fingerprint_fields()
    assert fields["versions"]["program"] == "toy-npu 1.0" and fields["argv"] == ["{python}", str(TOY)]
    # another argv (here: an extra label) is another fingerprint
    assert toy("--label", "x").fingerprint() != fp


def test_fingerprint_follows_the_reported_version(tmp_path):
    prog = tmp_path / "v.py"
    prog.write_text(
        "import json, sys\n"
        "req = json.load(sys.stdin)\n"
        "print(json.dumps({'protocol': 1, 'version': sys.argv[1], 'device': 'd', 'simulated': False}))\n"
    )
    a = CommandRunner(target(["{python}", str(prog), "sdk 1.0"]))
    b = CommandRunner(target(["{python}", str(prog), "sdk 1.0"]))
    assert a.fingerprint() == b.fingerprint()
    assert a.simulated is False
    # same argv but another reported version must give another fingerprint
    b._described = dict(b.describe(), version="sdk 2.0")
    assert a.fingerprint() != b.fingerprint()


def test_the_request_is_the_documented_document(tmp_path):
    """The program sees exactly the protocol's fields; records them for the assertion."""
    log = tmp_path / "requests.jsonl"
    prog = tmp_path / "echo.py"
    prog.write_text(
        "import json, runpy, sys, io\n"
        f"raw = sys.stdin.read()\n"
        f"open({str(log)!r}, 'a').write(raw.strip() + '\\n')\n"
        f"sys.stdin = io.StringIO(raw)\n"
        f"sys.argv = [{str(TOY)!r}]\n"
        f"runpy.run_path({str(TOY)!r}, run_name='__main__')\n"
    )
    r = CommandRunner(target(["{python}", str(prog)]))
    ps = [Probe(64, 32, 2, 2), Probe(64, 32, 8, 2)]
    r.profile(unit(r, tp=2, batch=2), ps)
    r.run_workload(cand(), REQS)
    docs = [json.loads(x) for x in log.read_text().splitlines()]
    assert [d["op"] for d in docs] == ["describe", "profile", "run_workload"]
    assert all(d["protocol"] == PROTOCOL for d in docs)
    prof = docs[1]
    assert set(prof) == {"protocol", "op", "target", "unit", "buckets", "policy", "probes"}
    assert prof["unit"] == {"tp": 2, "batch": 2}
    assert prof["buckets"] == [64] and prof["policy"] == "exclusive"
    assert prof["probes"] == [
        {"bucket": 64, "input_len": 32, "output_len": 2, "repeats": 2},
        {"bucket": 64, "input_len": 32, "output_len": 8, "repeats": 2},
    ]
    assert prof["target"] == r.target.to_dict()
    wl = docs[2]
    assert set(wl) == {"protocol", "op", "target", "candidate", "policy", "requests"}
    assert wl["candidate"] == {"tp": 1, "batch": 2, "ctx_buckets": list(BUCKETS), "tkg_buckets": list(BUCKETS)}
    assert wl["requests"] == {"input_len": [5, 40, 100], "output_len": [3, 8, 20]}


def test_toy_semantics_match_the_protocol():
    """E2E of a request is set by its own output length; one-token requests end at their TTFT."""
    r = toy()
    reqs = Requests(np.asarray([10, 10, 10, 10]), np.asarray([1, 5, 5, 9]))
    w = r.run_workload(Candidate(1, 2, BUCKETS, BUCKETS), reqs)
    assert w.e2e_s[0] == w.ttft_s[0]
    assert w.e2e_s[1] > w.ttft_s[1]
    assert w.ttft_s[1] > w.ttft_s[0] and w.ttft_s[3] > w.ttft_s[2]  # prompts one at a time
    assert w.e2e_s[3] > w.e2e_s[2]
    assert np.isclose(w.total_s, w.e2e_s[1] + w.e2e_s[3])  # two batches, each ends with its longest


# -- failures --------------------------------------------------------------------------------
def test_a_slow_program_is_killed_at_the_timeout():
    r = toy("--mode", "slow", "--sleep", "60", timeout_s=0.5)
    with pytest.raises(RunnerError) as exc:
        r.fingerprint()  # the program sleeps 60 s: only the kill at 0.5 s ends this
    msg = str(exc.value)
    assert "timeout" in msg and "0.5 s" in msg and "timeout_s" in msg and "killed" in msg
    assert "toy-npu: describe (mode slow)" in msg  # what it had logged before


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for its reaper counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_timeout_also_kills_what_the_program_started(tmp_path, monkeypatch):
    """The program's child runs on; killing the process group at the timeout must end it too.

    The runner's timeout starts only once the child has said it runs (its pid file): on a
    slow host the test then still checks a live child, never one that had not started.
    """
    import subprocess

    import runners.command

    pidfile = tmp_path / "child.pid"
    prog = tmp_path / "parent.py"
    child = (f"import os, time; open({str(pidfile) + '.tmp'!r}, 'w').write(str(os.getpid())); "
             f"os.rename({str(pidfile) + '.tmp'!r}, {str(pidfile)!r}); time.sleep(600)")
    prog.write_text(f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child!r}])\ntime.sleep(600)\n")
    seen: list[int] = []

    class ChildFirst(subprocess.Popen):
        def communicate(self, input=None, timeout=None):
            if timeout is not None and not seen:  # the runner's call: hold its clock until the child runs
                deadline = time.monotonic() + 120
                while not pidfile.exists():
                    assert self.poll() is None, "the program exited before its child started"
                    if time.monotonic() > deadline:  # a guard against hanging, not a measurement
                        pytest.fail("the child never started")
                    time.sleep(0.05)
                seen.append(int(pidfile.read_text()))
                assert not _gone(seen[0])
            return super().communicate(input, timeout)

    monkeypatch.setattr(runners.command.subprocess, "Popen", ChildFirst)
    r = CommandRunner(target(["{python}", str(prog)], timeout_s=0.5))
    with pytest.raises(RunnerError, match="timeout"):
        r.describe()
    assert seen, "the runner never waited on the program"
    deadline = time.monotonic() + 30  # SIGKILL is immediate; the deadline only bounds a broken kill
    while not _gone(seen[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(seen[0]), f"the program's child {seen[0]} survived the timeout"


def test_a_crash_carries_the_exit_status_and_the_stderr_tail():
    r = toy("--mode", "crash", "--fail-on", "profile")
    r.describe()  # describe works in this mode
    with pytest.raises(RunnerError) as exc:
        r.profile(unit(r), probes())
    msg = str(exc.value)
    assert "exited with status 1" in msg and "profile" in msg
    assert "RuntimeError: toy-npu: device lost during profile" in msg
    assert "log line 29" in msg and "log line 0 " not in msg  # only the tail
    tail = msg.split("stderr (", 1)[1]
    assert len(tail.splitlines()) <= 21


def test_the_stderr_tail_is_bounded(tmp_path):
    prog = tmp_path / "loud.py"
    prog.write_text("import sys\nsys.stderr.write('x' * 100000 + '\\nlast words\\n')\nsys.exit(7)\n")
    with pytest.raises(RunnerError) as exc:
        CommandRunner(target(["{python}", str(prog)])).describe()
    msg = str(exc.value)
    assert "exited with status 7" in msg and msg.endswith("last words")
    assert len(msg) < STDERR_TAIL_CHARS + 500


def test_a_signal_is_named(tmp_path):
    prog = tmp_path / "abort.py"
    prog.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    with pytest.raises(RunnerError, match="killed by SIGKILL"):
        CommandRunner(target(["{python}", str(prog)])).describe()


def test_garbage_on_stdout_is_malformed_json():
    r = toy("--mode", "garbage", "--fail-on", "run_workload")
    with pytest.raises(RunnerError) as exc:
        r.run_workload(cand(), REQS)
    msg = str(exc.value)
    assert "malformed JSON" in msg and "exited with status 0" in msg
    assert "<<< this is not JSON >>>" in msg
    assert "toy-npu: printing something that is not JSON" in msg  # the stderr tail


@pytest.mark.parametrize("mode", ["silent", "nan"])
def test_empty_or_nan_output_is_malformed(mode):
    r = toy("--mode", mode, "--fail-on", "profile")
    with pytest.raises(RunnerError, match="malformed JSON"):
        r.profile(unit(r), probes())


def test_another_protocol_version_is_refused_clearly():
    r = toy("--mode", "protocol")
    with pytest.raises(RunnerError, match=r"speaks protocol 2, this lensopt speaks protocol 1"):
        r.fingerprint()


def test_a_reported_error_carries_its_message():
    r = toy("--mode", "error", "--fail-on", "profile")
    with pytest.raises(RunnerError, match="simulated device fault during profile"):
        r.profile(unit(r), probes())


def test_an_error_the_program_finds_is_passed_on_with_its_exit_status():
    r = toy()
    with pytest.raises(RunnerError) as exc:  # straight to the program, past the runner's own tp check
        r._call("profile", {"target": r.target.to_dict(), "unit": {"tp": 3, "batch": 1}, "buckets": [32],
                            "policy": "exclusive", "probes": [{"bucket": 32, "input_len": 1, "output_len": 2, "repeats": 1}]},
                lambda reply: reply)
    msg = str(exc.value)
    assert "exited with status 1" in msg and "tp 3 must divide heads" in msg


@pytest.mark.parametrize(
    "mode, match",
    [
        ("short", "wrong number of runs: 5 for 6 probes"),
        ("negative", r"runs\[0\]\.times_s\[0\] = .* must be positive"),
        ("mismatch", r"runs\[0\]\.bucket = 128, but probe 0 has bucket = 32"),
    ],
)
def test_ill_shaped_profile_replies_are_refused(mode, match):
    r = toy("--mode", mode, "--fail-on", "profile")
    with pytest.raises(RunnerError, match=match) as exc:
        r.profile(unit(r), probes())
    assert "exited with status 0" in str(exc.value) and "stderr" in str(exc.value)


@pytest.mark.parametrize(
    "mode, match",
    [
        ("short", r"ttft_s has 2 values, expected 3"),
        ("negative", r"ttft_s\[0\] = -1.0 must be positive"),
        ("mismatch", r"e2e_s\[0\] .* is shorter than ttft_s\[0\]"),
        ("nan", "malformed JSON"),
    ],
)
def test_ill_shaped_workload_replies_are_refused(mode, match):
    r = toy("--mode", mode, "--fail-on", "run_workload")
    with pytest.raises(RunnerError, match=match):
        r.run_workload(cand(), REQS)


@pytest.mark.parametrize(
    "reply, match",
    [
        ({"protocol": 1, "version": "", "device": "d", "simulated": True}, "version"),
        ({"protocol": 1, "version": "v", "device": "d", "simulated": "yes"}, "simulated"),
        ({"protocol": 1, "version": "v", "simulated": False}, "device"),
        ({"version": "v", "device": "d", "simulated": False}, "no protocol number"),
        ([1, 2], "not an object"),
        ({"protocol": True, "version": "v", "device": "d", "simulated": False}, "speaks protocol True"),
    ],
)
def test_ill_shaped_describe_replies_are_refused(tmp_path, reply, match):
    prog = tmp_path / "d.py"
    prog.write_text(f"import sys\nsys.stdin.read()\nprint({json.dumps(json.dumps(reply))})\n")
    with pytest.raises(RunnerError, match=match):
        CommandRunner(target(["{python}", str(prog)])).describe()


def test_huge_numbers_are_not_finite(tmp_path):
    prog = tmp_path / "d.py"
    prog.write_text(
        "import json, sys\nreq = json.load(sys.stdin)\n"
        "if req['op'] == 'describe':\n"
        "    print(json.dumps({'protocol': 1, 'version': 'v', 'device': 'd', 'simulated': True}))\n"
        "else:\n"
        "    print('{\"protocol\": 1, \"ttft_s\": [1e999], \"e2e_s\": [1], \"total_s\": 1, \"compile_s\": 0, "
        "\"run_s\": 1, \"host\": \"h\"}')\n"
    )
    r = CommandRunner(target(["{python}", str(prog)]))
    with pytest.raises(RunnerError, match=r"ttft_s\[0\] = inf is not finite"):
        r.run_workload(cand(), Requests(np.asarray([5]), np.asarray([2])))


def test_env_and_cwd_reach_the_program(tmp_path):
    prog = tmp_path / "d.py"
    prog.write_text(
        "import json, os, sys\nsys.stdin.read()\n"
        "print(json.dumps({'protocol': 1, 'version': os.environ['TOY_SDK'], 'device': os.getcwd(), 'simulated': True}))\n"
    )
    (tmp_path / "work").mkdir()
    r = CommandRunner(target(["{python}", "../d.py"], env={"TOY_SDK": "sdk 9"}, cwd=str(tmp_path / "work")))
    d = r.describe()
    assert d["version"] == "sdk 9" and Path(d["device"]) == (tmp_path / "work")


def test_never_a_shell(tmp_path):
    marker = tmp_path / "pwned"
    hostile = [f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", f"&& touch {marker}"]
    # as arguments: passed literally to the program, which echoes them in its device string
    for arg in hostile:
        r = toy("--label", arg)
        assert r.describe()["device"].endswith(arg)
    # as the program itself: no such executable, nothing runs
    for arg in hostile:
        with pytest.raises(RunnerError, match="cannot start"):
            CommandRunner(target([f"echo hi {arg}"])).describe()
    with pytest.raises(RunnerError):  # a shell would run `true` and then touch the file
        CommandRunner(target(["true", ";", "touch", str(marker)])).describe()
    assert not marker.exists()


def test_user_errors_are_raised_before_the_program_runs(tmp_path):
    r = CommandRunner(target([str(tmp_path / "missing")]))  # would fail with RunnerError if started
    with pytest.raises(UserError, match=r"request 1: input length 200"):
        r.run_workload(cand(), Requests(np.asarray([5, 200]), np.asarray([2, 2])))
    with pytest.raises(UserError, match="tp 3"):
        r.profile(Unit(r.target, 3, 1), probes())
    with pytest.raises(UserError, match="leaves bucket"):
        r.profile(unit(r), [Probe(32, 20, 20, 1)])
    with pytest.raises(UserError, match="at least one probe"):
        r.profile(unit(r), [])


# -- nothing half-written ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["crash", "short", "garbage", "error", "slow"])
def test_a_failing_program_writes_nothing_to_the_cache(tmp_path, mode):
    r = toy("--mode", mode, "--fail-on", "profile", "--sleep", "30", timeout_s=2.0 if mode == "slow" else 30.0)
    fp = r.fingerprint()  # describe still works
    path = tmp_path / "cache.sqlite"
    with ProfileCache.open(path) as cache:
        with pytest.raises(RunnerError):
            profile_missing(cache=cache, runner=r, fingerprint=fp, tp=1, batch=2, buckets=list(BUCKETS),
                            all_buckets=list(BUCKETS),
                            profile=ProfileSettings(repeats=2, max_output=8, lease_s=LEASE_S))
        assert len(cache.frame()) == 0 and len(cache.units()) == 0
        assert cache.missing(fp, 1, 2, list(BUCKETS)) == list(BUCKETS)
    # and with the program fixed, the same call stores the whole unit
    with ProfileCache.open(path) as cache:
        out = profile_missing(cache=cache, runner=toy(), fingerprint=fp, tp=1, batch=2, buckets=list(BUCKETS),
                              all_buckets=list(BUCKETS),
                              profile=ProfileSettings(repeats=2, max_output=8, lease_s=LEASE_S))
        assert tuple(out.measured) == BUCKETS and out.simulated
        assert cache.missing(fp, 1, 2, list(BUCKETS)) == []
        assert len(cache.frame()) == len(BUCKETS)


def test_measure_unit_raises_before_returning_anything():
    r = toy("--mode", "short", "--fail-on", "profile")
    with pytest.raises(RunnerError, match="wrong number of runs"):
        measure_unit(r.target, tp=1, batch=2, buckets=BUCKETS, all_buckets=BUCKETS,
                     profile=ProfileSettings(repeats=1, max_output=8), runner=r)


# -- continuous mode (docs/serving.md) -------------------------------------------------------
ARRIVING = Requests(np.asarray([5, 40, 100, 7]), np.asarray([3, 8, 20, 1]), np.asarray([0.0, 0.0, 0.02, 0.5]))

RECORDER = """
import json, sys
req = json.load(sys.stdin)
if req["op"] == "describe":
    reply = {"version": "rec 1", "device": "recorder", "simulated": True, "modes": json.loads(sys.argv[2])}
else:
    with open(sys.argv[1], "a") as fh:
        fh.write(json.dumps(req) + "\\n")
    n = len(req["requests"]["input_len"])
    reply = {"ttft_s": [0.1] * n, "e2e_s": [0.2] * n, "total_s": 1.0, "compile_s": 0, "run_s": 1.0, "host": "h"}
print(json.dumps({"protocol": 1, **reply}))
"""


def recorder(tmp_path, modes) -> tuple[CommandRunner, Path]:
    prog, log = tmp_path / "recorder.py", tmp_path / "requests.jsonl"
    prog.write_text(RECORDER)
    return CommandRunner(target(["{python}", str(prog), str(log), json.dumps(modes)])), log


def test_the_toy_declares_and_serves_continuous_mode():
    r = toy()
    assert r.modes == ("static", "continuous")
    run = r.run_workload(cand(), ARRIVING, mode="continuous")
    assert run.mode == "continuous" and run.simulated
    assert (run.ttft_s <= run.e2e_s).all() and run.e2e_s[3] == run.ttft_s[3]
    static = r.run_workload(cand(), ARRIVING)
    assert static.mode == "static" and not np.allclose(static.ttft_s, run.ttft_s)


def test_continuous_mode_is_refused_for_a_program_that_does_not_declare_it(tmp_path):
    r = toy("--modes", "static")
    assert r.modes == ("static",)
    with pytest.raises(UserError, match=r"does not run continuous mode; it runs static") as exc:
        r.run_workload(cand(), ARRIVING, mode="continuous")
    assert "\n" not in str(exc.value)
    rec, log = recorder(tmp_path, ["static"])
    with pytest.raises(UserError, match="continuous"):
        rec.run_workload(cand(), ARRIVING, mode="continuous")
    assert not log.exists()  # refused before the workload was sent


@pytest.mark.parametrize("modes", [["continuous"], ["static", "fast"], "static", [1]])
def test_a_bad_modes_declaration_is_a_bad_reply(tmp_path, modes):
    rec, _ = recorder(tmp_path, modes)
    with pytest.raises(RunnerError, match="modes"):
        rec.run_workload(cand(), REQS)


def test_continuous_keys_are_sent_only_in_continuous_mode(tmp_path):
    rec, log = recorder(tmp_path, ["static", "continuous"])
    rec.run_workload(cand(), ARRIVING)
    rec.run_workload(cand(), ARRIVING, mode="continuous")
    static, cont = [json.loads(line) for line in log.read_text().splitlines()]
    assert "mode" not in static and "arrival_s" not in static["requests"] and "scheduler" not in static
    assert cont["mode"] == "continuous"
    assert cont["requests"]["arrival_s"] == [0.0, 0.0, 0.02, 0.5]
    assert cont["scheduler"] == {"max_prefills": 0, "prefill_priority": "prefill"}
