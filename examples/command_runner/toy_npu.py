#!/usr/bin/env python3
"""toy-npu: a simulated bucketed accelerator that speaks lensopt's command protocol 1.

A self-contained example of a program for lensopt's ``command`` runner (see
docs/command-protocol.md): it reads one JSON request on stdin and prints one JSON reply on
stdout; logs go to stderr. It uses the Python standard library only, so any ``python3``
(3.8 or later) can run it, not only the one lensopt is installed in.

Nothing is executed on hardware: every time it reports comes from a small cost model of a
compiled-shape device (each graph runs padded to its bucket, a decode step costs the
whole batch, tensor parallelism splits the work and adds all-reduces), multiplied by a
little deterministic noise drawn from ``target.seed``. Compile seconds are reported, never
slept. ``describe`` says ``"simulated": true``, so everything lensopt derives from it is
labelled simulated.

Machine semantics (the protocol's): a request (l_in, l_out) yields l_out tokens, the first
from its prefill, then l_out - 1 decode steps; step k has context l_in + k. A static batch
encodes its prompts one request at a time, then decodes as one shape whose token-generation
bucket at step k is the one of the longest context among the requests still generating.
TTFT and E2E are measured from the start of the request's batch.

It also serves ``"mode": "continuous"`` (docs/serving.md): ``batch`` slots, requests admitted
from a FIFO queue at their ``arrival_s`` into free slots (prompts prefilled one at a time),
then one decode step of every live slot in the bucket of the longest live context; TTFT
and E2E are measured from each request's arrival.

``--modes static`` makes it declare static batches only (as a program written before
continuous mode would). For tests, ``--mode`` makes it misbehave (``--fail-on`` picks the operation):
slow, crash, garbage, silent, protocol, error, oom (an error marked ``"kind": "out_of_memory"``:
a failure that would come back the same), short, nan, negative, mismatch,
flat (every profile run takes the same time, so the longer run is not slower),
outlier (one repeat of every profile run is five times slower: a huge spread),
straggler (a busy host: now and then one graph call -- a prefill or a decode step --
takes ``--straggler-factor`` times its time, 1 call in ``--straggler-every`` on average,
drawn from ``target.seed`` and the call) and drift (the host got slower: every time is
``--drift`` times longer; with ``--drift-decode`` the decode steps slow by that factor
instead, as memory-bound work does when a neighbour takes the memory bandwidth: a host
whose slow-down is not alike for every part of the work).
``--only-batch N`` limits the misbehaviour to units and candidates of batch N;
``--fail-times N --count-file PATH`` to the first N calls (counted in PATH);
``--after N --count-file PATH`` to the calls after the first N (a host that drifts later).
``--jitter SIGMA`` (any mode) is a busy host: every run takes a fresh lognormal factor of that
sigma, drawn anew each time (not reproducible, as another process's load is not).
``--jitter-replay PATH`` makes that busy host the same one every time, for tests: the draws of a
call are seeded by how many calls came before it, counted in PATH (one byte per call).
``$TOY_NPU_MODE``, ``$TOY_NPU_DRIFT``, ``$TOY_NPU_DRIFT_DECODE``, ``$TOY_NPU_JITTER`` and
``$TOY_NPU_JITTER_REPLAY`` give ``--mode``, ``--drift``, ``--drift-decode``, ``--jitter`` and ``--jitter-replay`` when they are not on the command line: the environment is no part of the fingerprint, so a host can be made to
drift between a profile and a measurement without changing the device lensopt sees.
"""
import argparse
import hashlib
import json
import math
import os
import random
import socket
import sys
import time

VERSION = "toy-npu 1.0"
PROTOCOL = 1
MODES = ("ok", "slow", "crash", "garbage", "silent", "protocol", "error", "oom", "short", "nan", "negative", "mismatch",
         "flat", "outlier", "straggler", "drift")
OPS = ("describe", "profile", "run_workload")

