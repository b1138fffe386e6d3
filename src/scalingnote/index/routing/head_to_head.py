"""Tell apart structures whose single-query latencies came out close, by timing them head to head.

The index step times each method's chosen setting on its own, one method after another
(:func:`scalingnote.index.routing.method_tune.single_query_ms`); a difference of a tenth between
two such means can be the machine, not the structure. The methods whose means fall within
:data:`~scalingnote.index.routing.method_tune.LATENCY_TIE` of the fastest are therefore timed again
*paired*: the same validation query is searched alone by each of them in turn (the order rotated
query by query, so a burst of load falls on all of them alike). The fastest (lowest paired mean)
is chosen unless a method listed before it is not separably slower — a one-sided Wilcoxon
signed-rank test over the per-query differences does not reject at :data:`ALPHA`, or the paired
means differ by less than :data:`MIN_GAIN` — in which case the first listed of those wins (the
pre-declared order of the candidates: today's IVF before the newer engines).

Interleaved, each search runs after another structure's and finds the caches holding that one's
data, as a service's does after the query tower's forward pass; a loop over one structure alone
finds them warm. The two orders of measurement can disagree where two structures are close.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

ALPHA = 0.05  #: a method listed earlier keeps its place unless it is slower at this significance ...
MIN_GAIN = 0.05  #: ... and by more than this share of the fastest's paired mean latency


def paired_latencies(candidates: Sequence[tuple[Any, dict[str, int]]], q: np.ndarray, k: int, limit: int) -> np.ndarray:
    """Milliseconds ``[len(candidates), n]``: each of the first ``limit`` queries searched alone by
    every candidate (anything with ``search(q, k, **setting)``, at its setting), the candidates'
    order rotated from one query to the next; one warm call each first."""
    rows = q[: max(1, limit)]
    for idx, setting in candidates:
        idx.search(rows[:1], k, **setting)
    m = len(candidates)
    out = np.zeros((m, len(rows)), dtype=np.float64)
    for i in range(len(rows)):
        one = rows[i : i + 1]
        for j in range(m):
            c = (i + j) % m
            idx, setting = candidates[c]
            t0 = time.perf_counter_ns()
            idx.search(one, k, **setting)
            out[c, i] = (time.perf_counter_ns() - t0) / 1e6
    return out


def slower_p(slow: np.ndarray, fast: np.ndarray) -> float:
    """One-sided Wilcoxon signed-rank p that ``slow`` takes longer than ``fast`` query by query (1.0
    when every difference is zero)."""
    from scipy import stats  # lazy: scipy.stats takes ~0.5 s to import

    d = np.asarray(slow, dtype=np.float64) - np.asarray(fast, dtype=np.float64)
    if not np.any(d):
        return 1.0
    return float(stats.wilcoxon(d, alternative="greater").pvalue)


def annotate(rows: list[dict], ms: np.ndarray) -> None:
    """Write into each of ``rows`` (in the candidates' order of ``ms``) its paired mean latency, the
    number of queries paired and the p that it is slower than the fastest (``paired_p``; 1 for the
    fastest itself)."""
    means = ms.mean(axis=1)
    f = int(np.argmin(means))
    for j, row in enumerate(rows):
        row["latency_ms_paired"] = round(float(means[j]), 4)
        row["paired_queries"] = int(ms.shape[1])
        row["paired_p"] = 1.0 if j == f else float(f"{slower_p(ms[j], ms[f]):.3g}")


def choose_paired(rows: list[dict], alpha: float = ALPHA, min_gain: float = MIN_GAIN) -> tuple[dict, list[dict]]:
    """``(chosen, tied)`` among ``rows`` annotated by :func:`annotate` (in their pre-declared order):
    the fastest paired mean, unless rows listed before it are not separably slower (``paired_p`` >=
    ``alpha`` or within ``min_gain`` of it): then the first listed of those. ``tied``: the fastest and
    the rows not separable from it, in order."""
    fastest = min(rows, key=lambda r: r["latency_ms_paired"])
    bound = fastest["latency_ms_paired"] * (1 + min_gain)
    tied = [r for r in rows if r is fastest or r["paired_p"] >= alpha or r["latency_ms_paired"] <= bound]
    return tied[0], tied


__all__ = ["ALPHA", "MIN_GAIN", "annotate", "choose_paired", "paired_latencies", "slower_p"]
