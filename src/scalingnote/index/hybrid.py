"""Hybrid lexical + dense retrieval: fuse a BM25 run with a dense run.

Two fusions, both over the top ``depth`` documents of each side:

* **RRF** (reciprocal rank fusion, Cormack, Clarke & Büttcher, SIGIR 2009):
  ``score(d) = sum over systems of 1 / (k + rank(d))`` with 1-based ranks and ``k = 60``;
  a document missing from a system's list contributes nothing for it. Needs no tuning.
* **Weighted normalised scores**: each side's scores of a query are normalised (min-max to
  [0, 1], or z-score), then ``score(d) = w * dense(d) + (1 - w) * bm25(d)``. A document
  missing from the dense list gets its lowest normalised score of the query (it ranked below
  everything listed); the BM25 side is normalised over every candidate of both lists, one that
  BM25 did not list at 0 (BM25's lower bound: a document matching no query term) — so one exact lexical match
  keeps its credit (``LEXICAL_FLOOR``). The weight ``w`` is chosen on validation queries
  (:func:`choose_weight`), never on the queries reported.

:class:`HybridSearcher` puts a :class:`~scalingnote.index.faiss.dense.DenseIndex` and a
:class:`~scalingnote.sparse.bm25.BM25Retriever` over the same documents behind one
``search(texts, k, mode=...)`` with ``mode`` in ``dense`` / ``bm25`` / ``hybrid``; the BM25
index lives beside the dense index (:func:`scalingnote.sparse.bm25.open_or_build_bm25`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from scalingnote.data import write_run
from scalingnote.data.corpus import find_corpus
from scalingnote.data.types import Qrels, Run
from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.evaluation import evaluate
from scalingnote.index.docstore import index_corpus
from scalingnote.index.pipeline import open_dense, write_run_meta
from scalingnote.index.searcher import SearcherBase, SearchResult
from scalingnote.sparse.bm25 import open_or_build_bm25

Mode = Literal["dense", "bm25", "hybrid"]
FusionMethod = Literal["rrf", "weighted"]
Norm = Literal["minmax", "zscore"]

MODES = ("dense", "bm25", "hybrid")
DEFAULT_RRF_K = 60
DEFAULT_DEPTH = 100


@dataclass
class FusionConfig:
    """How ``hybrid`` combines the two sides.

    ``method``: ``rrf`` or ``weighted``; ``rrf_k``: the RRF constant (60, the paper's value);
    ``weight``: weight of the dense side in weighted fusion (BM25 gets ``1 - weight``);
    ``norm``: ``minmax`` or ``zscore`` normalisation for weighted fusion; ``depth``: candidates
    taken from each side before fusing (at least the ``k`` asked for)."""

    method: FusionMethod = "rrf"
    rrf_k: int = DEFAULT_RRF_K
    weight: float = 0.5
    norm: Norm = "minmax"
    depth: int = DEFAULT_DEPTH

    def __post_init__(self) -> None:
        if self.method not in ("rrf", "weighted"):
            raise ScalingNoteError(f"fusion: method must be rrf or weighted, got {self.method!r}")
        if self.norm not in ("minmax", "zscore"):
            raise ScalingNoteError(f"fusion: norm must be minmax or zscore, got {self.norm!r}")
        if isinstance(self.rrf_k, bool) or not isinstance(self.rrf_k, (int, float)) or self.rrf_k < 0:
            raise ScalingNoteError(f"fusion: rrf_k must be a number >= 0, got {self.rrf_k!r}")
        if (
            isinstance(self.weight, bool)
            or not isinstance(self.weight, (int, float))
            or not 0.0 <= float(self.weight) <= 1.0
        ):
            raise ScalingNoteError(f"fusion: weight must be in [0, 1], got {self.weight!r}")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise ScalingNoteError(f"fusion: depth must be an integer >= 1, got {self.depth!r}")


FUSION_FILE = "fusion.json"


def load_fusion(index_dir: str | Path) -> tuple[FusionConfig, str]:
    """The fusion settings and the default search mode recorded beside an index
    (``fusion.json``, written by the quick start from its validation choice); the defaults
    (RRF, mode ``dense``) when there is none."""
    f = Path(index_dir) / FUSION_FILE
    if not f.exists():
        return FusionConfig(), "dense"
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f, None, None, f"not a JSON object: {e}") from None
    mode = doc.get("default_mode", "dense")
    if mode not in ("dense", "bm25", "hybrid"):
        raise ConfigError(f, None, "default_mode", f"must be dense, bm25 or hybrid, got {mode!r}")
    keys = ("method", "rrf_k", "weight", "norm", "depth")
    try:
        return FusionConfig(**{k: doc[k] for k in keys if k in doc}), mode
    except ScalingNoteError as e:
        raise ConfigError(f, None, None, str(e)) from None


def served_fusion(index_dir: str | Path | None, **override: Any) -> tuple[FusionConfig, str]:
    """The fusion and default mode an index is served with (its ``fusion.json``, as ``scalingnote
    serve`` reads it; RRF and ``dense`` without one); each setting in ``override`` that is not None
    (``method``, ``rrf_k``, ``weight``, ``norm``, ``depth``) replaces the file's. ``scalingnote
    search``, ``serve`` and the quick start's served row share this one default."""
    base, mode = load_fusion(index_dir) if index_dir is not None else (FusionConfig(), "dense")
    given = {k: v for k, v in override.items() if v is not None}
    unknown = sorted(set(given) - {"method", "rrf_k", "weight", "norm", "depth"})
    if unknown:
        raise ScalingNoteError(f"fusion: unknown setting(s) {unknown}")
    return (replace(base, **given) if given else base), mode


# --------------------------------------------------------------------------- per-query fusion


def _ranked(scores: Mapping[str, float], depth: int | None) -> list[tuple[str, float]]:
    """Documents by descending score (ties by id, as trec_eval does), cut at ``depth``."""
    items = sorted(scores.items(), key=lambda x: (-x[1], x[0]))
    return items[:depth] if depth is not None else items


def rrf_scores(
    lists: Sequence[Mapping[str, float]], k: float = DEFAULT_RRF_K, depth: int | None = None
) -> dict[str, float]:
    """Reciprocal rank fusion of one query's result lists: ``sum 1 / (k + rank)`` (ranks from 1)."""
    out: dict[str, float] = {}
    for scores in lists:
        for rank, (doc, _) in enumerate(_ranked(scores, depth), start=1):
            out[doc] = out.get(doc, 0.0) + 1.0 / (k + rank)
    return out


def normalize_scores(scores: Mapping[str, float], norm: Norm = "minmax") -> dict[str, float]:
    """Min-max (to [0, 1]; all equal -> 1) or z-score (all equal -> 0) normalisation of one list."""
    if not scores:
        return {}
    v = np.fromiter(scores.values(), dtype=np.float64, count=len(scores))
    if norm == "minmax":
        lo, hi = float(v.min()), float(v.max())
        z = (v - lo) / (hi - lo) if hi > lo else np.ones_like(v)
    elif norm == "zscore":
        sd = float(v.std())
        z = (v - float(v.mean())) / sd if sd > 0 else np.zeros_like(v)
    else:
        raise ScalingNoteError(f"norm must be minmax or zscore, got {norm!r}")
    return dict(zip(scores.keys(), z.tolist(), strict=True))


#: BM25 scores are >= 0 and a document that matches no query term scores exactly 0: the score a
#: candidate BM25 did not list is given on the lexical side.
LEXICAL_FLOOR = 0.0


def weighted_scores(
    dense: Mapping[str, float],
    lexical: Mapping[str, float],
    weight: float,
    norm: Norm = "minmax",
    depth: int | None = None,
    lexical_floor: float = LEXICAL_FLOOR,
) -> dict[str, float]:
    """``weight * norm(dense) + (1 - weight) * norm(bm25)`` over the candidates (the union of both
    top-``depth`` lists). A candidate missing from the dense list gets that list's lowest normalised
    score (its cosine is unknown, below everything listed). The BM25 side is normalised over every
    candidate, one that BM25 did not list at ``lexical_floor`` (0, BM25's lower bound: exact when the
    list holds every matching document, an underestimate when it was cut at ``depth``), so a
    lexical match keeps its credit whatever the list looks like: with one hit, or equal scores,
    normalising the BM25 list alone would give its documents the same value as every missing one
    (z-score of one score is 0) and an exact match would get no lexical credit."""
    d = normalize_scores(dict(_ranked(dense, depth)), norm)
    listed = dict(_ranked(lexical, depth))
    pool = d.keys() | listed.keys()
    b = normalize_scores({doc: listed.get(doc, lexical_floor) for doc in sorted(pool)}, norm)
    d_floor = min(d.values()) if d else 0.0
    w = float(weight)
    return {doc: w * d.get(doc, d_floor) + (1.0 - w) * b[doc] for doc in pool}


def fuse_scores(dense: Mapping[str, float], lexical: Mapping[str, float], config: FusionConfig) -> dict[str, float]:
    """One query's fused scores under ``config``."""
    if config.method == "rrf":
        return rrf_scores([dense, lexical], config.rrf_k, config.depth)
    return weighted_scores(dense, lexical, config.weight, config.norm, config.depth)


def _top(scores: Mapping[str, float], k: int | None) -> dict[str, float]:
    return dict(_ranked(scores, k))


def fuse_runs(dense_run: Run, bm25_run: Run, config: FusionConfig | None = None, k: int | None = None) -> Run:
    """Fuse two runs query by query (every query of either run), keeping the top ``k`` (default: all)."""
    config = config or FusionConfig()
    return {
        q: _top(fuse_scores(dense_run.get(q, {}), bm25_run.get(q, {}), config), k)
        for q in dense_run.keys() | bm25_run.keys()
    }


# --------------------------------------------------------------------------- weight selection


@dataclass
class WeightChoice:
    """The weight picked on validation queries and the metric at every weight tried."""

    weight: float
    norm: Norm
    metric: str
    value: float
    n_queries: int
    grid: dict[float, float] = field(default_factory=dict)


def choose_weight(
    dense_run: Run,
    bm25_run: Run,
    qrels: Qrels,
    *,
    norm: Norm = "minmax",
    grid: Sequence[float] | None = None,
    metric: str = "ndcg@10",
    depth: int = DEFAULT_DEPTH,
) -> WeightChoice:
    """Grid-search the dense weight of weighted fusion on **validation** queries (the runs and
    ``qrels`` given; pass queries that are not the ones reported). Ties go to the weight
    closest to 0.5, then the smaller one."""
    qids = [q for q in qrels if q in dense_run or q in bm25_run]
    if not qids:
        raise ScalingNoteError("choose_weight: no validation query of the qrels is in either run")
    grid = [round(float(w), 6) for w in (grid if grid is not None else np.linspace(0.0, 1.0, 21))]
    if any(not 0.0 <= w <= 1.0 for w in grid) or not grid:
        raise ScalingNoteError(f"choose_weight: grid weights must be in [0, 1], got {grid}")
    sub_q = {q: qrels[q] for q in qids}
    d_sub = {q: dense_run.get(q, {}) for q in qids}
    b_sub = {q: bm25_run.get(q, {}) for q in qids}
    values: dict[float, float] = {}
    for w in grid:
        run = fuse_runs(d_sub, b_sub, FusionConfig(method="weighted", weight=w, norm=norm, depth=depth))
        values[w] = float(evaluate(run, sub_q, [metric], missing="zero")[metric])
    best = max(values, key=lambda w: (round(values[w], 10), -abs(w - 0.5), -w))
    return WeightChoice(best, norm, metric, values[best], len(qids), values)


# --------------------------------------------------------------------------- convenience API


def choose_norm_and_weight(
    dense_run: Run,
    bm25_run: Run,
    qrels: Qrels,
    *,
    norms: Sequence[Norm] = ("minmax", "zscore"),
    depth: int = DEFAULT_DEPTH,
) -> tuple[WeightChoice, dict[str, WeightChoice]]:
    """:func:`choose_weight` under each score normalisation in ``norms``; returns the best choice
    (ties go to the earlier norm) and every norm's choice."""
    choices: dict[str, WeightChoice] = {
        n: choose_weight(dense_run, bm25_run, qrels, norm=n, depth=depth) for n in norms
    }
    best = max(norms, key=lambda n: (round(choices[n].value, 10), -list(norms).index(n)))
    return choices[best], choices


def hybrid_search_run(
    dense_run: Run,
    bm25_run: Run,
    fusion: FusionMethod = "rrf",
    *,
    k: int = 100,
    rrf_k: int = DEFAULT_RRF_K,
    weight: float | None = None,
    norm: Norm = "minmax",
    depth: int | None = None,
    validation: tuple[Run, Run, Qrels] | None = None,
) -> tuple[Run, dict[str, Any]]:
    """Fuse a dense and a BM25 run over the same queries into a hybrid run (top ``k``).

    ``fusion="rrf"`` needs nothing else. ``fusion="weighted"`` needs ``weight`` or
    ``validation=(dense_run_val, bm25_run_val, qrels_val)`` on validation queries (never the
    reported ones), from which :func:`choose_weight` picks it. Returns ``(run, info)`` where
    ``info`` records the fusion settings (and the chosen weight)."""
    depth = depth if depth is not None else max(k, DEFAULT_DEPTH)
    info: dict[str, Any] = {"fusion": fusion, "depth": depth}
    if fusion == "rrf":
        cfg = FusionConfig(method="rrf", rrf_k=rrf_k, depth=depth)
        info["rrf_k"] = rrf_k
    elif fusion == "weighted":
        if weight is None:
            if validation is None:
                raise ScalingNoteError(
                    "weighted fusion needs weight= or validation=(dense_run, bm25_run, qrels) on validation queries"
                )
            choice = choose_weight(*validation, norm=norm, depth=depth)
            weight = choice.weight
            info.update(
                {
                    "weight_chosen_on": f"{choice.n_queries} validation queries",
                    f"validation_{choice.metric}": round(choice.value, 4),
                }
            )
        cfg = FusionConfig(method="weighted", weight=float(weight), norm=norm, depth=depth)
        info.update({"weight": float(weight), "norm": norm})
    else:
        raise ScalingNoteError(f"fusion must be rrf or weighted, got {fusion!r}")
    return fuse_runs(dense_run, bm25_run, cfg, k=k), info


# --------------------------------------------------------------------------- searcher


class HybridSearcher(SearcherBase):
    """Dense index + BM25 over the same documents, searched by ``mode``.

    ``search`` returns a :class:`~scalingnote.index.searcher.SearchResult` whose rows carry the
    document ids, scores (cosine for ``dense``, BM25 for ``bm25``, fused for ``hybrid``),
    semantic IDs, titles and snippets (from the dense index's document store);
    ``search_run(query_ids, texts, k, mode=...)`` is the shared batched run of every searcher.
    """

    def __init__(self, dense, bm25=None, fusion: FusionConfig | None = None):
        self.dense = dense
        self.bm25 = bm25
        self.fusion = fusion or FusionConfig()
        self._row = {d: i for i, d in enumerate(dense.doc_ids)}
        if bm25 is not None:
            unknown = [d for d in bm25.doc_ids if d not in self._row]
            if unknown:
                raise ScalingNoteError(
                    f"BM25 index and dense index cover different documents: {len(unknown)} BM25 document(s) "
                    f"(e.g. {unknown[0]!r}) are not in the dense index; rebuild the BM25 index from the indexed corpus"
                )

    @property
    def doc_ids(self) -> list[str]:
        return self.dense.doc_ids

    def __len__(self) -> int:
        return len(self.dense)

    @property
    def modes(self) -> tuple[str, ...]:
        return MODES if self.bm25 is not None else ("dense",)

    def check_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ScalingNoteError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode != "dense" and self.bm25 is None:
            raise ScalingNoteError(
                f"mode {mode!r} needs a BM25 index beside the dense index: build it with "
                "`scalingnote index bm25 --index DIR --data CORPUS` (or give the corpus to serve/search)"
            )

    def search(
        self,
        texts: Sequence[str],
        k: int = 10,
        *,
        mode: Mode = "dense",
        query_vectors: np.ndarray | None = None,
        fusion: FusionConfig | None = None,
        **dense_kw: Any,
    ):
        """Top-``k`` per text. ``query_vectors``: precomputed query embeddings (else the dense
        index's query tower encodes ``texts``); ``dense_kw``: nprobe / ef_search / rerank."""
        self.check_mode(mode)
        if k < 1:
            raise ScalingNoteError(f"k must be >= 1, got {k}")
        texts = list(texts)
        if mode == "dense":
            res = self.dense.search(query_vectors if query_vectors is not None else texts, k, **dense_kw)
            return self.dense.attach_documents(res)
        fusion = fusion or self.fusion
        depth = max(k, fusion.depth)
        fusion = replace(fusion, depth=depth)  # each side's list is cut at the depth fetched, so k > depth gets k hits
        lex = self.bm25.search(
            {str(i): t for i, t in enumerate(texts)}, k=depth if mode == "hybrid" else k, show_progress=False
        )
        runs: list[dict[str, float]]
        if mode == "bm25":
            runs = [_top(lex[str(i)], k) for i in range(len(texts))]
        else:
            dres = self.dense.search(query_vectors if query_vectors is not None else texts, depth, **dense_kw)
            runs = []
            for i in range(len(texts)):
                dense_scores = {d: float(s) for d, s in zip(dres.doc_ids[i], dres.scores[i], strict=False)}
                runs.append(_top(fuse_scores(dense_scores, lex[str(i)], fusion), k))
        sem = self.dense.semantic_ids
        return self.dense.attach_documents(
            SearchResult.from_runs(runs, k, self._row, None if sem is None else np.asarray(sem))
        )


# --------------------------------------------------------------------------- open / run files


def _index_corpus(dense) -> str | None:
    """The corpus an index's documents came from (document store source, or the embeddings' corpus)."""
    p = index_corpus(dense.manifest)
    return str(p) if p else None


def open_hybrid(
    index_dir: str | Path,
    query_tower: Any = None,
    *,
    corpus: str | Path | None = None,
    fusion: FusionConfig | None = None,
    bm25_config=None,
    bm25: bool = True,
    progress: bool = True,
    dense: Any = None,
) -> HybridSearcher:
    """Open a dense index (with ``query_tower``: a tower, a name/path, or None for vectors /
    bm25 only; or ``dense``, a searcher already open over ``index_dir``, e.g. from
    :func:`scalingnote.index.backends.open_searcher`) and, with ``bm25=True``, the BM25 index
    beside it: built once from ``corpus`` (default: the corpus the index records) and reused
    while its fingerprint (documents + settings) matches; with no corpus known, the saved one
    (or none)."""
    if dense is None:
        dense = open_dense(index_dir, query_tower)
    if not bm25:
        return HybridSearcher(dense, None, fusion)
    src = corpus if corpus is not None else _index_corpus(dense)
    if src is None:
        lexical = open_or_build_bm25(index_dir)
    else:
        found = find_corpus(src)  # any registered format; a clear error naming the path when there is none
        p = found.path
        wanted = set(dense.doc_ids)
        docs = [d for d in found.read() if d.id in wanted]
        if not docs:
            raise ScalingNoteError(f"{p}: no document of the corpus is in the index {index_dir}")
        lexical = open_or_build_bm25(index_dir, docs, bm25_config, show_progress=progress)
    return HybridSearcher(dense, lexical, fusion)


def hybrid_queries_to_run(
    searcher: HybridSearcher,
    queries: Sequence[Any],
    out: str | Path,
    *,
    mode: Mode = "hybrid",
    k: int = 100,
    batch_size: int = 256,
    config: dict[str, Any] | None = None,
    **dense_kw: Any,
) -> dict[str, Any]:
    """Search ``queries`` (:class:`~scalingnote.data.types.Query`) in ``mode``; write the TREC run
    ``out`` and ``<out>.meta.json`` (config, versions, fusion, timings). Returns the metadata."""
    if not queries:
        raise ScalingNoteError("no queries to search")
    searcher.check_mode(mode)
    t0 = time.perf_counter()
    run = searcher.search_run(
        [q.id for q in queries], [q.text for q in queries], k, batch_size=batch_size, mode=mode, **dense_kw
    )
    secs = time.perf_counter() - t0
    write_run(out, run, tag=f"scalingnote-{mode}", k=k)
    cfg = dict(config or {})
    cfg.update(
        {"mode": mode, "k": k, "n_queries": len(queries), **{key: v for key, v in dense_kw.items() if v is not None}}
    )
    if mode == "hybrid":
        cfg["fusion"] = asdict(searcher.fusion)
    bm25 = (
        {"bm25": {"language": searcher.bm25.language, "fingerprint": searcher.bm25.fingerprint}}
        if searcher.bm25 is not None
        else {}
    )
    return write_run_meta(out, cfg, searcher.dense.manifest, len(queries), secs, extra=bm25)


__all__ = [
    "DEFAULT_RRF_K",
    "choose_norm_and_weight",
    "FusionConfig",
    "HybridSearcher",
    "MODES",
    "WeightChoice",
    "choose_weight",
    "fuse_runs",
    "served_fusion",
    "fuse_scores",
    "hybrid_queries_to_run",
    "hybrid_search_run",
    "open_hybrid",
    "normalize_scores",
    "rrf_scores",
    "weighted_scores",
]