# The toy device: one chip's peak, achieved fractions, host costs (public-ish round numbers).
PEAK_FLOPS = 100e12
BANDWIDTH = 800e9
MFU_PREFILL = 0.5
MFU_DECODE = 0.3
HOP_S = 5e-6  # all-reduce latency per ring hop
HOST_GRAPH_S = 4e-4  # host time per graph call (one prefill or one decode step)
HOST_CALL_S = 1.5e-3  # host time per generate call (one static batch)
HOST_ROW_S = 1e-5  # host time per request still generating, per decode step
HOST_ADMIT_S = 3e-4  # host time to admit one request into a slot (continuous mode)
NOISE = 0.01  # sigma of the lognormal run-to-run factor
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


class ToyError(Exception):
    """A request the toy device cannot serve: reported as {"protocol": 1, "error": ...}."""


# -- bucket selection (the machine's rule) ---------------------------------------------------
def select(length, buckets, policy):
    """The bucket ``length`` runs in, or None. exclusive: smallest b with l < b (the largest
    bucket also takes l == b); inclusive: smallest b with l <= b."""
    if length < 1:
        return None
    for b in buckets:
        if (policy == "exclusive" and length < b) or (policy == "inclusive" and length <= b):
            return b
    if policy == "exclusive" and length == buckets[-1]:
        return buckets[-1]
    return None


def _unit(*parts):
    """A deterministic number in [0, 1) from ``parts``."""
    h = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0 ** 64


def _rng(*parts):
    return random.Random(hashlib.sha256(repr(parts).encode()).hexdigest())


def _count_call(path):
    """This call's number (1, 2, ...) among the calls counted in ``path``: one byte each, appended
    (O_APPEND: concurrent callers each add their own)."""
    with open(path, "ab") as fh:
        fh.write(b".")
    with open(path, "rb") as fh:
        return len(fh.read())


class Host:
    """How the host treats graph calls: all at their time (``ok``), now and then one several
    times slower (``straggler``), or all slower by a factor (``drift``: ``drift_decode`` for
    decode steps)."""

    def __init__(self, mode="ok", every=50.0, factor=4.0, drift=1.15, drift_decode=None, jitter=0.0, busy_seed=None):
        self.mode, self.every, self.factor, self.drift = mode, every, factor, drift
        self.drift_decode = drift if drift_decode is None else drift_decode
        self.jitter = jitter
        self._busy = random.SystemRandom() if busy_seed is None else _rng("busy", busy_seed)

    def run_factor(self):
        """A busy host's share of one run: a lognormal factor of sigma ``jitter``, drawn afresh on every
        run and every call of the program (not reproducible, as another process's load is not, unless
        replayed: ``--jitter-replay``)."""
        return self._busy.lognormvariate(0.0, self.jitter) if self.jitter > 0 else 1.0

    def calls(self, costs, rng, decode=False):
        """Seconds of a sequence of graph calls of ``costs`` seconds each (``decode``: decode steps)."""
        if self.mode == "drift":
            return sum(costs) * (self.drift_decode if decode else self.drift)
        if self.mode != "straggler":
            return sum(costs)
        p = 1.0 / self.every
        return sum(c * (self.factor if rng.random() < p else 1.0) for c in costs)

    def launch(self, seconds):
        return seconds * (self.drift if self.mode == "drift" else 1.0)


