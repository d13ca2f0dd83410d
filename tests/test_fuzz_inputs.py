"""Property-based fuzzing of everything a user types: space files, trace files, CLI arguments.

The properties: the command line never ends in a traceback; a mistake exits 2 with one
``lensopt: error:`` message that names the file and the field (or the flag). The CLI runs
in-process (``search.cli.main``) with its output captured; a search that gets past every
check stops where it would start Ray (nothing here starts Ray or runs long).
"""
from __future__ import annotations

import copy
import io
import json
import math
import os
import re
import shutil
import tempfile
import tomllib
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import search.dispatch
from search.cli import main
from spacekit import TINY_MODEL

BASE_SPACE = """
[target]
name = "fuzz-sim"
runner = "sim"
hardware = "inf2"
bucket_policy = "exclusive"
dtype = "bfloat16"
seed = 0

""" + TINY_MODEL + """
[target.options]
noise = 0.01

[space]
tp = [1, 2]
batch = [1, 4]
buckets = [64, 128, 256]
max_buckets = 3
tie_buckets = true

[workload]
distribution = "sharegpt"
requests = 20
seed = 0
length_scale = 0.1
drop_longer = true

[objectives]
throughput = "throughput_tok_s_per_chip"
latency = "e2e_p90_s"

[slo]
e2e_p90_s = 30.0

[hosts]
resources = { CPU = 1 }
chips_per_host = 8
memory_gib_per_chip = 16

[budget]
trials = 10
top_k = 1
tolerance = 0.1

[profile]
repeats = 2
max_output = 32
timeout_s = 60
attempts = 2
max_spread = 0.5
lease_s = 30
"""
BASE = tomllib.loads(BASE_SPACE)
# CI runs a fixed, modest set of examples; LENSOPT_FUZZ_EXAMPLES=5000 LENSOPT_FUZZ_RANDOM=1 searches harder
FUZZ = settings(max_examples=int(os.environ.get("LENSOPT_FUZZ_EXAMPLES", "400")), deadline=None,
                derandomize=os.environ.get("LENSOPT_FUZZ_RANDOM") != "1", database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


class _Reached(Exception):
    """A search got past every input check and would now start Ray."""


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(autouse=True, scope="module")
def _no_ray():
    mp = pytest.MonkeyPatch()

    def refuse(self):
        raise _Reached()

    mp.setattr(search.dispatch.Dispatcher, "start", refuse)
    home = tempfile.mkdtemp(prefix="lensopt-fuzz-cache-")  # never the user's own cache
    mp.setenv("LENSOPT_CACHE", home + "/never-used.sqlite")
    yield
    mp.undo()
    shutil.rmtree(home, ignore_errors=True)


def invoke(argv: list[str]) -> tuple[int | None, str, str]:
    """Exit code (None: reached Ray), stdout, stderr; any other exception fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own errors
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except _Reached:
            code = None
    return code, out.getvalue(), err.getvalue()


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("lensopt: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# -- a small TOML writer (the standard library only reads TOML) ----------------------------------
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _str(v: str) -> str:
    # a TOML basic string: JSON's escapes are TOML's, but astral characters stay literal and DEL is escaped
    return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")


def _key(k: str) -> str:
    return k if _BARE.match(k) else _str(k)


def _val(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_val(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def dumps(doc: dict, prefix: str = "") -> str:
    lines = [f"{_key(k)} = {_val(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            name = f"{prefix}.{_key(k)}" if prefix else _key(k)
            lines.append(f"\n[{name}]")
            lines.append(dumps(v, name))
    return "\n".join(lines)


def test_toml_writer_round_trips():
    assert tomllib.loads(dumps(BASE)) == BASE


# -- space files ----------------------------------------------------------------------------------
def _paths(doc: dict, prefix=()):
    for k, v in doc.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _paths(v, prefix + (k,))


def _tables(doc: dict, prefix=()):
    yield prefix
    for k, v in doc.items():
        if isinstance(v, dict):
            yield from _tables(v, prefix + (k,))


def _get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


SCALARS = st.one_of(
    st.integers(min_value=-10**20, max_value=10**20),
    st.sampled_from([0, -1, 1, 2**63 - 1, 2**64, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.booleans(),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(min_size=1, max_size=6), inner, max_size=3)),
                      max_leaves=6)
KEYS = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=10)


@st.composite
def mutated_space(draw):
    doc = copy.deepcopy(BASE)
    touched: list[tuple] = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["unknown_key", "wrong_type", "negative", "delete_key", "delete_table", "huge"]))
        if kind == "unknown_key":
            table = draw(st.sampled_from(list(_tables(doc))))
            key = draw(KEYS)
            _get(doc, table)[key] = draw(VALUES)
            touched.append(table + (key,))
        elif kind == "delete_table":
            tables = [t for t in _tables(doc) if t]
            if tables:
                t = draw(st.sampled_from(tables))
                del _get(doc, t[:-1])[t[-1]]
                touched.append(t)
        else:
            paths = [p for p in _paths(doc) if not isinstance(_get(doc, p), dict)]
            if not paths:
                continue
            p = draw(st.sampled_from(paths))
            parent, leaf = _get(doc, p[:-1]), p[-1]
            if kind == "delete_key":
                del parent[leaf]
            elif kind == "wrong_type":
                parent[leaf] = draw(VALUES)
            elif kind == "negative":
                v = parent[leaf]
                parent[leaf] = ([-abs(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x for x in v]
                                if isinstance(v, list) else draw(st.sampled_from([0, -1, -0.5, -(10**9)])))
            else:
                parent[leaf] = draw(st.sampled_from([10**9, 10**12, 2**63 - 1, 1e300, [10**9], [1, 10**12]]))
            touched.append(p)
    return doc, touched


def _names(path: tuple) -> set[str]:
    """Words an error about ``path`` may use to name it."""
    out = {".".join(path[:i + 1]) for i in range(len(path))}
    out |= {str(p) for p in path}
    out |= {f"[{'.'.join(path[:i])}]" for i in range(1, len(path))}
    return out


def _check_space_error(line: str, path: Path, touched: list[tuple]) -> None:
    assert str(path) in line or "--" in line, line
    if str(path) in line and touched and "malformed TOML" not in line:
        named = set().union(*(_names(t) for t in touched))
        # the message names the field it is about (a changed one, or one a change made inconsistent)
        assert any(n in line for n in named) or re.search(r"\b[a-z_]+(\.[a-z_]+)+\b|\[[a-z_.]+\]", line), line


@FUZZ
@given(mutated_space())
def test_fuzzed_space_files(work, mutation):
    doc, touched = mutation
    try:
        text = dumps(doc)
    except TypeError:
        return
    path = work / "space.toml"
    path.write_text(text, encoding="utf-8")
    code, out, err = invoke(["run", str(path), "--cache", str(work / "c.sqlite"), "--results", str(work / "res"),
                             "--no-progress", "--no-confirm"])
    if code is None:
        return  # a valid space: the search would start now
    assert code == 2, (code, err)
    _check_space_error(_one_error_line(err), path, touched)


@FUZZ
@given(st.data())
def test_fuzzed_space_bytes(work, data):
    raw = BASE_SPACE.encode()
    kind = data.draw(st.sampled_from(["insert", "truncate", "replace", "binary"]))
    if kind == "binary":
        raw = data.draw(st.binary(min_size=0, max_size=200))
    else:
        at = data.draw(st.integers(0, len(raw)))
        junk = data.draw(st.binary(min_size=1, max_size=20))
        raw = raw[:at] + junk + raw[at:] if kind == "insert" else (raw[:at] if kind == "truncate" else
                                                                   raw[:at] + junk + raw[at + len(junk):])
    path = work / "bytes.toml"
    path.write_bytes(raw)
    code, out, err = invoke(["predict", str(path), "--tp", "1", "--batch", "1", "--buckets", "64,128,256",
                             "--input-len", "10", "--output-len", "5", "--cache", str(work / "p.sqlite")])
    assert code in (2, 3), (code, err)  # 3: the bytes still made a valid space (no profiles cached)
    line = _one_error_line(err)
    assert str(path) in line or "--" in line, line


# -- trace files ----------------------------------------------------------------------------------
CELLS = st.one_of(
    st.integers(min_value=-5, max_value=10**25).map(str),
    st.sampled_from(["", "nan", "inf", "-inf", "1e400", "3.5", "0", "-1", "x", "1,2", '"', "\x00", "١٢", "2024-01-01T00:00:00"]),
    st.text(max_size=8),
    st.floats(allow_nan=True).map(repr),
)
HEADERS = st.one_of(
    st.just(["input_len", "output_len"]),
    st.just(["input_len", "output_len", "arrival_s"]),
    st.just(["ContextTokens", "GeneratedTokens", "TIMESTAMP"]),
    st.lists(st.text(max_size=6), max_size=4),
)


@st.composite
def trace_file(draw):
    kind = draw(st.sampled_from(["csv", "jsonl", "binary"]))
    if kind == "binary":
        return draw(st.sampled_from([".csv", ".jsonl"])), draw(st.binary(max_size=300))
    header = draw(HEADERS)
    rows = draw(st.lists(st.lists(CELLS, min_size=0, max_size=len(header) + 1), max_size=6))
    if kind == "csv":
        text = ",".join(header) + "\n" + "\n".join(",".join(r) for r in rows) + "\n"
        if draw(st.booleans()):
            text += "x" * draw(st.sampled_from([10, 140_000]))  # one huge field
        return ".csv", text.encode("utf-8", "surrogatepass")
    lines = []
    for r in rows:
        if draw(st.booleans()):
            lines.append(json.dumps(dict(zip(header, [_jsonish(c) for c in r]))))
        else:
            lines.append(draw(st.sampled_from(["[1, 2]", "{", "null", "\"text\"", "{\"input_len\": [1]}", ""])))
    return ".jsonl", "\n".join(lines).encode("utf-8", "surrogatepass")


def _jsonish(cell: str):
    try:
        return json.loads(cell)
    except ValueError:
        return cell


@FUZZ
@given(trace_file())
def test_fuzzed_trace_files(work, trace):
    suffix, raw = trace
    path = work / f"trace{suffix}"
    path.write_bytes(raw)
    for argv in (["predict", str(work / "base.toml"), "--tp", "1", "--batch", "1", "--buckets", "64,128,256",
                  "--workload", str(path), "--cache", str(work / "t.sqlite")],
                 ["run", str(work / "base.toml"), "--workload", str(path), "--cache", str(work / "t.sqlite"),
                  "--results", str(work / "res"), "--no-progress"]):
        (work / "base.toml").write_text(BASE_SPACE)
        code, out, err = invoke(argv)
        if code is None or code == 3:
            continue  # a valid trace (3: no profiles cached for predict)
        assert code == 2, (code, err)
        line = _one_error_line(err)
        assert str(path) in line or "--" in line or str(work / "base.toml") in line, line


# -- command-line arguments ------------------------------------------------------------------------
INTS = st.one_of(st.sampled_from(["1", "2", "4"]), st.integers(-3, 300).map(str),
                 st.sampled_from(["0", "-1", "1000000000", "10000000000000000000", "1e3", ""]), st.text(max_size=5))
LISTS = st.one_of(st.sampled_from(["64,128,256", "64,128", "256", "10", "30,100,200"]),
                  st.lists(st.integers(-2, 600), min_size=0, max_size=5).map(lambda v: ",".join(map(str, v))),
                  st.sampled_from(["128", ",", "a,b", "1e3", "99999999999999999999999", "", "5,,6"]))
ANY = st.one_of(INTS, LISTS, st.text(max_size=10))
WORKLOADS = st.sampled_from(["sharegpt", "azure_code", "nope", "x.csv"])

FLAGS = {
    "run": {"--results": None, "--name": ANY, "--ray-address": ANY, "--workload": WORKLOADS,
            "--requests": INTS, "--seed": INTS, "--trials": INTS, "--sampler": st.sampled_from(["nsga2", "tpe", "bad"]),
            "--top": INTS, "--no-confirm": "", "--fresh": "", "--profile-all": "", "--json": ""},
    "profile": {"--tp": INTS, "--batch": INTS, "--buckets": LISTS, "--repeats": INTS, "--json": ""},
    "predict": {"--tp": INTS, "--batch": INTS, "--buckets": LISTS, "--ctx-buckets": LISTS, "--tkg-buckets": LISTS,
                "--input-len": LISTS, "--output-len": LISTS, "--workload": WORKLOADS,
                "--requests": INTS, "--seed": INTS, "--mode": st.sampled_from(["static", "ragged", "x"]), "--json": ""},
    "measure": {"--tp": INTS, "--batch": INTS, "--buckets": LISTS, "--input-len": LISTS, "--output-len": LISTS,
                "--workload": WORKLOADS, "--requests": INTS, "--repeats": INTS, "--json": ""},
    "amali": {"--tp": INTS, "--batch": INTS, "--input-len": INTS, "--output-len": INTS,
              "--gpu": st.sampled_from(["H100-SXM", "A100", "nope", ""]), "--attention": st.sampled_from(["eager", "fused", "x"]),
              "--json": ""},
    "confirm": {"--top": INTS, "--json": ""},
    "cache ls": {"--json": ""},
    "cache export": {},
    "cache import": {"--replace": ""},
    "cache rm": {"--fingerprint": ANY, "--tp": INTS, "--batch": INTS, "--bucket": INTS, "--all": ""},
    "cache recover": {"--to": ANY},
}
#: what each subcommand needs: given most of the time, so the fuzz gets past argparse
REQUIRED = {
    "profile": ("--tp", "--batch"),
    "predict": ("--tp", "--batch", "--buckets", "--input-len", "--output-len"),
    "measure": ("--tp", "--batch", "--buckets", "--input-len", "--output-len"),
    "amali": ("--input-len", "--output-len"),
}


@st.composite
def command_line(draw, work: Path):
    cmd = draw(st.sampled_from(sorted(FLAGS)))
    argv = cmd.split()
    space = str(work / "base.toml")
    if cmd in ("run", "profile", "predict", "measure", "amali"):
        argv.append(draw(st.sampled_from([space] * 6 + [str(work / "missing.toml"), "", str(work)])))
    elif cmd == "confirm":
        argv.append(draw(st.sampled_from([str(work / "nowhere"), str(work), ""])))
    elif cmd in ("cache export", "cache import"):
        argv.append(str(work / draw(st.sampled_from(["p.csv", "p.parquet", "p.txt", "missing.csv"]))))
    elif cmd == "cache recover":
        argv.append(draw(st.sampled_from([str(work / "nothing.sqlite"), str(work / "base.toml")])))
    flags = FLAGS[cmd]
    chosen = list(REQUIRED.get(cmd, ())) if draw(st.integers(0, 9)) else []
    chosen += [f for f in draw(st.lists(st.sampled_from(sorted(flags)), max_size=5, unique=True)) if f not in chosen] \
        if flags else []
    for flag in chosen:
        argv.append(flag)
        if flags[flag] == "":
            continue
        argv.append(str(work / "res") if flag == "--results" else draw(flags[flag]))
    if draw(st.integers(0, 9)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(["--bogus", "-x", "--", "extra", "--tp"])))
    if cmd.split()[0] != "amali" and "--cache" not in argv:
        argv += ["--cache", str(work / "cli.sqlite")]
    return argv


@FUZZ
@given(st.data())
def test_fuzzed_command_lines(work, data):
    (work / "base.toml").write_text(BASE_SPACE)
    argv = data.draw(command_line(work))
    code, out, err = invoke(argv)
    if code is None:
        return
    if code == 1:  # the (simulated) device refused the unit: a runner failure, reported as such
        assert "out of device memory" in _one_error_line(err), (argv, err)
        return
    assert code in (0, 2, 3), (argv, code, err)
    if code == 2:
        if "usage:" in err:  # argparse: it names the argument it could not take
            assert re.search(r"argument [-\w/]+|unrecognized arguments|required|invalid choice", err), err
        else:
            line = _one_error_line(err)
            flags = [a for a in argv if a.startswith("--")]
            files = [a for a in argv if a.startswith(str(work)) or a.endswith((".csv", ".parquet", ".toml", ".sqlite"))]
            named = flags + files + ["SPACE", "RESULTS_DIR", "FILE"]
            assert any(n in line for n in named) or "--" in line, (argv, line)

