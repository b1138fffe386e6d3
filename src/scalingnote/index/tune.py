"""Search settings chosen on queries, not fixed: the cheapest ``nprobe`` (IVF) or ``ef_search``
(HNSW) and exact re-rank depth (TMJ §6) whose top-``k`` agrees with exact search over the index's
own full-precision vectors on a share ``target`` of the exact top-``k`` (recall@k against exact).

ScalingNote §3.5 serves documents from a compressed index; how much of the dense model's quality
the compressed index keeps depends on the probes and the re-rank depth, and the right values
depend on the corpus size, the code size and how far the query tower's vectors sit from the
document clusters (a distilled query tower's do). A fixed ``nprobe=16`` kept 0.84 of the exact
recall@100 on SciFact's 287 lists. The tuning needs query vectors only, no relevance labels: use
validation or training queries, never test.

The chosen values become the index's ``search_defaults`` (what ``DenseIndex.search`` and
``scalingnote serve`` use when a request does not say), and the report goes into the manifest as
``search_tuning``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.faiss.faiss_utils import code_bytes_per_vector, find_ivf
from scalingnote.index.layout import MANIFEST, read_manifest
from scalingnote.utils import write_json

RERANKS = (0, 100, 200, 400, 800, 1600)  #: exact re-rank depths tried (0 = the ANN scores as they are)
EF_SEARCHES = (16, 32, 64, 128, 256, 512, 1024)
HNSW_NEIGHBOURS = 32  #: distance computations per visited HNSW node, for the cost model


def exact_topk(vectors: np.ndarray, queries: np.ndarray, k: int, chunk: int = 65_536) -> np.ndarray:
    """Indices of the ``k`` largest inner products of each query over ``vectors``, best first
    (FAISS flat search over row chunks merged in a result heap: a memory-mapped matrix is never
    loaded whole)."""
    import faiss  # why: FAISS loads with the index package's searchers, not at import of the tuner

    n = vectors.shape[0]
    k = min(k, n)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    res = faiss.ResultHeap(len(queries), k)
    for s in range(0, n, chunk):
        block = np.ascontiguousarray(vectors[s : s + chunk], dtype=np.float32)
        d, i = (
            faiss.knn(queries, block, k, metric=faiss.METRIC_INNER_PRODUCT)
            if len(block) >= k
            else _small_knn(queries, block)
        )
        res.add_result(-d, i + s)  # ResultHeap keeps the smallest: negate inner products
    res.finalize()
    return res.I


def _small_knn(q: np.ndarray, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every row of a block smaller than ``k``, best first (``faiss.knn`` needs k <= rows)."""
    sc = q @ block.T
    i = np.argsort(-sc, axis=1)
    return np.take_along_axis(sc, i, 1), i


