"""The evaluator's feasibility rules on hand-made candidates (no profiles needed)."""
from pathlib import Path

import numpy as np

from lens.types import Candidate, ModelShape, Requests, Target
from search.evaluate import Evaluator
from search.prior import memory_gib
from spaces import Hosts, SearchSpace, Space

M = ModelShape(layers=8, hidden=1024, heads=16, kv_heads=8, intermediate=4096, vocab=32000)


def space(memory_gib_per_chip: float) -> Space:
    target = Target(name="t", runner="sim", hardware="inf2", bucket_policy="exclusive", dtype="bfloat16", model=M)
    return Space(path=Path("s.toml"), sha256="", target=target,
                 search=SearchSpace(tp=(1,), batch=(8,), buckets=(256, 4096), tie_buckets=False),
                 hosts=Hosts(memory_gib_per_chip=memory_gib_per_chip))


def test_memory_pruning_counts_the_context_encoding_buckets():
    """A context bucket longer than every token-generation bucket fills the KV cache too."""
    short = memory_gib(M, "bfloat16", tp=1, batch=8, max_len=256)
    long = memory_gib(M, "bfloat16", tp=1, batch=8, max_len=4096)
    sp = space((short + long) / 2)  # room for 256-token rows, not for 4096
    ev = Evaluator(sp, Requests(np.asarray([10]), np.asarray([5])))
    wide_ctx = Candidate(1, 8, ctx_buckets=(256, 4096), tkg_buckets=(256,))
    wide_tkg = Candidate(1, 8, ctx_buckets=(256,), tkg_buckets=(256, 4096))
    narrow = Candidate(1, 8, ctx_buckets=(256,), tkg_buckets=(256,))
    for c in (wide_ctx, wide_tkg):
        why = ev.infeasible_reason(c)
        assert why is not None and "GiB per chip" in why, (c, why)
    assert ev.infeasible_reason(narrow) is None
