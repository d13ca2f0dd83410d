"""``results/<run>/deploy/``: the chosen configuration in the forms its runner takes."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from lens.types import Candidate
from spaces import Space, WorkloadDescription
from spaces.schema import WorkloadSpec


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table (a runner option such as the command runner's env)
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _workload_lines(space: Space, drawn: WorkloadDescription | None) -> list[str]:
    """The [workload] the search drew its requests from (``drawn``: its run.json's, with the command line's
    --workload, --requests and --seed), every trace as an absolute path (the file lives elsewhere)."""
    w = space.workload or WorkloadSpec()
    if drawn is not None:
        w = dataclasses.replace(w, requests=drawn.requests, seed=drawn.seed)
        if drawn.override:
            src = Path(drawn.source)
            w = (dataclasses.replace(w, trace=src, distribution=None) if src.is_file()
                 else dataclasses.replace(w, trace=None, distribution=drawn.source))
    if w.trace is None and w.distribution is None:
        return []
    lines = ["", "[workload]"]
    for f in dataclasses.fields(WorkloadSpec):
        v = getattr(w, f.name)
        if v is None or (f.name not in ("trace", "distribution", "requests", "seed") and v == f.default):
            continue
        lines.append(f"{f.name} = {_toml_value(str(Path(v).resolve()) if f.name == 'trace' else v)}")
    return lines


def pinned_space(space: Space, c: Candidate, workload: WorkloadDescription | None = None) -> str:
    """A space file holding only ``c``, with the search's workload, serving, objectives and SLOs: ``lensopt
    measure`` and ``predict`` take it as is (``workload``: the sample the search drew, when it overrode the
    space's)."""
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
        f"serving = {_toml_value(t.serving)}",
        "",
        "[target.model]",
        *[f"{k} = {v}" for k, v in t.model.to_dict().items()],
    ]
    if t.serving == "continuous":
        lines += ["", "[target.scheduler]", f"max_prefills = {t.scheduler.max_prefills}",
                  f"prefill_priority = {_toml_value(t.scheduler.prefill_priority)}"]
    if t.options:
        lines += ["", "[target.options]", *[f"{k} = {_toml_value(v)}" for k, v in t.options]]
    tied = c.ctx_buckets == c.tkg_buckets
    lines += ["", "[space]", f"tp = [{c.tp}]", f"batch = [{c.batch}]",
              f"buckets = {_toml_value(sorted(set(c.ctx_buckets) | set(c.tkg_buckets)))}"]
    if not tied:
        lines += ["# context encoding and token generation use different subsets of these buckets:",
                  "# pass --ctx-buckets / --tkg-buckets to lensopt predict / measure",
                  "tie_buckets = false"]
    lines += _workload_lines(space, workload)
    o = space.objectives  # the SLOs' and the sustainable rate's terms (lensopt predict reads max_queue_growth)
    lines += ["", "[objectives]", *[f"{f.name} = {_toml_value(getattr(o, f.name))}" for f in dataclasses.fields(o)]]
    if space.slo:
        lines += ["", "[slo]", *[f"{k} = {_toml_value(v)}" for k, v in space.slo]]
    return "\n".join(lines) + "\n"


def write_deploy(folder: Path, space: Space, candidate: Candidate, runner,
                 workload: WorkloadDescription | None = None) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = dict(runner.deploy_snippets(candidate))
    files.setdefault("space.toml", pinned_space(space, candidate, workload))
    out = []
    for name, text in files.items():
        p = folder / name
        p.write_text(text)
        out.append(p)
    return out