# -- the cost model ----------------------------------------------------------------------------
class Device:
    """Per-graph seconds of one compiled unit (model, dtype, tp, batch)."""

    def __init__(self, target, tp, batch):
        m = target["model"]
        self.layers, self.hidden = m["layers"], m["hidden"]
        heads, kv, inter, vocab = m["heads"], m["kv_heads"], m["intermediate"], m["vocab"]
        if heads % tp or kv % tp:
            raise ToyError("tp %d must divide heads (%d) and kv_heads (%d)" % (tp, heads, kv))
        if target["dtype"] not in DTYPE_BYTES:
            raise ToyError("dtype %r is not supported by toy-npu" % target["dtype"])
        h, hd = self.hidden, self.hidden // heads
        per_layer = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter + 2 * h
        self.params = float(self.layers * per_layer + 2 * vocab * h + h)
        self.bytes = DTYPE_BYTES[target["dtype"]]
        self.kv_token = 2.0 * self.layers * kv * hd * self.bytes
        self.tp, self.batch = tp, batch

    def _allreduce(self, nbytes):
        if self.tp == 1:
            return 0.0
        p = self.tp
        return 2 * self.layers * (2 * (p - 1) * HOP_S + 2.0 * (p - 1) / p * nbytes / 100e9)

    @staticmethod
    def _tiling(kind, bucket):
        """Off-trend factor of one graph: ragged tiles for non-powers of two, a little per-shape luck."""
        f = 0.97 + 0.06 * _unit("tile", kind, bucket)
        if bucket & (bucket - 1):
            f *= 1.05
        return f

    def prefill_s(self, bucket):
        """One prompt encoded alone, padded to ``bucket``."""
        s = float(bucket)
        flops = 2.0 * self.params * s + 4.0 * s * s * self.hidden * self.layers
        nbytes = self.params * self.bytes + s * self.kv_token
        dev = max(flops / (self.tp * PEAK_FLOPS * MFU_PREFILL), nbytes / (self.tp * BANDWIDTH))
        dev += self._allreduce(s * self.hidden * self.bytes)
        return dev * self._tiling("ctx", bucket) + HOST_GRAPH_S

    def decode_s(self, bucket):
        """One decode step of the whole compiled batch, KV context padded to ``bucket``."""
        s, b = float(bucket), self.batch
        flops = 2.0 * self.params * b + 4.0 * b * s * self.hidden * self.layers
        nbytes = self.params * self.bytes + b * s * self.kv_token
        dev = max(flops / (self.tp * PEAK_FLOPS * MFU_DECODE), nbytes / (self.tp * BANDWIDTH))
        dev += self._allreduce(b * self.hidden * self.bytes)
        return dev * self._tiling("tkg", bucket) + HOST_GRAPH_S

    def compile_s(self, kind, bucket):
        """Seconds to compile one graph (reported, never slept)."""
        size = (bucket / 1024.0) ** 0.25 * (1.5 if kind == "ctx" else 1.0)
        return (2.0 + 4.0 * self.params / 1e9 * size) * (1.0 + 0.05 * math.log2(self.tp))


# -- request checking ----------------------------------------------------------------------------
def _int(d, key, where, lo=1):
    v = d.get(key) if isinstance(d, dict) else None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ToyError("%s%s = %r must be an integer >= %d" % (where, key, v, lo))
    return v


def _buckets(v, what):
    if not isinstance(v, list) or not v or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v):
        raise ToyError("%s must be a non-empty list of positive integers" % what)
    if any(b <= a for a, b in zip(v, v[1:])):
        raise ToyError("%s = %r must be strictly increasing" % (what, v))
    return v


def _policy(req):
    p = req.get("policy")
    if p not in ("exclusive", "inclusive"):
        raise ToyError("policy %r: use exclusive or inclusive" % (p,))
    return p


def _target(req):
    t = req.get("target")
    if not isinstance(t, dict) or not isinstance(t.get("model"), dict):
        raise ToyError("the request has no target with a model")
    for k in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab"):
        _int(t["model"], k, "target.model.")
    if t.get("prefill", "sequential") != "sequential":  # a device refuses what it does not run
        raise ToyError("target.prefill = %r: toy-npu encodes a batch's prompts one at a time; "
                       "set prefill = \"sequential\" under [target]" % (t.get("prefill"),))
    return t


# -- the operations ------------------------------------------------------------------------------
def host_name():
    return "toy-npu@" + socket.gethostname()


def op_describe(req, label, modes):
    device = "toy-npu (simulated bucketed accelerator)"
    if label:
        device += " " + label
    return {"protocol": PROTOCOL, "version": VERSION, "device": device, "simulated": True, "modes": modes}


