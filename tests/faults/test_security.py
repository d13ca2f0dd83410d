"""Security: no shell anywhere, nothing ever unpickled, cache imports checked, Ray token auth documented."""
from __future__ import annotations

import ast
import hashlib
import json
import pickle
from pathlib import Path

import pytest

from faultkit import ROOT, fault  # noqa: F401  (fault is a fixture)
from lens.errors import UserError
from lens.types import BucketProfile, ModelShape, Target
from runners.command import CommandRunner
from search.cli import main
from store import PROFILE_COLUMNS, ProfileCache

PACKAGES = ("lens", "runners", "search", "spaces")


def _sources():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield path, ast.parse(path.read_text(), filename=str(path))


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def test_no_shell_anywhere_in_the_code():
    bad = []
    shells = {"os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput", "pty.spawn"}
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = _dotted(node.func)
                if name in shells:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
                for kw in node.keywords:
                    if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: shell={ast.unparse(kw.value)}")
    assert bad == []


def test_nothing_is_ever_unpickled():
    bad = []
    banned_modules = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
    banned_calls = {"read_pickle", "unsafe_load", "full_load"}
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bad += [f"{path.name}:{node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] in banned_modules]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in banned_modules:
                bad.append(f"{path.name}:{node.lineno}: from {node.module} import")
            elif isinstance(node, ast.Call):
                name = _dotted(node.func)
                if name.rsplit(".", 1)[-1] in banned_calls or name in ("yaml.load", "torch.load"):
                    bad.append(f"{path.name}:{node.lineno}: {name}")
                for kw in node.keywords:
                    if kw.arg == "allow_pickle" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                        bad.append(f"{path.name}:{node.lineno}: allow_pickle")
    assert bad == []


def test_config_values_reach_the_program_literally(tmp_path, fault):
    fault.fault = "shell syntax in runner options"
    marker = tmp_path / "pwned"
    hostile = f"$(touch {marker}); `touch {marker}` && touch {marker}"
    fault.injected = "command substitution in target.options.env and argv"
    prog = tmp_path / "echo_env.py"
    prog.write_text("import json, os, sys\n"
                    "json.load(sys.stdin)\n"
                    "print(json.dumps({'protocol': 1, 'version': os.environ['HOSTILE'], 'device': sys.argv[1],"
                    " 'simulated': True}))\n")
    model = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256)
    opts = {"argv": ["{python}", str(prog), hostile], "env": {"HOSTILE": hostile}, "timeout_s": 30.0}
    r = CommandRunner(Target("t", "command", "toy-npu", "exclusive", "bfloat16", model, tuple(sorted(opts.items()))))
    d = r.describe()
    assert d["version"] == hostile and d["device"] == hostile
    assert not marker.exists()
    fault.lost, fault.duplicated = 0, 0


