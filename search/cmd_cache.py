"""``lensopt cache``: list, export, import and remove cached bucket profiles."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from lens.errors import UserError
from store import EXPORT_FORMATS, ProfileCache, recover, resolve_cache_path
from store.transfer import check_format

from .cli_common import int_arg


def register(sub: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--cache", metavar="PATH", default=None,
        help="profile cache file (default: $LENSOPT_CACHE, else ~/.cache/lensopt/profiles.sqlite)",
    )
    p = sub.add_parser(
        "cache", help="list, export, import or remove cached bucket profiles",
        description="Manage the profile cache shared by every search on this host.",
    )
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION")
    csub.required = True

    ls = csub.add_parser("ls", parents=[common], help="list the cached units and the units that failed",
                         description="List the cached units: one line per (fingerprint, tp, batch); then the units "
                                     "whose profiling failed for good, which searches skip.")
    ls.add_argument("--json", action="store_true", help="print the units as a JSON list")
    ls.set_defaults(func=cmd_ls)

    ex = csub.add_parser("export", parents=[common], help="write every profile to a .csv or .parquet file",
                         description="Write every cached profile to FILE (.csv or .parquet, by extension).")
    ex.add_argument("file", metavar="FILE", help=f"output file ({' or '.join(EXPORT_FORMATS)})")
    ex.set_defaults(func=cmd_export)

    im = csub.add_parser("import", parents=[common], help="add the profiles of an exported file",
                         description="Add the profiles of FILE (written by `lensopt cache export`). "
                                     "Every row is checked before anything is written.")
    im.add_argument("file", metavar="FILE", help=f"input file ({' or '.join(EXPORT_FORMATS)})")
    im.add_argument("--replace", action="store_true",
                    help="overwrite profiles the cache already holds (default: keep them)")
    im.set_defaults(func=cmd_import)

    rc = csub.add_parser("recover", parents=[common], help="salvage the profiles of a damaged cache into a new file",
                         description="Copy every readable, valid profile of a damaged cache FILE (default: the "
                                     "--cache file) into a new cache (default FILE.recovered). FILE is only read.")
    rc.add_argument("file", metavar="FILE", nargs="?", help="the damaged cache file")
    rc.add_argument("--to", metavar="NEW", help="the new cache file (default FILE.recovered; must not exist)")
    rc.set_defaults(func=cmd_recover)

    rm = csub.add_parser("rm", parents=[common], help="remove profiles (and failure records)",
                         description="Remove the profiles matching every filter given, and the failure records of "
                                     "the units matching them; --all removes every profile and record.")
    rm.add_argument("--fingerprint", metavar="F", help="target fingerprint")
    rm.add_argument("--tp", type=int_arg, metavar="N", help="tensor-parallel degree")
    rm.add_argument("--batch", type=int_arg, metavar="N", help="batch size")
    rm.add_argument("--bucket", type=int_arg, metavar="N", help="bucket length")
    rm.add_argument("--all", action="store_true", help="remove every profile in the cache")
    rm.add_argument("--failed", action="store_true",
                    help="remove only the failure records (searches then try those units again)")
    rm.set_defaults(func=cmd_rm)


def _when(ts: float) -> str:
    if not ts or math.isnan(ts):
        return "-"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _no_cache(path: Path) -> bool:
    return not os.path.lexists(path)


def cmd_ls(args: argparse.Namespace) -> int:
    path = resolve_cache_path(args.cache)
    if _no_cache(path):
        if args.json:
            print("[]")
        else:
            print(f"no profile cache at {path} (nothing profiled yet)")
        return 0
    with ProfileCache.open(path, create=False) as cache:
        units = cache.units()
        failed = cache.failures()
    if args.json:
        out = []
        for r in units.to_dict("records"):
            out.append({
                "fingerprint": r["fingerprint"], "tp": int(r["tp"]), "batch": int(r["batch"]),
                "buckets": [int(b) for b in r["buckets"]], "runner": r["runner"], "host": r["host"],
                "measured_at": float(r["measured_at"]), "simulated": bool(r["simulated"]),
                "host_costs_method": int(r["host_costs_method"]),
                "compile_s": None if math.isnan(r["compile_s"]) else float(r["compile_s"]),
                "run_s": None if math.isnan(r["run_s"]) else float(r["run_s"]),
            })
        for r in failed.to_dict("records"):  # marked "failed": they hold no profile
            out.append({"fingerprint": r["fingerprint"], "tp": int(r["tp"]), "batch": int(r["batch"]), "failed": True,
                        "reason": r["reason"], "kind": r["kind"], "host": r["host"],
                        "failed_at": float(r["failed_at"])})
        print(json.dumps(out, indent=2))
        return 0
    if units.empty and failed.empty:
        print(f"profile cache {path} is empty")
        return 0
    if not units.empty:
        rows = [
            [r.fingerprint, str(r.tp), str(r.batch), ",".join(map(str, r.buckets)),
             r.runner, r.host, _when(r.measured_at), str(r.host_costs_method) if r.host_costs_method else "unknown"]
            for r in units.itertuples(index=False)
        ]
        print(_table(["fingerprint", "tp", "batch", "buckets", "runner", "host", "measured_at", "method"], rows,
                     right={1, 2}))
    n_prof = int(units["n_buckets"].sum()) if not units.empty else 0
    summary = f"{len(units)} unit{'s' * (len(units) != 1)}, {n_prof} profile{'s' * (n_prof != 1)}"
    if not failed.empty:
        if not units.empty:
            print()
        print("failed for good (searches skip them; `lensopt run --retry-failed` measures them again, "
              "`lensopt cache rm --failed` forgets them):")
        rows = [[r.fingerprint, str(r.tp), str(r.batch), _when(r.failed_at), r.host, r.reason]
                for r in failed.itertuples(index=False)]
        print(_table(["fingerprint", "tp", "batch", "failed_at", "host", "reason"], rows, right={1, 2}))
        summary += f", {len(failed)} failed unit{'s' * (len(failed) != 1)}"
    print(f"{summary} in {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    path = resolve_cache_path(args.cache)
    out = Path(args.file).expanduser()
    check_format(out)
    if _no_cache(path):
        raise UserError(f"no profile cache at {path}: nothing to export (pass --cache PATH to export another cache)")
    with ProfileCache.open(path, create=False) as cache:
        n = cache.export(out)
    print(f"exported {n} profile{'s' * (n != 1)} to {out}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    path = resolve_cache_path(args.cache)
    src = Path(args.file).expanduser()
    check_format(src)
    if not src.is_file():
        raise UserError(f"{src}: no such file")
    with ProfileCache.open(path) as cache:
        c = cache.import_file(src, replace=args.replace)
    total = c["inserted"] + c["skipped"] + c["replaced"]
    msg = f"imported {total} profile{'s' * (total != 1)} from {src} into {path}: {c['inserted']} new"
    if args.replace:
        msg += f", {c['replaced']} replaced"
    else:
        msg += f", {c['skipped']} already cached and kept"
        if c["skipped"]:
            msg += " (pass --replace to overwrite them)"
    print(msg)
    return 0


def rm_unit_argv(fingerprint: str, tp: int, batch: int, cache: str | None = None) -> list[str]:
    """The ``lensopt cache rm`` command line that forgets one unit's profiles (``cache``: a --cache to pass on)."""
    return ["lensopt", "cache", "rm", "--fingerprint", fingerprint, "--tp", str(tp), "--batch", str(batch),
            *(["--cache", str(cache)] if cache else [])]


