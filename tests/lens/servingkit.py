"""A tiny unit table shared by the serving tests: two buckets with round numbers."""
from lens.compose import UnitTable
from lens.types import BucketProfile, Candidate

# exclusive policy: bucket 8 holds lengths 1..7, bucket 16 holds 8..16
TTFT = {8: 1.0, 16: 2.0}
TBT = {8: 0.1, 16: 0.3}


#: the probes' mean row context behind each TBT (input 1, L1 = 1, L2 = 2: lens.context_cost.reference_context)
REF = 2.0


def prof(b, row_s=0.0, admit=(0.0, 0.0), kv=0.0, row_context=0.0, resume=0.0, by_idle=(), by_pass=()):
    return BucketProfile(bucket=b, ttft_s=TTFT[b], tbt_s=TBT[b], input_len=1, l1=1, l2=2, t1_s=0, t2_s=0,
                         repeats=1, spread=0, row_s=row_s, admit_first_s=admit[0], admit_next_s=admit[1],
                         kv_token_s=kv, row_context=row_context, resume_s=resume, admit_busy_s=busy(admit),
                         resume_idle=tuple(by_idle), resume_busy=tuple(by_pass))


def busy(admit):
    """A busy pass's first prompt's offset: ``admit[2]``, or the idle pass's ``admit[0]`` when not given."""
    return admit[2] if len(admit) > 2 else admit[0]


def table(batch, policy="exclusive", prefill="sequential", row_s=0.0, admit=(0.0, 0.0), kv=0.0, row_context=0.0,
          resume=0.0, by_idle=(), by_pass=()):
    """With ``prefill = "batched"`` TTFT is one call of the whole batch in the bucket; ``row_s``: the host's
    cost per live row of a step (counted in TBT for a full batch); ``admit``: a served pass's first prompt's
    and each further one's cost against TTFT, and a busy pass's first prompt's (lens.admission; the first's
    when not given); ``kv``: seconds per context token of a live row
    per step (lens.context_cost), ``row_context``: the row cost's measured row's mean context; ``resume``: what
    the first decode run after a pass costs beyond its steps (lens.resume), ``by_idle``: (idle seconds before the
    pass, that cost) pairs (empty: ``resume`` after any pass), ``by_pass``: (a pass's seconds, that cost) pairs for
    a pass by its largest prefill (lens.busy_resume; empty: a busy pass pays the shortest spell's)."""
    cand = Candidate(tp=1, batch=batch, ctx_buckets=(8, 16), tkg_buckets=(8, 16))
    profiles = {b: prof(b, row_s, admit, kv, row_context, resume, by_idle, by_pass) for b in (8, 16)}
    return UnitTable.build(cand, profiles, policy=policy, prefill=prefill)