def op_profile(req, host):
    target = _target(req)
    unit = req.get("unit")
    tp, batch = _int(unit, "tp", "unit."), _int(unit, "batch", "unit.")
    buckets = _buckets(req.get("buckets"), "buckets")
    policy = _policy(req)
    probes = req.get("probes")
    if not isinstance(probes, list) or not probes:
        raise ToyError("probes must be a non-empty list")
    dev = Device(target, tp, batch)
    pre = {b: dev.prefill_s(b) for b in buckets}
    dec = {b: dev.decode_s(b) for b in buckets}
    seed = target.get("seed", 0)
    seen = {}
    runs, run_s = [], 0.0
    for i, p in enumerate(probes):
        where = "probes[%d]." % i
        bucket, l_in = _int(p, "bucket", where), _int(p, "input_len", where)
        l_out, repeats = _int(p, "output_len", where), _int(p, "repeats", where)
        if bucket not in buckets:
            raise ToyError("probe %d: bucket %d is not one of the compiled buckets %r" % (i, bucket, buckets))
        for ctx in range(l_in, l_in + l_out):  # the prompt, then the context of every decode step
            if select(ctx, buckets, policy) != bucket:
                raise ToyError("probe %d: length %d leaves bucket %d of %r under the %s policy"
                               % (i, ctx, bucket, buckets, policy))
        # one generate call: `batch` prompts encoded one by one, then all rows decode together
        prefills = [pre[bucket]] * batch
        steps = [dec[select(l_in + k, buckets, policy)] + HOST_ROW_S * batch for k in range(1, l_out)]
        key = (bucket, l_in, l_out)
        seen[key] = seen.get(key, -1) + 1
        rng = _rng("probe", seed, tp, batch, key, seen[key])
        # which calls straggle depends on the request too (a probe asked again with more
        # repeats meets other stragglers), never on anything but the request
        slow = _rng("straggle", seed, tp, batch, key, seen[key], repeats)
        times = [(host.launch(HOST_CALL_S) + host.calls(prefills, slow) + host.calls(steps, slow, decode=True))
                 * rng.lognormvariate(0.0, NOISE) * host.run_factor() for _ in range(repeats)]
        runs.append({"bucket": bucket, "input_len": l_in, "output_len": l_out, "times_s": times})
        run_s += sum(times)
    compile_s = sum(dev.compile_s("ctx", b) + dev.compile_s("tkg", b) for b in buckets)
    return {"protocol": PROTOCOL, "runs": runs, "compile_s": compile_s, "run_s": run_s, "host": host_name()}