def cmd_rm(args: argparse.Namespace) -> int:
    filters = {k: getattr(args, k) for k in ("fingerprint", "tp", "batch", "bucket") if getattr(args, k) is not None}
    if not filters and not args.all and not args.failed:
        raise UserError("cache rm: give a filter (--fingerprint, --tp, --batch, --bucket), --failed, or --all to "
                        "remove every profile")
    if filters and args.all:
        raise UserError("cache rm: --all removes every profile; drop it to remove only the filtered ones")
    if args.failed and "bucket" in filters:
        raise UserError("cache rm: a failure is a whole unit's; drop --bucket with --failed")
    path = resolve_cache_path(args.cache)
    if _no_cache(path):
        print(f"no profile cache at {path}; removed 0 profiles", file=sys.stderr)
        return 0
    unit_filters = {k: v for k, v in filters.items() if k != "bucket"}
    with ProfileCache.open(path, create=False) as cache:
        n = 0 if args.failed else cache.remove(**filters)
        # a whole unit removed forgets its failure too; one bucket of it leaves the record
        f = cache.forget_failures(**unit_filters) if "bucket" not in filters else 0
    what = [] if args.failed else [f"{n} profile{'s' * (n != 1)}"]
    if f or args.failed:
        what.append(f"{f} failure record{'s' * (f != 1)}")
    print(f"removed {' and '.join(what)} from {path}")
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    src = Path(args.file).expanduser() if args.file else resolve_cache_path(args.cache)
    r = recover(src, args.to)
    lost = ""
    if r["skipped_rows"] or r["unreadable_parts"]:
        lost = (f"; left out {r['skipped_rows']} invalid row(s) and {r['unreadable_parts']} unreadable part(s) "
                f"(their units are profiled again when needed)")
    print(f"recovered {r['profiles']} profile{'s' * (r['profiles'] != 1)} of {r['units']} unit"
          f"{'s' * (r['units'] != 1)} from {src} into {r['path']}{lost}; {src} was not changed. "
          f"Use --cache {r['path']}, or move it to {src}")
    return 0