def recall_vs_exact(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean share of each query's exact top-k among its returned top-k."""
    k = exact.shape[1]
    hits = [len(set(f[f >= 0].tolist()) & set(e.tolist())) for f, e in zip(found[:, :k], exact, strict=True)]
    return float(np.mean(hits) / k) if hits else 1.0


def _probe_grid(index: Any) -> tuple[str | None, list[int], Any]:
    """The knob to sweep (``nprobe`` / ``ef_search`` / none) and its values, cheapest first."""
    ivf = find_ivf(index.index)
    if ivf is not None:
        nlist = int(ivf.nlist)
        grid = sorted({min(nlist, 2**i) for i in range(0, 31) if 2 ** (i - 1) < nlist} | {nlist})
        return "nprobe", grid, ivf
    if index.has_hnsw:
        return "ef_search", list(EF_SEARCHES), None
    return None, [0], None


def _cost(index: Any, knob: str | None, value: int, rerank: int, ivf: Any) -> float:
    """Bytes a query touches (the model the choice minimises): the codes scanned plus the
    full-precision vectors re-scored."""
    n, dim = len(index), int(index.dim)
    code = code_bytes_per_vector(index.index) or dim * 4
    if knob == "nprobe":
        scanned = n * value / max(1, int(ivf.nlist)) + int(ivf.nlist)  # the lists' codes + the coarse centroids
    elif knob == "ef_search":
        scanned = min(n, value * HNSW_NEIGHBOURS)
    else:
        scanned = n
    return float(scanned * code + rerank * dim * 4)


def tune_search(
    index: Any, queries: np.ndarray, *, k: int = 10, target: float = 0.95, reranks: Sequence[int] = RERANKS
) -> dict[str, Any]:
    """Sweep the index's probe knob x re-rank depth on ``queries`` (vectors) and choose the
    cheapest setting whose recall@k against exact search reaches ``target``; when none does,
    the setting with the best recall. Returns the report (``chosen``, ``met``, ``grid``)."""
    q = index.query_vectors(np.asarray(queries, dtype=np.float32))
    if q.shape[0] == 0:
        raise ScalingNoteError("tune_search: no queries to tune on")
    if not 0.0 < target <= 1.0:
        raise ScalingNoteError(f"tune_search: target must be in (0, 1], got {target}")
    exact = exact_topk(index.vectors, q, k)
    knob, values, ivf = _probe_grid(index)
    grid: list[dict[str, Any]] = []
    reached: list[bool] = []
    best = float("inf")  # the cost of the cheapest setting that reached the target so far
    for rr in sorted({int(r) for r in reranks if 0 <= int(r)}):
        if 0 < rr < k:
            continue
        for v in values:  # recall rises with the probes: stop at the first value that reaches the target
            cost = _cost(index, knob, v, rr, ivf)
            if cost >= best:
                break  # dearer than a setting already good enough (the cost rises with the probes too)
            kw = {knob: v} if knob else {}
            res = index.search(q, k=k, rerank=rr, **kw)  # rerank=0: none (not the index default)
            rec = recall_vs_exact(np.asarray(res.indices), exact)
            grid.append({**kw, "rerank": rr, "recall": round(rec, 4), "cost": cost})
            reached.append(rec >= target)  # the unrounded recall decides
            if reached[-1]:
                best = min(best, cost)
                break
    ok = [g for g, r in zip(grid, reached, strict=True) if r]
    chosen = min(ok, key=lambda g: g["cost"]) if ok else max(grid, key=lambda g: (g["recall"], -g["cost"]))
    setting = ", ".join(f"{key}={chosen[key]}" for key in (knob, "rerank") if key)
    why = (
        f"cheapest setting with recall@{k} vs exact >= {target} on {q.shape[0]} queries: {setting} ({chosen['recall']})"
        if ok
        else f"no setting reached recall@{k} vs exact {target} on {q.shape[0]} queries; "
        f"best: {setting} ({chosen['recall']})"
    )
    return {
        "k": k,
        "target": target,
        "n_queries": int(q.shape[0]),
        "knob": knob,
        "chosen": chosen,
        "met": bool(ok),
        "reason": why,
        "grid": grid,
    }


def save_search_defaults(root: str | Path, report: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Write the tuned setting into the index manifest's ``search_defaults`` (atomically) and the
    report (+ ``extra``, e.g. a digest of what it was tuned on) as ``search_tuning``; returns the
    new defaults."""
    root = Path(root)
    man = read_manifest(root)
    chosen = report["chosen"]
    defaults = dict(man.get("search_defaults") or {})
    if report.get("knob"):
        defaults[report["knob"]] = int(chosen[report["knob"]])
    if chosen.get("rerank"):
        defaults["rerank"] = int(chosen["rerank"])
    else:
        defaults.pop("rerank", None)
    man["search_defaults"] = defaults
    kept = (
        "k",
        "target",
        "n_queries",
        "chosen",
        "met",
        "reason",
        "knob",
        "memory_bound",
        "queries",
        "router_fit_queries",
        "routing",
        "methods",
    )
    man["search_tuning"] = {
        **{key: report[key] for key in kept if key in report},
        **extra,
    }  # the method choice's comparison too
    write_json(root / MANIFEST, man)
    return defaults


__all__ = ["exact_topk", "recall_vs_exact", "save_search_defaults", "tune_search"]
