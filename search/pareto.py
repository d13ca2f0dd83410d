"""Pareto fronts and 2-D hypervolume (throughput up, latency down)."""
from __future__ import annotations

import numpy as np


def pareto_mask(throughput, latency) -> np.ndarray:
    """True for points no other point dominates (higher-or-equal throughput, lower-or-equal latency, one strictly)."""
    t = np.asarray(throughput, dtype=np.float64)
    l = np.asarray(latency, dtype=np.float64)
    n = t.size
    if n == 0:
        return np.zeros(0, bool)
    order = np.lexsort((l, -t))  # throughput desc, then latency asc
    mask = np.zeros(n, bool)
    best_lat = np.inf
    prev = None
    for i in order:
        if l[i] < best_lat:
            mask[i] = True
            best_lat = l[i]
            prev = i
        elif prev is not None and t[i] == t[prev] and l[i] == l[prev]:
            mask[i] = True  # exact ties are both on the front
    return mask


def hypervolume(throughput, latency, *, ref_latency: float, ref_throughput: float = 0.0) -> float:
    """Area dominated by the points, bounded by (ref_throughput, ref_latency)."""
    t = np.asarray(throughput, dtype=np.float64)
    l = np.asarray(latency, dtype=np.float64)
    keep = (t > ref_throughput) & (l < ref_latency)
    t, l = t[keep], l[keep]
    if t.size == 0:
        return 0.0
    m = pareto_mask(t, l)
    t, l = t[m], l[m]
    order = np.argsort(l)  # latency ascending -> throughput ascending along the front
    t, l = t[order], l[order]
    area = 0.0
    prev_t = ref_throughput
    for ti, li in zip(t, l):
        if ti > prev_t:
            area += (ti - prev_t) * (ref_latency - li)
            prev_t = ti
    return float(area)
