"""``[target] batching``: a runner that cannot execute a batching refuses it when the space loads."""
from __future__ import annotations

from pathlib import Path

import pytest

from lens.errors import SpaceError, UserError
from lens.types import ModelShape, Target
from runners import available, get_runner, runner_class
from search.cli import main
from spaces import load_space

ROOT = Path(__file__).resolve().parents[2]


def _ragged(tmp_path: Path, name: str) -> Path:
    text = (ROOT / "spaces" / name).read_text()
    p = tmp_path / name
    p.write_text(text.replace("[target]\n", "[target]\nbatching = \"ragged\"\n", 1))
    return p


@pytest.mark.parametrize("name", ["quickstart.toml", "sim-tpu-v6e.toml", "command-example.toml"])
def test_a_ragged_space_is_refused_at_load_by_a_runner_that_runs_static_batches(tmp_path, name):
    p = _ragged(tmp_path, name)
    with pytest.raises(SpaceError) as exc:
        load_space(p)
    msg = str(exc.value)
    assert str(p) in msg and "target.batching = 'ragged'" in msg and "static batches only" in msg
    assert 'batching = "static"' in msg  # the fix


def test_no_installed_runner_claims_ragged_batches_it_does_not_execute():
    """Confirmation would compare ragged predictions with static measurements: until a runner
    executes ragged batches, none may accept them."""
    for name in available():
        try:
            cls = runner_class(name)
        except UserError:  # an optional SDK that is not installed
            continue
        assert cls.batchings == ("static",), name


def test_the_python_api_refuses_it_too():
    t = Target(name="t", runner="sim", hardware="tpu-v6e", bucket_policy="exclusive", dtype="bfloat16",
               model=ModelShape(layers=2, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=1000),
               batching="ragged")
    with pytest.raises(UserError, match="static batches only"):
        get_runner(t)


def test_a_ragged_prediction_by_hand_is_still_allowed_and_a_ragged_measurement_is_refused(tmp_path, capsys):
    space = ROOT / "spaces" / "quickstart.toml"
    rc = main(["measure", str(space), "--tp", "1", "--batch", "1", "--buckets", "64", "--input-len", "8",
               "--output-len", "4", "--mode", "ragged"])
    err = capsys.readouterr().err
    assert rc == 2 and "--mode ragged" in err and "static batches only" in err and len(err.strip().splitlines()) == 1