def op_run_workload(req, host):
    target = _target(req)
    cand = req.get("candidate")
    tp, batch = _int(cand, "tp", "candidate."), _int(cand, "batch", "candidate.")
    ctx = _buckets(cand.get("ctx_buckets"), "candidate.ctx_buckets")
    tkg = _buckets(cand.get("tkg_buckets"), "candidate.tkg_buckets")
    policy = _policy(req)
    rq = req.get("requests")
    if not isinstance(rq, dict):
        raise ToyError("requests must be an object with input_len and output_len lists")
    lin, lout = rq.get("input_len"), rq.get("output_len")
    if not isinstance(lin, list) or not isinstance(lout, list) or len(lin) != len(lout) or not lin:
        raise ToyError("requests.input_len and requests.output_len must be non-empty lists of one length")
    for i, (a, o) in enumerate(zip(lin, lout)):
        if isinstance(a, bool) or isinstance(o, bool) or not isinstance(a, int) or not isinstance(o, int) or a < 1 or o < 1:
            raise ToyError("request %d: input_len %r and output_len %r must be integers >= 1" % (i, a, o))
        if select(a, ctx, policy) is None:
            raise ToyError("request %d: input length %d fits no ctx bucket of %r" % (i, a, ctx))
        if o > 1 and select(a + o - 1, tkg, policy) is None:
            raise ToyError("request %d: context %d fits no tkg bucket of %r" % (i, a + o - 1, tkg))
    dev = Device(target, tp, batch)
    pre = {b: dev.prefill_s(b) for b in ctx}
    dec = {b: dev.decode_s(b) for b in tkg}
    digest = hashlib.sha256(json.dumps([lin, lout]).encode()).hexdigest()[:16]
    rng = _rng("workload", target.get("seed", 0), tp, batch, ctx, tkg, digest)
    compile_s = sum(dev.compile_s("ctx", b) for b in ctx) + sum(dev.compile_s("tkg", b) for b in tkg)
    slow = _rng("straggle-workload", target.get("seed", 0), tp, batch, ctx, tkg, digest)
    mode = req.get("mode", "static")
    if mode == "continuous":
        arrival = rq.get("arrival_s")
        if not isinstance(arrival, list) or len(arrival) != len(lin) or any(
                isinstance(a, bool) or not isinstance(a, (int, float)) or not a >= 0 for a in arrival):
            raise ToyError("continuous mode needs requests.arrival_s: one number >= 0 per request")
        sched = req.get("scheduler") or {}
        ttft, e2e, total = serve(lin, lout, arrival, batch, lambda l: host.calls([pre[select(l, ctx, policy)]], slow),
                                 lambda c, live: host.calls([dec[select(c, tkg, policy)] + HOST_ROW_S * live], slow,
                                                            decode=True),
                                 rng.lognormvariate(0.0, NOISE) * host.run_factor(), sched.get("max_prefills", 0),
                                 sched.get("prefill_priority", "prefill") == "prefill")
        return {"protocol": PROTOCOL, "ttft_s": ttft, "e2e_s": e2e, "total_s": total,
                "compile_s": compile_s, "run_s": total, "host": host_name()}
    if mode != "static":
        raise ToyError("mode %r: toy-npu serves static and continuous" % (mode,))
    n = len(lin)
    ttft, e2e = [0.0] * n, [0.0] * n
    total = 0.0
    for s in range(0, n, batch):
        idx = list(range(s, min(s + batch, n)))
        f = rng.lognormvariate(0.0, NOISE) * host.run_factor()
        t = host.launch(HOST_CALL_S) * f
        for i in idx:  # prompts one by one: a request's first token lands when its own prefill ends
            t += host.calls([pre[select(lin[i], ctx, policy)]], slow) * f
            ttft[i] = t
        steps = max(lout[i] for i in idx) - 1
        done_at = {}  # decode step k -> batch clock after it
        for k in range(1, steps + 1):
            active = [i for i in idx if lout[i] - 1 >= k]
            longest = max(lin[i] + k for i in active)
            t += host.calls([dec[select(longest, tkg, policy)] + HOST_ROW_S * len(active)], slow, decode=True) * f
            done_at[k] = t
        for i in idx:
            e2e[i] = done_at[lout[i] - 1] if lout[i] > 1 else ttft[i]
        total += t
    return {"protocol": PROTOCOL, "ttft_s": ttft, "e2e_s": e2e, "total_s": total,
            "compile_s": compile_s, "run_s": total, "host": host_name()}


def serve(lin, lout, arrival, slots, prefill_s, step_s, factor, max_prefills, eager):
    """Continuous batching, one decode step at a time: (ttft, e2e) per request and the duration.

    ``prefill_s(l_in)`` is one prompt's prefill; ``step_s(longest context, live slots)`` one
    decode step of the whole batch; ``factor`` this run's noise.
    """
    n = len(lin)
    order = sorted(range(n), key=lambda i: (arrival[i], i))
    start = min(arrival)
    first, finish = [0.0] * n, [0.0] * n
    live = {}  # request -> decode steps done
    t, q, done = start, 0, 0
    while done < n:
        horizon, k = t, 0
        while len(live) < slots and q < n and (max_prefills == 0 or k < max_prefills) \
                and arrival[order[q]] <= (t if eager else horizon):
            i = order[q]
            q, k = q + 1, k + 1
            t += (HOST_ADMIT_S + prefill_s(lin[i])) * factor
            first[i] = t
            if lout[i] == 1:
                finish[i] = t
                done += 1
            else:
                live[i] = 0
        if not live:
            if q < n and arrival[order[q]] > t:
                t = arrival[order[q]]  # idle until the next request arrives
            continue
        longest = max(lin[i] + s + 1 for i, s in live.items())
        t += step_s(longest, len(live)) * factor
        for i in list(live):
            live[i] += 1
            if live[i] == lout[i] - 1:
                finish[i] = t
                del live[i]
                done += 1
    return ([f - a for f, a in zip(first, arrival)], [f - a for f, a in zip(finish, arrival)],
            max(finish) - start)


