"""``predict`` and ``measure`` on a workload: the space's [workload] settings apply to a
``--workload`` override too, flags change them, and the output says what was dropped."""
import json

import pytest

from searchkit import write_space
from search.cli import main

UNIT = ["--tp", "1", "--batch", "4"]
BUCKETS = ["--buckets", "128,256,512,1024"]


@pytest.fixture
def profiled(tmp_path):
    """A sim space (sharegpt, length_scale 0.5, drop_longer) with unit tp1 x b4 in its cache."""
    space = write_space(tmp_path)
    cache = tmp_path / "cache.sqlite"
    assert main(["profile", str(space), *UNIT, "--cache", str(cache)]) == 0
    return space, cache


def _json(capsys, argv) -> dict:
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_an_overriding_workload_keeps_the_spaces_drop_longer_and_length_scale(profiled, capsys):
    space, cache = profiled
    out = _json(capsys, ["predict", str(space), *UNIT, *BUCKETS, "--workload", "arxiv_4k", "--cache", str(cache),
                         "--json"])
    wl = out["workload"]
    # arxiv's prompts run to thousands of tokens: halved, many still exceed 1024 and are dropped
    assert wl["source"] == "arxiv_4k" and wl["length_scale"] == 0.5 and wl["dropped_longer"] > 0
    assert wl["requests"] == 60 and out["summary"]["requests"] == 60 - wl["dropped_longer"]  # the space's sample size
    capsys.readouterr()
    assert main(["predict", str(space), *UNIT, *BUCKETS, "--workload", "arxiv_4k", "--cache", str(cache)]) == 0
    text = capsys.readouterr().out
    assert f"{wl['dropped_longer']} of 60 dropped as longer than the largest bucket" in text


def test_flags_change_the_spaces_workload_settings(profiled, capsys):
    space, cache = profiled
    capsys.readouterr()
    assert main(["predict", str(space), *UNIT, *BUCKETS, "--workload", "arxiv", "--no-drop-longer",
                 "--cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err  # one line: file, field, fix
    assert err.startswith(f"lensopt: error: {space}: ") and "of arxiv are longer than the largest bucket 1024 of " \
        "--buckets" in err and "workload.drop_longer = true" in err and "--drop-longer" in err
    small = _json(capsys, ["predict", str(space), *UNIT, *BUCKETS, "--workload", "arxiv", "--length-scale", "0.02",
                           "--requests", "30", "--seed", "3", "--cache", str(cache), "--json"])["workload"]
    assert small["length_scale"] == 0.02 and "dropped_longer" not in small
    assert small["requests"] == 30 and small["seed"] == 3
    capsys.readouterr()
    assert main(["predict", str(space), *UNIT, *BUCKETS, "--input-len", "10", "--output-len", "5", "--workload",
                 "arxiv", "--cache", str(cache)]) == 2
    assert "not both" in capsys.readouterr().err


def test_with_neither_lengths_nor_workload_predict_and_measure_use_the_spaces(profiled, capsys):
    space, cache = profiled
    pred = _json(capsys, ["predict", str(space), *UNIT, *BUCKETS, "--cache", str(cache), "--json"])
    meas = _json(capsys, ["measure", str(space), *UNIT, *BUCKETS, "--repeats", "1", "--json"])
    for out in (pred, meas):
        wl = out["workload"]
        assert wl["source"] == "sharegpt" and wl["requests"] == 60 and wl["seed"] == 0 and wl["length_scale"] == 0.5
        assert out["summary"]["requests"] == 60 - wl.get("dropped_longer", 0)
    assert pred["workload"] == meas["workload"]  # the same sample: predicted and measured compare
