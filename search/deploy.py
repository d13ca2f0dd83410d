"""``results/<run>/deploy/``: the chosen configuration in the forms its runner takes."""
from __future__ import annotations

import json
from pathlib import Path

from lens.types import Candidate
from spaces import Space


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def pinned_space(space: Space, c: Candidate) -> str:
    """A space file holding only ``c``: ``lensopt measure``/``predict`` take it as is."""
    t = space.target
    lines = [
        f"# The configuration chosen by lensopt for {t.name}: tp={c.tp}, batch={c.batch},",
        f"# context-encoding buckets {list(c.ctx_buckets)}, token-generation buckets {list(c.tkg_buckets)}.",
        "[target]",
        f"name = {_toml_value(t.name)}",
        f"runner = {_toml_value(t.runner)}",
        f"hardware = {_toml_value(t.hardware)}",
        f"bucket_policy = {_toml_value(t.bucket_policy)}",
        f"dtype = {_toml_value(t.dtype)}",
        f"seed = {t.seed}",
        f"batching = {_toml_value(space.target.batching)}",
        f"prefill = {_toml_value(t.prefill)}",
        "",
        "[target.model]",
        *[f"{k} = {v}" for k, v in t.model.to_dict().items()],
    ]
    if t.options:
        lines += ["", "[target.options]", *[f"{k} = {_toml_value(v)}" for k, v in t.options]]
    tied = c.ctx_buckets == c.tkg_buckets
    lines += ["", "[space]", f"tp = [{c.tp}]", f"batch = [{c.batch}]",
              f"buckets = {_toml_value(sorted(set(c.ctx_buckets) | set(c.tkg_buckets)))}"]
    if not tied:
        lines += ["# context encoding and token generation use different subsets of these buckets:",
                  "# pass --ctx-buckets / --tkg-buckets to lensopt predict / measure",
                  "tie_buckets = false"]
    return "\n".join(lines) + "\n"


def write_deploy(folder: Path, space: Space, candidate: Candidate, runner) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = dict(runner.deploy_snippets(candidate))
    files.setdefault("space.toml", pinned_space(space, candidate))
    out = []
    for name, text in files.items():
        p = folder / name
        p.write_text(text)
        out.append(p)
    return out
