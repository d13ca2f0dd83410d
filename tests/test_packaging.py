"""The package's metadata as the build backend reads it."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_license_is_an_spdx_expression_and_the_backend_reads_one():
    """A table (``{ text = ... }``) makes every install print setuptools' deprecation twice;
    the SPDX string needs setuptools 77 or later in the build requirements."""
    doc = _pyproject()
    assert doc["project"]["license"] == "Apache-2.0"
    req = [r for r in doc["build-system"]["requires"] if r.startswith("setuptools")]
    assert len(req) == 1
    low = re.search(r">=\s*(\d+)", req[0])
    assert low is not None and int(low.group(1)) >= 77, req[0]
