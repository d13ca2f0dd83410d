"""A tiny unit table shared by the serving tests: two buckets with round numbers."""
from lens.compose import UnitTable
from lens.types import BucketProfile, Candidate

# exclusive policy: bucket 8 holds lengths 1..7, bucket 16 holds 8..16
TTFT = {8: 1.0, 16: 2.0}
TBT = {8: 0.1, 16: 0.3}


def prof(b):
    return BucketProfile(bucket=b, ttft_s=TTFT[b], tbt_s=TBT[b], input_len=1, l1=1, l2=2, t1_s=0, t2_s=0,
                         repeats=1, spread=0)


def table(batch, policy="exclusive", prefill="sequential"):
    """With ``prefill = "batched"`` TTFT is one call of the whole batch in the bucket."""
    cand = Candidate(tp=1, batch=batch, ctx_buckets=(8, 16), tkg_buckets=(8, 16))
    return UnitTable.build(cand, {8: prof(8), 16: prof(16)}, policy=policy, prefill=prefill)
