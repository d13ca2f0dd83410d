"""The simulated machine's own bucket selection, on hand-written cases, and its independence from lens."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from lens.errors import UserError
from runners.sim.select import bucket_index, check_buckets, check_policy

BUCKETS = (128, 256, 512)

# (length, index under exclusive, index under inclusive), written out by hand from the rules:
# exclusive: smallest b with l < b, the largest bucket also takes l == b;
# inclusive: smallest b with l <= b; -1: no bucket holds it
CASES = [
    (0, -1, -1),
    (1, 0, 0),
    (127, 0, 0),
    (128, 1, 0),
    (129, 1, 1),
    (255, 1, 1),
    (256, 2, 1),
    (257, 2, 2),
    (511, 2, 2),
    (512, 2, 2),  # the largest bucket takes its own length under both policies
    (513, -1, -1),
    (10_000, -1, -1),
]


@pytest.mark.parametrize("length,exclusive,inclusive", CASES)
def test_hand_written_cases(length, exclusive, inclusive):
    assert bucket_index([length], BUCKETS, "exclusive")[0] == exclusive
    assert bucket_index([length], BUCKETS, "inclusive")[0] == inclusive


def test_vectorised_over_any_shape_and_a_single_bucket():
    lengths = np.array([[1, 128], [256, 600]])
    np.testing.assert_array_equal(bucket_index(lengths, BUCKETS, "exclusive"), [[0, 1], [2, -1]])
    np.testing.assert_array_equal(bucket_index(lengths, BUCKETS, "inclusive"), [[0, 0], [1, -1]])
    # one bucket: both policies take 1..b
    np.testing.assert_array_equal(bucket_index([1, 64, 65], (64,), "exclusive"), [0, 0, -1])
    np.testing.assert_array_equal(bucket_index([1, 64, 65], (64,), "inclusive"), [0, 0, -1])


def test_bad_buckets_and_policies_are_user_errors():
    with pytest.raises(UserError, match="not strictly increasing"):
        check_buckets([256, 128], what="ctx_buckets")
    with pytest.raises(UserError, match="positive integer"):
        check_buckets([0, 128], what="ctx_buckets")
    with pytest.raises(UserError, match="no bucket"):
        check_buckets([], what="ctx_buckets")
    with pytest.raises(UserError, match="bucket_policy 'first_fit' is unknown"):
        check_policy("first_fit")
    with pytest.raises(UserError):
        bucket_index([1], BUCKETS, "first_fit")
    assert check_buckets(np.array([1, 2]), what="x") == (1, 2)


def test_the_simulator_shares_no_code_with_the_estimator():
    """Only lens.types and lens.errors may be imported: no selection, composition or probe code."""
    package = Path(__file__).resolve().parents[2] / "runners" / "sim"
    seen = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name == "lens" or name.startswith("lens."):
                    seen.add(name)
                    assert name in ("lens.types", "lens.errors"), f"{path.name} imports {name}"
    assert seen == {"lens.types", "lens.errors"}
