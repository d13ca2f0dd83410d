"""Argument parsing helpers shared by the subcommands (strings only at this edge)."""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Sequence

import numpy as np

from lens.errors import UserError
from lens.types import BATCHING, SERVING_MODES, Candidate, Requests, Target
from spaces import Space, WorkloadDescription, load_requests, load_space
from spaces.schema import WorkloadSpec, flag_help, meta


_INT64_MAX = 2**63 - 1


def int_arg(text: str) -> int:
    """argparse ``type`` for integer flags: an int that fits 64 bits (argparse names the flag on error)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if abs(v) > _INT64_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is too large")
    return v


def int_list(text: str, *, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip() != "")
    except ValueError:
        raise UserError(f"{flag} {text!r}: give integers separated by commas, e.g. {flag} 64,128,256") from None
    if not vals:
        raise UserError(f"{flag} is empty: give integers separated by commas")
    for v in vals:
        if abs(v) > _INT64_MAX:
            raise UserError(f"{flag} {text!r}: {v} is too large")
    return vals


def add_space_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("space", metavar="SPACE", help="space file (TOML), e.g. spaces/quickstart.toml")


def add_cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", metavar="PATH", help="profile cache file (default $LENSOPT_CACHE or ~/.cache/lensopt/profiles.sqlite)")


def add_unit_args(p: argparse.ArgumentParser, *, buckets_required: bool) -> None:
    p.add_argument("--tp", type=int_arg, required=True, help="tensor-parallel degree")
    p.add_argument("--batch", type=int_arg, required=True, help="batch size compiled into the unit")
    p.add_argument(
        "--buckets", required=buckets_required, metavar="A,B,C",
        help="bucket set (context encoding and token generation)" + ("" if buckets_required else "; default: all of space.buckets"),
    )
    if buckets_required:
        p.add_argument("--ctx-buckets", metavar="A,B", help="context-encoding buckets, when they differ from --buckets")
        p.add_argument("--tkg-buckets", metavar="A,B", help="token-generation buckets, when they differ from --buckets")


def add_request_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-len", metavar="I[,I...]", help="prompt length(s): one value, or one per request of the batch")
    p.add_argument("--output-len", metavar="O[,O...]", help="output length(s): one value, or one per request")
    p.add_argument("--workload", metavar="FILE|NAME",
                   help="a trace file (CSV/JSONL) or a built-in distribution name instead of the space's [workload] "
                        "(its other settings still apply); with neither this nor lengths, the space's [workload]")
    p.add_argument("--requests", type=int_arg, help=flag_help(WorkloadSpec, "requests"))
    p.add_argument("--seed", type=int_arg, help=flag_help(WorkloadSpec, "seed"))
    p.add_argument("--length-scale", type=float, metavar="F", help=flag_help(WorkloadSpec, "length_scale"))
    p.add_argument("--drop-longer", action=argparse.BooleanOptionalAction, default=None,
                   help=flag_help(WorkloadSpec, "drop_longer", "drop sampled requests longer than the largest of "
                                                               "--buckets instead of stopping with an error"))
    p.add_argument("--mode", choices=BATCHING + SERVING_MODES[1:],
                   help=meta(Target, "batching")["help"] + ", or continuous (target.serving = \"continuous\": "
                        "requests take free slots as they arrive, docs/serving.md) (default: continuous when the "
                        "space's target.serving is, else its target.batching, static if the file leaves both out)")


def space_and_unit(args) -> tuple[Space, int, int]:
    space = load_space(args.space)
    for flag, v in (("--tp", args.tp), ("--batch", args.batch)):
        if v < 1:
            raise UserError(f"{flag} {v}: must be a positive integer")
    m = space.target.model
    if m.heads % args.tp or m.kv_heads % args.tp:
        raise UserError(
            f"--tp {args.tp} does not divide heads = {m.heads} and kv_heads = {m.kv_heads} of {space.path}; "
            f"use a divisor of {math.gcd(m.heads, m.kv_heads)}"
        )
    return space, args.tp, args.batch


def candidate_from_args(args, space: Space) -> Candidate:
    base = int_list(args.buckets, flag="--buckets")
    ctx = int_list(args.ctx_buckets, flag="--ctx-buckets") if getattr(args, "ctx_buckets", None) else base
    tkg = int_list(args.tkg_buckets, flag="--tkg-buckets") if getattr(args, "tkg_buckets", None) else base
    from lens.buckets import validate_buckets

    return Candidate(
        tp=args.tp, batch=args.batch,
        ctx_buckets=validate_buckets(ctx, what="--ctx-buckets" if ctx is not base else "--buckets"),
        tkg_buckets=validate_buckets(tkg, what="--tkg-buckets" if tkg is not base else "--buckets"),
    )


#: flags that shape a workload sample, and so mean nothing beside explicit lengths
_SAMPLE_FLAGS = ("workload", "requests", "seed", "length_scale", "drop_longer")


def mode_of(args, space: Space) -> str:
    """--mode, else the space's: continuous when target.serving is, else its target.batching."""
    if args.mode:
        return args.mode
    return "continuous" if space.target.serving == "continuous" else space.target.batching


