"""The decode steps after a prefill that stops a running decode, step by step, on the jax runner.

A diagnostic for docs/serving.md ("What resuming the decode costs"): for each decode bucket
and each prefill bucket no larger than it, a unit decodes 30 steps, runs one prefill, then
decodes ``--steps`` steps with a wait after each. It prints every step's seconds over the
steady step (the same bucket's steps with a wait after each, in a control round without the
prefill beside each round with it) and the excess of those steps over as many steady ones:
what a served pass that stops a running decode costs the decode that follows it, by the
size of its prefill. ``--repeats`` rounds, median per step.

    python benchmarks/resume_transient.py [--batch 4] [--steps 24] [--repeats 8] [--buckets 64,128] [--gpu]

Real XLA execution (the quickstart model on this CPU; ``--gpu``: the Llama-3.2-1B shape of
``serving_accuracy.py --gpu`` on the GPU JAX sees).
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lens.errors import UserError  # noqa: E402
from search.cli_common import int_list  # noqa: E402
from serving_accuracy import setup  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


class Unit:
    """A unit's compiled graphs driven directly: decode steps and one-row prefills, timed by the host."""

    def __init__(self, runner, batch: int, buckets):
        import jax

        self.st, _ = runner._ensure(1, batch, buckets, buckets)
        ts = runner._tp_state(1)
        put = lambda a: jax.device_put(a, ts.repl)  # noqa: E731
        self.params = ts.params
        self.tok, self.ck, self.cv = self.st.tokens0, self.st.ck, self.st.cv
        self.st.ck = self.st.cv = None  # donated below
        self.step = self.st.step1
        self.l_in = put(np.full(batch, 2, np.int32))
        self.last = put(np.full(batch, 10**6, np.int32))  # every row generates throughout
        self.prompt = {b: put(np.zeros((1, b), np.int32)) for b in buckets}
        self.length = {b: put(np.int32(b - 1)) for b in buckets}
        self.row = put(np.int32(0))

    def decode(self, bucket: int, n: int, *, each: bool) -> np.ndarray:
        """Seconds of each of ``n`` steps (a wait after each), or of all of them (one wait at the end)."""
        g = self.st.graphs[("decode", bucket)]
        t = [time.perf_counter()]
        for _ in range(n):
            self.tok, self.ck, self.cv, self.step = g(self.params, self.ck, self.cv, self.tok, self.l_in, self.last,
                                                      self.step)
            if each:
                self.tok.block_until_ready()
                t.append(time.perf_counter())
        if not each:
            self.tok.block_until_ready()
            t.append(time.perf_counter())
        return np.diff(t)

    def prefill(self, bucket: int) -> float:
        t = time.perf_counter()
        self.tok, self.ck, self.cv = self.st.graphs[("prefill", bucket)](
            self.params, self.ck, self.cv, self.tok, self.prompt[bucket], self.length[bucket], self.row)
        self.tok.block_until_ready()
        return time.perf_counter() - t

    def close(self) -> None:
        self.st.ck, self.st.cv = self.ck, self.cv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--buckets", help="the buckets to run, decode and prefill, comma separated: some of the "
                                      "target's (default: all of them)")
    ap.add_argument("--gpu", action="store_true")
    args = ap.parse_args(argv)
    from runners import get_runner

    target, buckets, _ = setup("jax", "", args.gpu)
    if args.buckets is not None:
        try:
            want = int_list(args.buckets, flag="--buckets")
        except UserError as exc:
            print(f"resume_transient: {exc}", file=sys.stderr)
            return 2
        if not set(want) <= set(buckets):
            print(f"resume_transient: --buckets {args.buckets}: {sorted(set(want) - set(buckets))} not among the "
                  f"target's buckets {', '.join(map(str, buckets))}; give some of those", file=sys.stderr)
            return 2
        buckets = tuple(sorted(set(want)))
    if args.gpu:
        import jax

        if jax.default_backend() != "gpu":
            print(f"resume_transient: --gpu: JAX sees no GPU here (backend {jax.default_backend()!r}); leave --gpu "
                  f"out for this CPU", file=sys.stderr)
            return 2
    unit = Unit(get_runner(target), args.batch, buckets)
    n = args.steps
    gc.disable()  # a collection inside the timed loop is host noise, not device time
    try:
        print(f"{target.name} batch {args.batch}: steps after one prefill over the steady step (median of "
              f"{args.repeats}); excess = those {n} steps less {n} steady ones")
        for d in buckets:
            unit.decode(d, 10, each=False)
            print(f"decode bucket {d}:")
            for p in (b for b in buckets if b <= d):
                steps, pre, calm = [], [], []
                for _ in range(args.repeats):  # each round beside a control round: a host that drifts moves both
                    unit.decode(d, 30, each=False)  # a running decode, then the pass
                    pre.append(unit.prefill(p))
                    steps.append(unit.decode(d, n, each=True))
                    unit.decode(d, 30, each=False)  # the same without the pass
                    calm.append(unit.decode(d, n, each=True))
                med = np.median(steps, axis=0)
                steady = float(np.median(calm))
                shown = " ".join(f"{x / steady:.2f}" for x in med[:12])
                print(f"  prefill {p:5d} ({np.median(pre) * 1e3:7.2f} ms, steady step {steady * 1e3:.3f}): {shown}  excess "
                      f"{(med.sum() - n * steady) * 1e3:+.2f} ms", flush=True)
    finally:
        gc.enable()
        unit.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