# -- misbehaviour, for tests ---------------------------------------------------------------------
def misbehave(mode, op, reply):
    """Spoil a good reply the way ``mode`` says (the modes that do not exit early)."""
    if mode == "protocol":
        reply["protocol"] = PROTOCOL + 1
    elif mode == "error":
        return {"protocol": PROTOCOL, "error": "toy-npu: simulated device fault during %s" % op}
    elif mode == "oom":
        return {"protocol": PROTOCOL, "kind": "out_of_memory",
                "error": "toy-npu: out of device memory during %s (simulated)" % op}
    elif op == "profile" and mode == "flat":
        for r in reply["runs"]:
            r["times_s"] = [reply["runs"][0]["times_s"][0]] * len(r["times_s"])
    elif op == "profile" and mode == "outlier":
        for r in reply["runs"]:
            r["times_s"][-1] *= 5.0
    elif op == "profile" and mode in ("short", "nan", "negative", "mismatch"):
        runs = reply["runs"]
        if mode == "short":
            runs.pop()
        elif mode == "nan":
            runs[0]["times_s"][0] = float("nan")
        elif mode == "negative":
            runs[0]["times_s"][0] = -runs[0]["times_s"][0]
        elif len(runs) > 1:
            runs[0], runs[-1] = runs[-1], runs[0]
    elif op == "run_workload" and mode in ("short", "nan", "negative", "mismatch"):
        if mode == "short":
            reply["ttft_s"].pop()
        elif mode == "nan":
            reply["e2e_s"][0] = float("nan")
        elif mode == "negative":
            reply["ttft_s"][0] = -1.0
        else:
            reply["e2e_s"][0] = reply["ttft_s"][0] / 2
    return reply


