"""Each setting is declared once: the schema's dataclass fields carry default, bounds and help;
the loader, the command line and the code read them from there."""
from __future__ import annotations

import ast
import dataclasses
import re
import sys
from pathlib import Path

import pytest

from lens.errors import SpaceError
from lens.types import Target
from search.cli import build_parser
from spaces import Budget, Hosts, Objectives, ProfileSettings, SearchSpace, WorkloadSpec, load_space
from spaces import schema
from spacekit import space_table, tiny_target

ROOT = Path(__file__).resolve().parents[2]

MINIMAL = tiny_target("t") + space_table(batch=(1,)) + '[workload]\ndistribution = "sharegpt"\n'


def _minimal(tmp_path) -> Path:
    p = tmp_path / "min.toml"
    p.write_text(MINIMAL)
    return p


def test_a_file_that_leaves_settings_out_gets_the_schema_defaults(tmp_path):
    sp = load_space(_minimal(tmp_path))
    for table in (sp.profile, sp.budget, sp.objectives, sp.hosts):
        assert table == type(table)()  # every field at its declared default
    assert sp.workload == WorkloadSpec(distribution="sharegpt")
    for f in ("max_buckets", "tie_buckets"):
        assert getattr(sp.search, f) == schema.default(SearchSpace, f)
    for f in ("bucket_policy", "dtype", "seed", "batching", "prefill"):
        assert getattr(sp.target, f) == schema.default(Target, f)


def test_target_prefill_is_read_and_checked(tmp_path):
    p = tmp_path / "batched.toml"
    p.write_text(MINIMAL.replace('hardware = "inf2"', 'hardware = "inf2"\nprefill = "batched"'))
    assert load_space(p).target.prefill == "batched"
    p.write_text(MINIMAL.replace('hardware = "inf2"', 'hardware = "inf2"\nprefill = "chunked"'))
    with pytest.raises(SpaceError, match=re.escape("target.prefill = 'chunked' is not one of sequential, batched")):
        load_space(p)
    # the simulated stack's prefill was a [target.options] key once: the file is told where it lives now
    p.write_text(MINIMAL.replace("[space]", '[target.options]\nprefill = "batched"\n[space]'))
    with pytest.raises(SpaceError, match=re.escape(str(p)) + r': target.options.prefill = "batched" is no longer an '
                                         r'option: write prefill = .* under \[target\]'):
        load_space(p)


@pytest.mark.parametrize(("table", "cls"), [("profile", ProfileSettings), ("budget", Budget), ("workload", WorkloadSpec)])
def test_the_loader_checks_bounds_from_the_schema(tmp_path, table, cls):
    """Every bounded setting is refused one step outside its bounds, with the key named."""
    checked = 0
    for f in dataclasses.fields(cls):
        m = f.metadata
        bad = [m["min"] - 1] if m.get("min") is not None else []
        bad += [m["above"]] if m.get("above") is not None else []
        bad += [m["max"] + 1] if m.get("max") is not None else []
        for v in bad:
            text = MINIMAL if table != "workload" else MINIMAL[:MINIMAL.index("[workload]")]
            extra = f'\n[{table}]\n{f.name} = {v!r}\n' + ('distribution = "sharegpt"\n' if table == "workload" else "")
            p = tmp_path / "bad.toml"
            p.write_text(text + extra)
            with pytest.raises(SpaceError, match=re.escape(f"{table}.{f.name} = ")):
                load_space(p)
            checked += 1
    assert checked >= 3


def _help(command: str, flag: str) -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    act = next(a for a in sub.choices[command]._actions if flag in a.option_strings)
    return " ".join(act.help.split())


@pytest.mark.parametrize(("command", "flag", "cls", "name"), [
    ("run", "--requests", WorkloadSpec, "requests"),
    ("run", "--seed", WorkloadSpec, "seed"),
    ("run", "--trials", Budget, "trials"),
    ("run", "--top", Budget, "top_k"),
    ("confirm", "--top", Budget, "top_k"),
    ("profile", "--repeats", ProfileSettings, "repeats"),
    ("predict", "--mode", Target, "batching"),
])
def test_cli_help_reads_the_schema(command, flag, cls, name):
    text = _help(command, flag)
    assert schema.meta(cls, name)["help"] in text
    assert f"{schema.TABLES[cls]}.{name}, {schema.default(cls, name)} if" in text