def requests_for(args, space: Space, cand: Candidate, *,
                 mode: str = "static") -> tuple[Requests, WorkloadDescription | None]:
    """The requests of ``predict``/``measure``: the lengths given, else a workload sample.

    The sample is ``--workload`` or, without it, the space's ``[workload]``; either way with
    the space's settings (requests, seed, length_scale, drop_longer) unless a flag changes
    them, fitted to the candidate's largest buckets. Its description says what was dropped.
    In ``mode`` continuous the requests carry arrival times (``spaces.load_requests``; for
    lengths given on the command line, ``search.cli_serving.with_arrivals``).
    """
    continuous = mode == "continuous"
    if args.input_len or args.output_len:
        given = [f"--{k.replace('_', '-')}" for k in _SAMPLE_FLAGS if getattr(args, k) is not None]
        if given:
            raise UserError(f"give either --input-len/--output-len or a workload ({', '.join(given)}), not both")
        return requests_from_args(args, cand.batch, continuous=continuous), None
    if args.workload is None and space.workload is None:
        raise UserError(f"give --input-len and --output-len, or --workload FILE|NAME ({space.path} has no [workload])")
    return load_requests(space, workload=args.workload, requests=args.requests, seed=args.seed,
                         length_scale=args.length_scale, drop_longer=args.drop_longer,
                         max_len=min(max(cand.ctx_buckets), max(cand.tkg_buckets)),
                         serving="continuous" if continuous else "static",
                         arrival_rate=getattr(args, "request_rate", None), burstiness=getattr(args, "burstiness", None))


def requests_from_args(args, batch: int, *, continuous: bool = False) -> Requests:
    """The requests of --input-len/--output-len: at most ``batch`` of them (one static batch), or,
    ``continuous``, a queue of any length."""
    if not (args.input_len and args.output_len):
        raise UserError("give --input-len and --output-len (or --workload FILE|NAME)")
    ins = int_list(args.input_len, flag="--input-len")
    outs = int_list(args.output_len, flag="--output-len")
    n = max(len(ins), len(outs))
    if len(ins) not in (1, n) or len(outs) not in (1, n):
        raise UserError(f"--input-len has {len(ins)} values and --output-len {len(outs)}: give one value or one per request")
    if n > batch and not continuous:
        raise UserError(f"{n} requests for --batch {batch}: give at most one value per request of the batch, or use --workload")
    ins = ins * n if len(ins) == 1 else ins
    outs = outs * n if len(outs) == 1 else outs
    from lens.workload import MAX_TOKENS

    for flag, vals in (("--input-len", ins), ("--output-len", outs)):
        if min(vals) < 1:
            raise UserError(f"{flag} {min(vals)}: token counts must be >= 1")
        if max(vals) > MAX_TOKENS:
            raise UserError(f"{flag} {max(vals)}: more than {MAX_TOKENS:,} tokens")
    return Requests(np.asarray(ins), np.asarray(outs), name="cli")


def json_safe(v: Any) -> Any:
    """``v`` with numpy values as Python ones and non-finite floats as None (JSON has no NaN)."""
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, np.ndarray):
        return [json_safe(x) for x in v.tolist()]
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return None if not math.isfinite(f) else f
    if isinstance(v, np.integer):
        return int(v)
    return v


def print_json(obj: Any) -> None:
    json.dump(json_safe(obj), sys.stdout, indent=2)
    sys.stdout.write("\n")


def fmt_s(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if x >= 1:
        return f"{x:.3f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.1f} us"


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