def _batch_of(req):
    if not isinstance(req, dict):
        return None
    for k in ("unit", "candidate"):
        if isinstance(req.get(k), dict):
            return req[k].get("batch")
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=MODES, default=os.environ.get("TOY_NPU_MODE", "ok"),
                    help="misbehave on purpose (for tests; default: $TOY_NPU_MODE, else ok)")
    ap.add_argument("--fail-on", choices=OPS + ("any",), default="any", help="the operation --mode applies to")
    ap.add_argument("--sleep", type=float, default=60.0, help="seconds --mode slow waits before answering")
    ap.add_argument("--label", default="", help="text appended to the device description")
    ap.add_argument("--modes", default="static,continuous",
                    help="serving modes to declare in describe, comma-separated (static alone: like an older program)")
    ap.add_argument("--only-batch", type=int, help="misbehave only for units/candidates of this batch size")
    ap.add_argument("--fail-times", type=int, help="misbehave only on the first N calls (needs --count-file)")
    ap.add_argument("--count-file", help="file counting the calls --mode applied to (one byte per call)")
    ap.add_argument("--after", type=int, help="misbehave only after the first N calls (needs --count-file)")
    ap.add_argument("--straggler-every", type=float, default=50.0,
                    help="--mode straggler: one graph call in N straggles, on average (default 50)")
    ap.add_argument("--straggler-factor", type=float, default=4.0,
                    help="--mode straggler: how many times its time a straggling call takes (default 4)")
    ap.add_argument("--drift", type=float, default=float(os.environ.get("TOY_NPU_DRIFT", "1.15")),
                    help="--mode drift: how many times slower every call is (default: $TOY_NPU_DRIFT, else 1.15)")
    ap.add_argument("--drift-decode", type=float,
                    default=float(os.environ["TOY_NPU_DRIFT_DECODE"]) if os.environ.get("TOY_NPU_DRIFT_DECODE") else None,
                    help="--mode drift: how many times slower a decode step is (default: $TOY_NPU_DRIFT_DECODE, "
                         "else --drift)")
    ap.add_argument("--jitter", type=float, default=float(os.environ.get("TOY_NPU_JITTER", "0")),
                    help="a busy host in any mode: every run (a profile repeat, a static batch, a served run) "
                         "takes a fresh lognormal factor of this sigma, not reproducible (default: $TOY_NPU_JITTER, "
                         "else 0)")
    ap.add_argument("--jitter-replay", default=os.environ.get("TOY_NPU_JITTER_REPLAY") or None,
                    help="--jitter's busy host, the same every time: a call's draws are seeded by the calls "
                         "before it, counted in this file (default: $TOY_NPU_JITTER_REPLAY)")
    args = ap.parse_args(argv)
    if args.jitter < 0:
        ap.error("--jitter %r: give a sigma >= 0" % (args.jitter,))
    if args.mode not in MODES:
        ap.error("TOY_NPU_MODE=%r is not one of %s" % (args.mode, ", ".join(MODES)))

    try:
        req = json.load(sys.stdin)
    except ValueError as exc:
        print("toy-npu: stdin is not one JSON document: %s" % exc, file=sys.stderr)
        print(json.dumps({"protocol": PROTOCOL, "error": "toy-npu: the request is not JSON: %s" % exc}))
        return 1
    op = req.get("op") if isinstance(req, dict) else None
    mode = args.mode if args.fail_on in ("any", op) else "ok"
    if args.only_batch is not None and _batch_of(req) != args.only_batch:
        mode = "ok"
    if mode != "ok" and (args.fail_times is not None or args.after is not None) and args.count_file:
        calls = _count_call(args.count_file)
        if args.fail_times is not None and calls > args.fail_times:
            mode = "ok"
        if args.after is not None and calls <= args.after:
            mode = "ok"
    busy_seed = _count_call(args.jitter_replay) if args.jitter > 0 and args.jitter_replay else None
    print("toy-npu: %s (mode %s)" % (op, mode), file=sys.stderr)

    if mode == "slow":
        time.sleep(args.sleep)
    elif mode == "crash":
        for i in range(30):
            print("toy-npu: log line %d before the crash" % i, file=sys.stderr)
        sys.stderr.flush()
        raise RuntimeError("toy-npu: device lost during %s" % op)
    elif mode == "garbage":
        print("toy-npu: printing something that is not JSON", file=sys.stderr)
        print("<<< this is not JSON >>>")
        return 0
    elif mode == "silent":
        return 0

    try:
        if not isinstance(req, dict) or req.get("protocol") != PROTOCOL:
            raise ToyError("toy-npu speaks protocol %d, the request has %r"
                           % (PROTOCOL, req.get("protocol") if isinstance(req, dict) else None))
        host = Host(mode, args.straggler_every, args.straggler_factor, args.drift, args.drift_decode, args.jitter,
                    busy_seed)
        if op == "describe":
            reply = op_describe(req, args.label, args.modes.split(","))
        elif op == "profile":
            reply = op_profile(req, host)
        elif op == "run_workload":
            reply = op_run_workload(req, host)
        else:
            raise ToyError("unknown op %r: toy-npu knows %s" % (op, ", ".join(OPS)))
    except ToyError as exc:
        print("toy-npu: error: %s" % exc, file=sys.stderr)
        print(json.dumps({"protocol": PROTOCOL, "error": "toy-npu: %s" % exc}))
        return 1
    print(json.dumps(misbehave(mode, op, reply)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
