"""The admission offsets side by side: a busy pass's first prompt with its carriers in each window, by prompt.

A diagnostic for docs/serving.md ("A busy pass's admission offset against the served
passes"). A unit is profiled as lensopt's profiling does (the probes, then the host's cost
of a row), then ``--rounds`` rounds run, each, per prompt bucket (``--prompts``):

- a static call of full batches as the bucket's short probe runs them (lens.admission's
  ``static_workload``): TTFT_b as the probes solve it;
- a served call of lone one-token requests each finding the device idle (``served_workload``
  with bursts of one): a pass's first prompt;
- per token-generation window (``--windows``), the busy call with its carriers decoding in
  that window (``busy_plan(window=...)``): a pass's first prompt during a decode;

the calls in an order that turns each round. Each offset is its call's median less the same
round's static median (as lens.admission), per round. Printed per prompt bucket: the static
median against the profile's TTFT_b, and per offset its mean over the rounds with a standard
error, the rounds' standard deviation and, for the second window on, its difference from the
first window's, paired by round.

    python benchmarks/admission_windows.py [--runner jax|sim|command] [--batch 4] [--rounds 12]
                                           [--windows smallest,largest] [--prompts smallest]

``--windows`` and ``--prompts`` take buckets (``64,512``), or ``smallest`` / ``largest`` (of
those whose window holds a carrier, for windows). ``jax``: real XLA execution on this CPU
(the quickstart model and buckets, as ``serving_accuracy.py``); ``sim`` and ``command``: a
SIMULATED device, labelled so.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lens import admission  # noqa: E402
from lens.buckets import decode_windows  # noqa: E402
from lens.errors import LensoptError, UserError  # noqa: E402
from lens.types import Candidate  # noqa: E402
from runners import get_runner  # noqa: E402
from serving_accuracy import probed, setup  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def pick(spec: str, allowed: list[int], what: str) -> list[int]:
    """The buckets ``spec`` names among ``allowed`` ("smallest", "largest" or bucket numbers, comma separated)."""
    out = []
    for word in spec.split(","):
        word = word.strip()
        if word in ("smallest", "largest"):
            b = allowed[0] if word == "smallest" else allowed[-1]
        elif word.isdigit() and int(word) in allowed:
            b = int(word)
        else:
            raise UserError(f"--{what} {spec!r}: {word!r} is not one of {allowed} (or smallest, largest)")
        if b not in out:
            out.append(b)
    return out


def summary(x_s: list[float]) -> str:
    x = np.asarray(x_s) * 1e3
    sd = float(x.std(ddof=1)) if len(x) > 1 else float("nan")
    return f"{x.mean():+.3f} +- {sd / np.sqrt(len(x)):.3f} ms (sd {sd:.3f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runner", default="jax", choices=("jax", "command", "sim"))
    ap.add_argument("--hardware", default="inf2", help="sim: the simulated device")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--windows", default="smallest,largest")
    ap.add_argument("--prompts", default="smallest")
    ap.add_argument("--profile-repeats", type=int, default=5)
    args = ap.parse_args(argv)
    if args.batch < 2:
        ap.error("--batch must be 2 or more: a batch of one has no free slot while a request decodes")
    if args.rounds < 2:
        ap.error("--rounds must be 2 or more: the rounds' spread is the error")
    try:
        target, buckets, _ = setup(args.runner, args.hardware)
        runner = get_runner(target)
        runner.check_mode("continuous")
        policy = target.bucket_policy
        profiles, _ = probed(runner, target, 1, args.batch, buckets, args.profile_repeats)
        bk = tuple(sorted(buckets))
        prompts = pick(args.prompts, sorted(profiles), "prompts")
        plans = {}
        for b in prompts:
            p = profiles[b]
            held = {w: admission.busy_plan(p, profiles, bk, policy, batch=args.batch, window=w)
                    for w, *_ in decode_windows(profiles, bk, policy)}
            holds = [w for w, plan in held.items() if plan is not None]
            if not holds:
                raise UserError(f"--prompts {b}: no token-generation window of {list(bk)} holds a carrier with a "
                                f"lone arrival of that prompt; pick a smaller prompt bucket")
            for w in pick(args.windows, holds, "windows"):
                plans[b, w] = held[w]
        cand = Candidate(1, args.batch, bk, bk)
        sim = " (SIMULATED device)" if runner.simulated else ""
        print(f"{target.runner}{sim} {target.hardware} tp1 b{args.batch}: TTFT_b "
              + ", ".join(f"{b}: {p.ttft_s * 1e3:.3f} ms" for b, p in sorted(profiles.items())), flush=True)
        static = {b: [] for b in prompts}
        offsets = {(b, "idle"): [] for b in prompts} | {key: [] for key in plans}
        for r in range(args.rounds):
            for b in (prompts if r % 2 == 0 else prompts[::-1]):
                p = profiles[b]
                st = runner.run_workload(cand, admission.static_workload(p, args.batch), mode="static")
                q = float(np.median(admission.static_times(st.e2e_s, args.batch, target.prefill, p=p)))
                static[b].append(q)
                calls = [(b, "idle")] + [key for key in plans if key[0] == b]
                for key in (calls if r % 2 == 0 else calls[::-1]):
                    if key[1] == "idle":
                        run = runner.run_workload(cand, admission.served_workload(p, 1), mode="continuous")
                        times = admission.burst_times(run.ttft_s, 1)[0]
                    else:
                        run = runner.run_workload(cand, plans[key].requests, mode="continuous")
                        times = admission.busy_times(run.ttft_s, plans[key])
                    offsets[key].append(float(np.median(times)) - q)
    except LensoptError as exc:
        print(f"admission_windows: {exc}", file=sys.stderr)
        return 2
    print(f"{args.rounds} rounds; each offset: its call's median less the round's static median")
    for b in prompts:
        print(f"prompt bucket {b}: static {np.median(static[b]) * 1e3:.3f} ms (median; profile TTFT_b "
              f"{profiles[b].ttft_s * 1e3:.3f} ms)")
        print(f"  idle, a pass's first prompt: {summary(offsets[b, 'idle'])}")
        first = None
        for (pb, w), plan in plans.items():
            if pb != b:
                continue
            per = int(plan.lone.sum() // (~plan.lone).sum())
            line = (f"  busy, carriers in window {w} ({plan.step_s * 1e3:.3f} ms steps, {int((~plan.lone).sum())} "
                    f"carriers of {per}): {summary(offsets[b, w])}")
            if first is None:
                first = w
            else:
                d = list(np.asarray(offsets[b, w]) - np.asarray(offsets[b, first]))
                line += f"; less window {first}'s, paired: {summary(d)}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