class _Payload:
    """Unpickling this creates a file: proof that something unpickled it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _cache_with_one_profile(path: Path) -> str:
    with ProfileCache.open(path) as c:
        c.put_unit(fingerprint="f" * 16, tp=1, batch=1, target={}, runner="sim", versions={}, host="h",
                   compile_s=1.0, run_s=1.0,
                   profiles=[BucketProfile(bucket=128, ttft_s=0.01, tbt_s=0.001, input_len=64, l1=2, l2=64, t1_s=0.1,
                                           t2_s=0.2, repeats=3, spread=0.01, raw_t1=(0.1,) * 3, raw_t2=(0.2,) * 3,
                                           source="simulated", simulated=True)])
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def no_unpickling(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("something tried to unpickle")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)


def _row(**over) -> dict:
    row = {"fingerprint": "a" * 16, "tp": 1, "batch": 1, "bucket": 256, "ttft_s": 0.01, "tbt_s": 0.001,
           "input_len": 129, "l1": 2, "l2": 64, "t1_s": 0.1, "t2_s": 0.2, "raw_t1": "[0.1]", "raw_t2": "[0.2]",
           "repeats": 1, "spread": 0.0, "runner": "sim", "host": "h", "measured_at": 1.0, "simulated": 1,
           "source": "simulated", "ttft_err_s": 0.0, "tbt_err_s": 0.0, "excess": 0.0, "accepted": 1, "row_s": 0.0,
           "admit_first_s": 0.0, "admit_next_s": 0.0, "kv_token_s": 0.0, "row_context": 0.0, "resume_s": 0.0,
           "admit_busy_s": 0.0, "resume_idle": "[]", "resume_busy": "[]",
           "prefill_tail": "[]", "prefill_tail_median_s": 0.0, "decode_pace": "[]", "decode_pace_window_s": 0.0,
           "decode_pace_tau_s": 0.0, "host_costs_method": 1}
    row.update(over)
    return row


@pytest.mark.parametrize("where", ["extension-type", "binary-cell", "schema-metadata", "csv-cell"])
def test_cache_import_never_unpickles(tmp_path, where, no_unpickling, capsys, fault):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    fault.fault = f"pickle payload in an import ({where})"
    marker = tmp_path / "unpickled"
    blob = pickle.dumps(_Payload(marker))
    cache = tmp_path / "c.sqlite"
    sha = _cache_with_one_profile(cache)
    row = _row()
    if where == "csv-cell":
        src = tmp_path / "hostile.csv"
        row["raw_t1"] = blob.decode("latin-1").replace("\n", " ").replace(",", ";").replace('"', "'")
        src.write_text(",".join(PROFILE_COLUMNS) + "\n" + ",".join(json.dumps(str(row[c])) for c in PROFILE_COLUMNS) + "\n",
                       encoding="utf-8")
    else:
        src = tmp_path / "hostile.parquet"
        fields, arrays = [], []
        for c in PROFILE_COLUMNS:
            v = row[c]
            if c == "raw_t1" and where in ("extension-type", "binary-cell"):
                meta = ({b"ARROW:extension:name": b"arrow.py_extension_type", b"ARROW:extension:metadata": blob}
                        if where == "extension-type" else None)
                fields.append(pa.field(c, pa.binary(), metadata=meta))
                arrays.append(pa.array([blob], pa.binary()))
            else:
                t = pa.string() if isinstance(v, str) else (pa.float64() if isinstance(v, float) else pa.int64())
                fields.append(pa.field(c, t))
                arrays.append(pa.array([v], t))
        meta = {b"pandas": blob} if where == "schema-metadata" else None
        pq.write_table(pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=meta)), src)
    fault.injected = "a pickle that creates a file when unpickled"
    code = main(["cache", "import", str(src), "--cache", str(cache)])
    err = capsys.readouterr().err
    assert not marker.exists()
    if where == "schema-metadata":  # the metadata is ignored; the rows are valid and import as data
        assert code == 0, err
    else:
        assert code == 2 and "raw_t1" in err and str(src) in err and "Traceback" not in err, err
        assert hashlib.sha256(cache.read_bytes()).hexdigest() == sha  # nothing written
    with ProfileCache.open(cache, create=False) as c:
        assert (c.frame()["tbt_s"] > 0).all()
    fault.lost, fault.duplicated = 0, 0


def test_import_checks_its_schema_before_writing(tmp_path):
    cache = tmp_path / "c.sqlite"
    sha = _cache_with_one_profile(cache)
    src = tmp_path / "extra.csv"
    src.write_text(",".join(PROFILE_COLUMNS) + ",__reduce__\n" + ",".join(str(_row()[c]) for c in PROFILE_COLUMNS) + ",x\n")
    with ProfileCache.open(cache, create=False) as c:
        with pytest.raises(UserError, match="unexpected columns"):
            c.import_file(src)
    assert hashlib.sha256(cache.read_bytes()).hexdigest() == sha


def test_ray_token_authentication_is_documented():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Ray clusters"):]
    section = section[:section.index("\n## ", 5)]
    for needed in ("RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN_PATH", "--ray-address"):
        assert needed in section, needed
    # the multi-node test runs its cluster with token authentication, as documented
    assert "RAY_AUTH_MODE" in (ROOT / "tests" / "search" / "test_ray_cluster.py").read_text()
