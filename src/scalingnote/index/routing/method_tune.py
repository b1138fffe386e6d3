"""Choose the served structure among the routed methods.

Each candidate method (:mod:`scalingnote.index.faiss.methods`: ``ivf``, ``ivf_qmetric``, ``ivf_rabitq``,
``hnsw_pq``, ``hnsw_sq``, ``ivf_pqfs``, ``scann_soar``, ``svs_vamana`` by default; ``hnsw``, ``hnsw_sq_qg``
and ``hnsw_lean`` if asked) is built over the document vectors, then its probe knob (``nprobe`` /
``ef_search``) x exact re-rank depth (TMJ §6) is swept on *validation* query vectors — queries no router
was fitted on (``ivf_qmetric`` cuts its lists with the training queries' covariance, ``hnsw_sq_qg`` adds
edges between their nearest documents, ``hnsw_lean`` fits its projection to them too; a method may come as
several configs, each built and swept: hnsw_sq_qg at 16 and 32 edges per document where
its graph has room). For each method the settings whose recall@k against exact search reaches
``target`` are timed one query at a time, and the fastest is kept. Among the methods whose
structure searched in memory is at most ``memory_bound`` of the float32 vectors (the
full-precision re-rank vectors are memory-mapped from disk, not counted; the bound holds above
``memory_bound_above`` documents only — a corpus of 100k 384-d vectors is 150 MB of floats, so below
it a faster structure is not given up for memory), the one with the lowest measured single-query
latency that met the target is chosen (methods within :data:`LATENCY_TIE` of the fastest are timed
again head to head, :mod:`~scalingnote.index.routing.head_to_head`; the share of the corpus scanned —
distance computations per query, :attr:`~scalingnote.index.routing.routing.RoutedResult.ndis` / N —
breaks ties; it is not comparable across engines: a FastScan code costs a tenth of a graph hop's
distance); when none met it, the best recall, with the reason. The report (per method: recall,
share scanned, single-query and batch latency, memory ratio, build seconds, chosen setting) goes
into the manifest's ``search_tuning``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.faiss.methods import SERVABLE, default_routing, structure_label
from scalingnote.index.routing.engines import GRAPH_ENGINES
from scalingnote.index.routing.head_to_head import ALPHA, MIN_GAIN, annotate, choose_paired, paired_latencies
from scalingnote.index.routing.routing import (
    GRAPH_METHODS,
    GUIDED_METHODS,
    QUERY_FIT_METHODS,
    RoutedIndex,
    RoutingConfig,
)
from scalingnote.index.tune import exact_topk, recall_vs_exact

DEFAULT_METHODS: tuple[str, ...] = (
    "ivf",
    "ivf_qmetric",
    "ivf_rabitq",
    "hnsw_pq",
    "hnsw_sq",
    "ivf_pqfs",
    "scann_soar",
    "svs_vamana",
)
#: validation queries searched one at a time to measure a setting's single-query latency
SINGLE_QUERIES = 200
RERANKS = (0, 50, 100, 200, 400, 800, 1600)  #: exact re-rank depths tried
EF_SEARCHES = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)  #: half-octave steps
MEMORY_BOUND = 0.25  #: the structure searched in memory <= 1/4 of the float32 vectors
MEMORY_BOUND_ABOVE = 100_000  #: ... for corpora of more documents than this; none below
#: single-query latencies timed one method after another within this share of the fastest are
#: within timing noise on a shared CPU: those contenders are timed again head to head
#: (:mod:`~scalingnote.index.routing.head_to_head`), and a difference that is not separable there
#: goes to the method listed first (the pre-declared order of ``methods``: today's IVF before the
#: newer engines), so a re-run on another machine keeps its choice
LATENCY_TIE = 0.25


def _unit(x: Any, what: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float32)
    if a.ndim != 2 or a.shape[0] == 0:
        raise ScalingNoteError(f"{what}: expected a non-empty 2-D array, got shape {a.shape}")
    return np.ascontiguousarray(a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12))


def _knob(r: RoutedIndex) -> tuple[str, list[int]]:
    if r.config.method in GRAPH_METHODS or r.config.method in GRAPH_ENGINES:
        return "ef_search", list(EF_SEARCHES)
    nlist = int(r.index.nlist)
    return "nprobe", sorted({min(nlist, 2**i) for i in range(0, 31) if 2 ** (i - 1) < nlist} | {nlist})


def single_query_ms(
    r: RoutedIndex, q: np.ndarray, k: int, setting: dict[str, int], limit: int = SINGLE_QUERIES
) -> float:
    """Mean milliseconds of one query searched alone at ``setting`` (the first ``limit`` queries,
    one call each: what a service answering one request at a time pays)."""
    rows = q[: max(1, limit)]
    r.search(rows[:1], k, **setting)  # warm: the first call allocates
    t0 = time.perf_counter()
    for i in range(len(rows)):
        r.search(rows[i : i + 1], k, **setting)
    return 1000 * (time.perf_counter() - t0) / len(rows)


def sweep(
    r: RoutedIndex, q: np.ndarray, exact: np.ndarray, *, k: int, target: float, reranks: Sequence[int] = RERANKS
) -> dict[str, Any]:
    """The fastest setting of ``r`` reaching ``target`` (else the best recall): per re-rank depth
    the knob rises until the target is met or the share scanned exceeds the best one found; each
    setting that met the target is then timed one query at a time (:func:`single_query_ms`) and
    the lowest single-query latency wins (the share scanned breaks ties)."""
    n, nq = r.ntotal, len(q)
    knob, values = _knob(r)
    grid: list[dict[str, Any]] = []
    best = float("inf")
    for rr in sorted({int(x) for x in reranks if int(x) == 0 or int(x) >= k}):
        for v in values:
            t0 = time.perf_counter()
            res = r.search(q, k, rerank=rr, **{knob: v})
            ms = 1000 * (time.perf_counter() - t0) / nq
            share = res.ndis / (nq * n)
            rec = recall_vs_exact(res.ids, exact)
            grid.append(
                {
                    knob: v,
                    "rerank": rr,
                    "recall": round(rec, 4),
                    "share_scanned": round(share, 5),
                    "latency_ms": round(ms, 4),
                    "met": rec >= target,
                }
            )
            if rec >= target:
                best = min(best, share)
                break
            if share >= best:
                break  # dearer than a setting already good enough, and not good enough itself
    ok = [g for g in grid if g["met"]]
    for g in ok or [max(grid, key=lambda g: (g["recall"], -g["share_scanned"]))]:
        g["latency_ms_single"] = round(single_query_ms(r, q, k, {knob: g[knob], "rerank": g["rerank"]}), 4)
    timed = [g for g in grid if "latency_ms_single" in g]
    pick = min(timed, key=lambda g: (g["latency_ms_single"], g["share_scanned"])) if ok else timed[0]
    return {
        "knob": knob,
        "setting": {knob: pick[knob], "rerank": pick["rerank"]},
        **{key: pick[key] for key in ("recall", "share_scanned", "latency_ms", "latency_ms_single", "met")},
        "grid": grid,
    }


def choose_method(
    docs: np.ndarray,
    val_queries: np.ndarray,
    train_queries: np.ndarray | None = None,
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    k: int = 10,
    target: float = 0.99,
    memory_bound: float = MEMORY_BOUND,
    memory_bound_above: int = MEMORY_BOUND_ABOVE,
    seed: int = 0,
    routing: Mapping[str, RoutingConfig | list[RoutingConfig]] | None = None,
    log: Any = None,
    edge_queries: np.ndarray | None = None,
) -> dict[str, Any]:
    """Build each of ``methods`` over ``docs`` (unit vectors), sweep it on ``val_queries`` and
    choose (module doc). ``train_queries`` fit ``ivf_qmetric``'s metric (never the validation
    queries); ``edge_queries`` (default ``train_queries``): the fitting queries of ``hnsw_sq_qg``'s
    edges (training + pseudo-queries); ``routing``: a config (or a list of variants) per method instead
    of :func:`default_routing`; ``memory_bound`` holds only for more than ``memory_bound_above`` documents
    (:func:`memory_bound_for`). Returns the report: ``chosen`` (method, knob value, rerank, recall, share
    scanned, ...), ``knob``, ``routing`` (the chosen method's config as a dict), ``met``, ``reason``,
    ``methods`` (rows)."""
    if not 0 < target <= 1:
        raise ScalingNoteError(f"target must be in (0, 1], got {target}")
    bad = [m for m in methods if m not in SERVABLE]
    if bad or not methods:
        raise ScalingNoteError(
            f"methods: {', '.join(bad) or 'none given'}; choose from {', '.join(SERVABLE)} (ivf_routed is not servable)"
        )
    x, q = _unit(docs, "documents"), _unit(val_queries, "validation queries")
    tq = None if train_queries is None or len(train_queries) == 0 else _unit(train_queries, "training queries")
    eq = tq if edge_queries is None or len(edge_queries) == 0 else _unit(edge_queries, "edge-fitting queries")
    n, d = x.shape
    bound = memory_bound_for(n, memory_bound, memory_bound_above)
    exact = exact_topk(x, q, k)
    rows: list[dict[str, Any]] = []
    cfgs: dict[str, Any] = {}
    kept: dict[str, RoutedIndex] = {}  # built structures still within the tie margin: timed head to head at the end
    for m in methods:
        fit = fitting_queries(m, tq, eq)
        if m in QUERY_FIT_METHODS and fit is None:
            rows.append({"method": m, "skipped": "no training queries to fit the query metric / query-guided edges on"})
            continue
        given = (routing or {}).get(m) or default_routing(m, n, d, seed=seed)
        # variants of one method (e.g. hnsw_sq_qg's edge counts)
        for cfg in list(given) if isinstance(given, (list, tuple)) else [given]:
            try:
                r = RoutedIndex.build(x, cfg, train_queries=fit)
            except ScalingNoteError as e:  # e.g. ScaNN's codes on fewer than 16 documents, an engine not installed
                rows.append({"method": m, "skipped": f"cannot be built here: {e}"})
                continue
            s = sweep(r, q, exact, k=k, target=target)
            mem = r.memory_bytes() / (n * d * 4)
            label = _structure(r)
            rows.append(
                {
                    "method": m,
                    "structure": label,
                    "build_seconds": round(r.build_s, 3),
                    "memory_ratio": round(mem, 4),
                    "within_memory": bound is None or mem <= bound,
                    **{
                        key: s[key]
                        for key in (
                            "knob",
                            "setting",
                            "recall",
                            "share_scanned",
                            "latency_ms",
                            "latency_ms_single",
                            "met",
                        )
                    },
                    "grid": s["grid"],
                }
            )
            cfgs[label] = cfg
            _keep_contenders(kept, rows, label, r)
            if log is not None:
                log(
                    f"{label}: recall@{k} {s['recall']} at {s['setting']}, "
                    f"{s['latency_ms_single']:.3f} ms a query alone, "
                    f"{100 * s['share_scanned']:.2f}% scanned, memory {mem:.3f} of float32"
                )
    _head_to_head(kept, rows, q, k, log)
    kept.clear()
    report = _decide(
        rows, cfgs, k=k, target=target, memory_bound=bound, n_val=len(q), n_train=0 if tq is None else len(tq)
    )
    report["memory_bound_above"] = int(memory_bound_above)
    if any(m in GUIDED_METHODS for m in methods) and eq is not None:
        report["edge_fit_queries"] = int(len(eq))
    return report


def eligible(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The report rows that were built, fit the memory bound and met the target, in their listed order."""
    return [r for r in rows if "skipped" not in r and r["within_memory"] and r["met"]]


def _contenders(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The :func:`eligible` rows whose single-query latency is within :data:`LATENCY_TIE` of the
    fastest of them, in their listed order."""
    ok = eligible(rows)
    return fastest_within_tie(ok)[1] if ok else []


def _keep_contenders(kept: dict[str, RoutedIndex], rows: list[dict[str, Any]], label: str, r: RoutedIndex) -> None:
    """Hold ``r`` (the structure of ``label``, the last row) while it contends; let go of the ones
    that no longer do."""
    alive = {row["structure"] for row in _contenders(rows)}
    if label in alive:
        kept[label] = r
    for gone in [key for key in kept if key not in alive]:
        del kept[gone]


def _head_to_head(kept: dict[str, RoutedIndex], rows: list[dict[str, Any]], q: np.ndarray, k: int, log: Any) -> None:
    """Time the contenders again, paired query by query (:mod:`~scalingnote.index.routing.head_to_head`),
    and write the paired latencies and p-values into their rows."""
    band = [row for row in _contenders(rows) if row["structure"] in kept]
    if len(band) < 2:
        return
    ms = paired_latencies([(kept[row["structure"]], row["setting"]) for row in band], q, k, SINGLE_QUERIES)
    annotate(band, ms)
    if log is not None:
        log(
            "timed head to head (paired, one query at a time): "
            + ", ".join(
                f"{row['structure']} {row['latency_ms_paired']:.3f} ms (p {row['paired_p']:.3g})" for row in band
            )
        )


def memory_bound_for(n: int, bound: float = MEMORY_BOUND, above: int = MEMORY_BOUND_ABOVE) -> float | None:
    """The memory bound (share of the float32 vectors) a corpus of ``n`` documents is held to:
    ``bound`` above ``above`` documents, none (``None``) at or below."""
    return float(bound) if n > above else None


def fitting_queries(method: str, train: np.ndarray | None, edge: np.ndarray | None) -> np.ndarray | None:
    """The queries ``method``'s build fits on: ``edge`` for the guided graphs' edges (hnsw_sq_qg; hnsw_lean's
    edges and projection), ``train`` for the other query-fitted methods (ivf_qmetric's metric), none for the rest."""
    if method not in QUERY_FIT_METHODS:
        return None
    return edge if method in GUIDED_METHODS else train


def _structure(r: RoutedIndex) -> str:
    return structure_label(r.index, r.config)


def _decide(
    rows: list[dict],
    cfgs: dict[str, RoutingConfig],
    *,
    k: int,
    target: float,
    memory_bound: float | None,
    n_val: int,
    n_train: int,
) -> dict[str, Any]:
    built = [r for r in rows if "skipped" not in r]
    if not built:
        raise ScalingNoteError(
            "no candidate method could be built: " + "; ".join(f"{r['method']}: {r['skipped']}" for r in rows)
        )
    fits = [r for r in built if r["within_memory"]]
    ok = eligible(built)
    where = f"recall@{k} vs exact >= {target} on {n_val} validation queries"
    within = (
        "(no memory bound at this size)" if memory_bound is None else f"within {memory_bound:g} of the float vectors"
    )
    if ok:
        best, tied = fastest_within_tie(ok)
        reason = (
            f"fastest structure with {where} {within}{_tie_words(best, tied)}: {best['structure']} "
            f"{_setting(best)} ({_latency_words(best)}, recall {best['recall']}, "
            f"{100 * best['share_scanned']:.2f}% of the corpus scanned, memory {best['memory_ratio']})"
        )
    elif not fits and any(
        r["met"] for r in built
    ):  # none fits the bound: the least memory among those that met the target
        best = min((r for r in built if r["met"]), key=lambda r: (r["memory_ratio"], r["latency_ms_single"]))
        reason = (
            f"no method fits {memory_bound:g} of the float vectors; the least memory with {where}: "
            f"{best['structure']} {_setting(best)} "
            f"(memory {best['memory_ratio']}, recall {best['recall']}, {100 * best['share_scanned']:.2f}% scanned)"
        )
    else:
        pool = fits or built
        best = max(pool, key=lambda r: (r["recall"], -r["share_scanned"]))
        if memory_bound is None:
            why = "no method reached "
        elif fits:
            why = "no method within the memory bound reached "
        else:
            why = f"no method fits {memory_bound:g} of the float vectors and none reached "
        reason = (
            f"{why}{where}; best recall: {best['structure']} {_setting(best)} (recall {best['recall']}, "
            f"{100 * best['share_scanned']:.2f}% scanned)"
        )
    chosen = {
        "method": best["method"],
        **best["setting"],
        **{
            key: best[key]
            for key in (
                "recall",
                "share_scanned",
                "latency_ms",
                "latency_ms_single",
                "latency_ms_paired",
                "memory_ratio",
                "structure",
            )
            if key in best
        },
    }
    return {
        "k": k,
        "target": target,
        "memory_bound": memory_bound,
        "n_queries": n_val,
        "queries": "validation",
        "router_fit_queries": n_train,
        "knob": best["knob"],
        "chosen": chosen,
        "met": bool(ok),
        "reason": reason,
        "routing": dataclasses.asdict(cfgs[best["structure"]]),
        "methods": rows,
    }


def fastest_within_tie(ok: list[dict], tie: float = LATENCY_TIE) -> tuple[dict, list[dict]]:
    """The chosen row among ``ok`` (rows in their pre-declared order) and the rows tied with the
    fastest. Rows timed head to head (``latency_ms_paired``): :func:`.head_to_head.choose_paired` (the
    fastest unless an earlier-listed one is not separably slower). Otherwise every row whose
    single-query latency is within ``tie`` of the fastest is tied, and the first listed of them wins (a
    difference below timing noise does not move the choice)."""
    paired = [r for r in ok if "latency_ms_paired" in r]
    if len(paired) > 1:  # the contenders were timed head to head: the paired rule decides among them
        return choose_paired(paired)
    fastest = min(r["latency_ms_single"] for r in ok)
    tied = [r for r in ok if r["latency_ms_single"] <= fastest * (1 + tie)]
    return tied[0], tied


def _tie_words(best: dict, tied: list[dict]) -> str:
    if "latency_ms_paired" in best:
        timed = "; the contenders within {:.0%} timed head to head, paired over {} queries".format(
            LATENCY_TIE, best["paired_queries"]
        )
        if len(tied) < 2:
            return timed
        rule = f"p >= {ALPHA:g} or within {MIN_GAIN:.0%}"
        return f"{timed}; not separably slower than the fastest ({rule}) and listed first of {len(tied)}"
    return f"; within {LATENCY_TIE:.0%} of it and listed first of {len(tied)} tied" if len(tied) > 1 else ""


def _latency_words(r: dict) -> str:
    paired = f", {r['latency_ms_paired']:.3f} ms head to head" if "latency_ms_paired" in r else ""
    return f"{r['latency_ms_single']:.3f} ms a query alone{paired}"


def _setting(r: dict) -> str:
    return ", ".join(f"{key}={val}" for key, val in r["setting"].items())


__all__ = [
    "DEFAULT_METHODS",
    "EF_SEARCHES",
    "MEMORY_BOUND",
    "MEMORY_BOUND_ABOVE",
    "RERANKS",
    "choose_method",
    "eligible",
    "fitting_queries",
    "memory_bound_for",
    "sweep",
]
