"""The dependency direction between the packages: ``lens`` (the pure estimator) imports nothing
of ours and no IO library; ``store`` builds on ``lens`` only; ``import runners`` stays light
(no pytest, although ``runners.conformance`` ships with it)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("lens", "runners", "search", "spaces", "store")


def _loaded_after(code: str) -> set[str]:
    """Top-level names of the modules loaded by ``code`` in a fresh interpreter."""
    p = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stderr
    return set(json.loads(p.stdout.strip().splitlines()[-1]))


def _imported_by(package: str) -> dict[str, set[str]]:
    """file -> top-level names it imports anywhere (also inside functions), for every module of ``package``."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        out[str(path.relative_to(ROOT))] = names
    return out


def test_importing_every_lens_module_loads_nothing_of_ours_and_no_io_library():
    loaded = _loaded_after(
        "import importlib, pkgutil, lens\n"
        "for m in pkgutil.walk_packages(lens.__path__, 'lens.'):\n"
        "    importlib.import_module(m.name)\n"
    )
    assert "lens" in loaded and "numpy" in loaded  # it did import something
    assert loaded & {"runners", "search", "spaces", "store"} == set()
    assert loaded & {"sqlite3", "pandas", "pyarrow", "ray", "optuna"} == set()


@pytest.mark.parametrize("package, allowed", [
    ("lens", {"lens"}),
    ("store", {"lens", "store"}),
])
def test_a_package_names_only_the_packages_below_it(package, allowed):
    found = {f: names & set(OURS) - allowed for f, names in _imported_by(package).items()}
    assert found and all(not bad for bad in found.values()), {f: bad for f, bad in found.items() if bad}


def test_lens_source_imports_no_sqlite_nor_parquet():
    found = {f: names & {"sqlite3", "pyarrow"} for f, names in _imported_by("lens").items()}
    assert all(not bad for bad in found.values()), {f: bad for f, bad in found.items() if bad}


def test_importing_runners_loads_no_pytest_and_nothing_above_it():
    loaded = _loaded_after("import runners")
    assert "runners" in loaded
    assert loaded & {"pytest", "_pytest", "search", "spaces", "store"} == set()