def test_the_sampler_flag_lists_the_registry():
    from search.study import DEFAULT_SAMPLER, SAMPLERS

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    act = next(a for a in sub.choices["run"]._actions if "--sampler" in a.option_strings)
    assert tuple(act.choices) == tuple(SAMPLERS) and act.default == DEFAULT_SAMPLER


# -- no default written twice -------------------------------------------------------------------
#: settings whose default must live in one place only, and that place
WATCHED = {"repeats", "max_output", "attempts", "max_spread", "lease_s", "requests", "trials", "top_k", "sampler",
           "tolerance", "drift_tolerance", "prefill"}
HOMES = {("lens/workload.py", "DEFAULT_REQUESTS"), ("search/study.py", "DEFAULT_SAMPLER")}
#: fields that share a setting's name but are not that setting
NOT_SETTINGS = {("search/measure.py", "attempts"),  # UnitMeasurement.attempts: how many were made
                ("search/ledger.py", "trials"),  # RunLedger.trials: how many the run holds
                # the conformance suite's own tiny probe plan, deliberately not a space's
                ("runners/conformance.py", "max_output"), ("runners/conformance.py", "repeats")}
SAMPLER_FILE = "search/study.py"
SCANNED = ("lens", "store", "runners", "spaces", "search", "benchmarks")


def _python_files():
    for top in SCANNED:
        yield from sorted((ROOT / top).rglob("*.py"))


def _literal(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is not None and not isinstance(node.value, bool)


def _violations(path: Path) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(), filename=rel)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
            out += [f"{rel}:{d.lineno}: parameter {p.arg} defaults to {d.value!r}"
                    for p, d in pairs if p.arg in WATCHED and d is not None and _literal(d)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and rel != "spaces/schema.py":
            if (node.target.id in WATCHED and node.value is not None and _literal(node.value)
                    and (rel, node.target.id) not in NOT_SETTINGS):
                out.append(f"{rel}:{node.lineno}: field {node.target.id} = {node.value.value!r}")
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                name = t.id if isinstance(t, ast.Name) else ""
                if re.fullmatch(r"DEFAULT_(\w+)", name) and name[8:].lower() in WATCHED and (rel, name) not in HOMES:
                    out.append(f"{rel}:{node.lineno}: {name} declares a default its schema field already has")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            # the old loader's pattern: section.get("repeats", int, 3)
            if node.args[0].value in WATCHED and len(node.args) >= 3 and _literal(node.args[2]):
                out.append(f"{rel}:{node.lineno}: {node.args[0].value!r} read with a default of its own")
        if isinstance(node, ast.Constant) and rel != SAMPLER_FILE and node.value in ("nsga2", "tpe"):
            out.append(f"{rel}:{node.lineno}: sampler name {node.value!r} listed outside {SAMPLER_FILE}")
    return out


def test_no_setting_default_is_written_twice():
    found = [v for p in _python_files() for v in _violations(p)]
    assert found == []


def test_the_scan_catches_a_second_default(tmp_path, monkeypatch):
    """The scan above is not vacuous: each pattern it looks for is reported."""
    bad = tmp_path / "search" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("DEFAULT_REPEATS = 3\n"
                   "def f(*, lease_s=120.0, requests=None):\n    pass\n"
                   "class C:\n    max_spread: float = 0.5\n"
                   "x = s.get('trials', int, 200)\n"
                   "y = 'nsga2'\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    got = _violations(bad)
    assert len(got) == 5, got
    for word in ("DEFAULT_REPEATS", "lease_s", "max_spread", "'trials'", "'nsga2'"):
        assert any(word in g for g in got), (word, got)


def test_schema_fields_all_carry_help():
    for cls in (SearchSpace, WorkloadSpec, Objectives, Hosts, Budget, ProfileSettings, Target):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
