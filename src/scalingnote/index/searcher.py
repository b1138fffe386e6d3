"""One search interface for every retrieval back end.

:class:`Searcher` is the protocol: ``search(queries, k, **kw) -> SearchResult`` over a batch
of queries, and ``search_run(query_ids, queries, k, ...) -> Run`` that batches ``search`` and
collects a TREC-style run. :class:`SearcherBase` implements ``search_run`` once (progress bar,
batching); the back ends only implement ``search``:

* :class:`~scalingnote.index.DenseIndex` — FAISS, on disk;
* :class:`~scalingnote.index.milvus.milvus.MilvusSearcher` — a Milvus collection;
* :class:`BM25Searcher` — the BM25 retriever of :mod:`scalingnote.sparse` behind the same
  interface (query texts only);
* :class:`~scalingnote.index.hybrid.HybridSearcher` — dense + BM25 fused (``mode=``).

The vector back ends are opened by name through :mod:`scalingnote.index.backends` (the table
the CLI and the service ask); their capability flags (:class:`SearcherBase`) say what a
request may ask of them.

The two vector back ends share :class:`VectorSearcher`, which turns query texts (through the
query tower) or precomputed vectors into unit vectors of the index dimension.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from tqdm.auto import tqdm

from scalingnote.data.types import Run
from scalingnote.errors import ScalingNoteError
from scalingnote.index.embeddings import l2_normalize


@dataclass
class SearchResult:
    """Results for a batch of queries. Unpacks as ``scores, doc_ids, semantic_ids = result``.

    ``scores``: float32 (nq, k), descending per row, ``-inf`` where fewer than ``k`` hits.
    ``doc_ids``: per query, the ids of the hits (length <= k).
    ``semantic_ids``: int32 (nq, k, L) semantic IDs of the hits (``-1`` padding), or None
    when the index has none. ``indices``: int64 (nq, k) row numbers of the hits in the back
    end (``-1`` padding). ``titles`` / ``snippets``: per query, the title and a text snippet
    of each hit (aligned with ``doc_ids``), or None when the index stores no documents.
    """

    scores: np.ndarray
    doc_ids: list[list[str]]
    semantic_ids: np.ndarray | None
    indices: np.ndarray
    titles: list[list[str]] | None = None
    snippets: list[list[str]] | None = None

    def __iter__(self):
        return iter((self.scores, self.doc_ids, self.semantic_ids))

    def to_run(self, query_ids: Sequence[str]) -> Run:
        """``{query_id: {doc_id: score}}`` for :func:`scalingnote.data.write_run` / evaluation."""
        if len(query_ids) != len(self.doc_ids):
            raise ScalingNoteError(f"{len(query_ids)} query ids for {len(self.doc_ids)} result rows")
        return {
            qid: {d: float(s) for d, s in zip(docs, row, strict=False)}
            for qid, docs, row in zip(query_ids, self.doc_ids, self.scores, strict=True)
        }

    @classmethod
    def from_runs(
        cls, runs: Sequence[dict[str, float]], k: int, row_of: dict[str, int], semantic_ids: np.ndarray | None = None
    ) -> SearchResult:
        """Rows from per-query ``{doc_id: score}`` dicts (already in rank order, at most ``k``);
        ``row_of`` maps a document id to its row (``indices``); ``semantic_ids`` (n_docs, L)
        fills the hits' semantic IDs."""
        nq = len(runs)
        scores = np.full((nq, k), -np.inf, dtype=np.float32)
        idx = np.full((nq, k), -1, dtype=np.int64)
        doc_ids: list[list[str]] = []
        for i, run in enumerate(runs):
            ids = list(run)
            doc_ids.append(ids)
            scores[i, : len(ids)] = [run[d] for d in ids]
            idx[i, : len(ids)] = [row_of[d] for d in ids]
        sem = None
        if semantic_ids is not None:
            sem = np.full((nq, k, semantic_ids.shape[1]), -1, dtype=np.int32)
            valid = idx >= 0
            if valid.any():
                sem[valid] = gather_rows(semantic_ids, idx[valid])
        return cls(scores, doc_ids, sem, idx)


@runtime_checkable
class Searcher(Protocol):
    """What serving, evaluation and the benchmarks need of a retrieval back end."""

    doc_ids: Sequence[str]

    def __len__(self) -> int: ...

    def search(self, queries: Any, k: int = 10, **kw: Any) -> SearchResult: ...

    def search_run(
        self,
        query_ids: Sequence[str],
        queries: Any,
        k: int = 100,
        batch_size: int = 256,
        progress: bool = False,
        **kw: Any,
    ) -> Run: ...


#: the search options a request may set -> (the capability flag of :class:`SearcherBase` that
#: declares it, what a back end without it lacks)
SEARCH_OPTIONS: dict[str, tuple[str, str]] = {
    "nprobe": ("has_ivf", "has no IVF layer"),
    "ef_search": ("has_hnsw", "has no HNSW graph"),
    "rerank": ("supports_rerank", "does not re-rank candidates"),
}


def _describe(searcher: Any) -> str:
    """The searcher's index as messages name it: its factory string, else its class name."""
    try:
        return str(searcher.factory)
    except (AttributeError, KeyError):
        return type(searcher).__name__


def search_options(searcher: Any, backend: str | None = None, **requested: Any) -> dict[str, Any]:
    """The keyword arguments of ``searcher.search`` for the search options ``requested``
    (``nprobe`` / ``ef_search`` / ``rerank``): those set (not None), each declared by the
    searcher's capability flag (:data:`SEARCH_OPTIONS`). An option set that the searcher does
    not declare is a :class:`ScalingNoteError` naming the option, the index and the back end
    (``backend``, else the searcher's class); an unknown option name is one too."""
    out: dict[str, Any] = {}
    for name, value in requested.items():
        if name not in SEARCH_OPTIONS:
            raise ScalingNoteError(f"{name}: not a search option (search options: {', '.join(SEARCH_OPTIONS)})")
        if value is None:
            continue
        flag, lacks = SEARCH_OPTIONS[name]
        if not getattr(searcher, flag, False):
            raise ScalingNoteError(
                f"{name}: index {_describe(searcher)!r} {lacks} (back end {backend or type(searcher).__name__})"
            )
        out[name] = value
    return out


def search_run(
    searcher: Any,
    query_ids: Sequence[str],
    queries: Any,
    k: int = 100,
    batch_size: int = 256,
    progress: bool = False,
    **kw: Any,
) -> Run:
    """Search ``queries`` (texts or vectors, aligned with ``query_ids``) in batches of
    ``batch_size`` with ``searcher.search(batch, k, **kw)``; a TREC-style run ``{qid: {doc_id: score}}``.
    A search option of :data:`SEARCH_OPTIONS` left None is not passed (a back end receives only
    the options set)."""
    kw = {name: v for name, v in kw.items() if not (name in SEARCH_OPTIONS and v is None)}
    if batch_size < 1:
        raise ScalingNoteError(f"batch_size must be >= 1, got {batch_size}")
    run: Run = {}
    qids = list(query_ids)
    n = len(qids)
    with tqdm(total=n, unit="q", desc="search", disable=not progress, dynamic_ncols=True) as bar:
        for s in range(0, n, batch_size):
            res = searcher.search(queries[s : s + batch_size], k, **kw)
            run.update(res.to_run(qids[s : s + batch_size]))
            bar.update(min(batch_size, n - s))
    return run


class SearcherBase:
    """Gives a back end that implements ``search`` the shared :meth:`search_run`, and says what
    it can do: the capability flags below are what the service (and the CLI) ask of a back end
    (class defaults: nothing beyond ``search(queries, k)``; a searcher whose answer depends on
    the opened index overrides a flag with a property)."""

    #: ``rerank=N`` (re-score N candidates exactly with full-precision vectors) applies
    supports_rerank: bool = False
    #: ``upsert(docs)`` adds or replaces documents while it serves (``POST /documents``)
    supports_upsert: bool = False
    #: ``delete(ids)`` removes documents while it serves (``DELETE /documents/{id}``)
    supports_delete: bool = False

    @property
    def has_ivf(self) -> bool:
        """``nprobe=`` (IVF lists probed) applies: the index has an IVF layer."""
        return False

    @property
    def has_hnsw(self) -> bool:
        """``ef_search=`` (HNSW beam width) applies: the index has an HNSW graph."""
        return False

    @property
    def local_dir(self) -> Path | None:
        """The scalingnote index directory it reads (a BM25 index and ``fusion.json`` beside it give
        the service its bm25 / hybrid modes), or None."""
        return None

    def attach_documents(self, res: SearchResult) -> SearchResult:
        """Fill ``res.titles`` / ``res.snippets`` where the back end stores documents (here: none)."""
        return res

    def search(
        self,
        queries: Any,
        /,
        k: int = 10,
        *,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rerank: int | None = None,
    ) -> SearchResult:  # pragma: no cover - abstract
        """Top-``k`` documents per query; the search options (:data:`SEARCH_OPTIONS`) a back end
        declares by its capability flags are passed only when set."""
        raise NotImplementedError

    def search_run(
        self,
        query_ids: Sequence[str],
        queries: Any,
        k: int = 100,
        batch_size: int = 256,
        progress: bool = False,
        **kw: Any,
    ) -> Run:
        """Search in batches and return a TREC-style run ``{qid: {doc_id: score}}``."""
        return search_run(self, query_ids, queries, k=k, batch_size=batch_size, progress=progress, **kw)


def encode_queries_quietly(tower: Any, texts: list[str]) -> np.ndarray:
    """``tower.encode_queries(texts)``, without its progress bar where it has one."""
    try:
        quiet = "show_progress" in inspect.signature(tower.encode_queries).parameters
    except (TypeError, ValueError):
        quiet = False
    return tower.encode_queries(texts, show_progress=False) if quiet else tower.encode_queries(texts)


def gather_rows(arr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``arr[idx]`` reading each distinct row once, in sorted order (sequential memory-map reads)."""
    uniq, inv = np.unique(idx, return_inverse=True)
    return np.asarray(arr[uniq])[inv.reshape(-1)]


Queries = np.ndarray | str | Sequence[str]  # query texts (encoded by the query tower) or vectors


class VectorSearcher(SearcherBase):
    """A dense back end: needs ``manifest`` (``dim``, optional ``source_dim``) and ``query_tower``."""

    manifest: dict[str, Any]
    query_tower: Any

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def factory(self) -> str:
        return str(self.manifest["factory"])

    def __len__(self) -> int:
        return int(self.manifest["n_vectors"])

    def info(self) -> dict[str, Any]:
        return dict(self.manifest)

    def prepare_search(self, queries: Queries, k: int, rerank: int | None) -> tuple[np.ndarray, int]:
        """Checks ``k`` / ``rerank``; the query unit vectors and the number of ANN candidates
        to fetch (``max(k, rerank)``, at most the number of documents); ``rerank=0``: no re-rank."""
        if k < 1:
            raise ScalingNoteError(f"k must be >= 1, got {k}")
        if rerank is not None and rerank < 0:
            raise ScalingNoteError(f"rerank must be >= 0 (number of candidates; 0 = no re-rank), got {rerank}")
        return self.query_vectors(queries), min(max(k, rerank) if rerank else k, len(self))

    def query_vectors(self, queries: Queries) -> np.ndarray:
        """Turn texts (via the query tower) or precomputed vectors into (nq, dim) unit vectors
        (vectors of the document tower's full dim are cut to the indexed Matryoshka prefix)."""
        if isinstance(queries, str):
            queries = [queries]
        if not isinstance(queries, np.ndarray):
            queries = list(queries)
            if queries and not all(isinstance(q, str) for q in queries):
                queries = np.asarray(queries, dtype=np.float32)
        if isinstance(queries, list):
            if self.query_tower is None:
                raise ScalingNoteError(
                    f"searching with query texts needs a query tower: {type(self).__name__}.open(..., query_tower=...)"
                )
            if not queries:
                return np.zeros((0, self.dim), dtype=np.float32)
            q = np.asarray(encode_queries_quietly(self.query_tower, queries), dtype=np.float32)
            what = f"query tower output ({q.shape[-1]}-d)"
        else:
            q = np.asarray(queries, dtype=np.float32)
            if q.ndim == 1:
                q = q[None, :]
            what = f"query vectors ({q.shape[-1]}-d)"
        if q.ndim != 2:
            raise ScalingNoteError(f"query vectors: expected shape (nq, {self.dim}), got {q.shape}")
        d, src = q.shape[1], int(self.manifest.get("source_dim", self.dim))
        if d != self.dim:
            if d == src and src > self.dim:
                q = q[:, : self.dim]  # Matryoshka prefix, as the documents were indexed
            else:
                raise ScalingNoteError(
                    f"{what} do not match the index: index dim is {self.dim} (document tower dim {src}), got {d}"
                )
        if not np.all(np.isfinite(q)):
            raise ScalingNoteError("query vectors contain non-finite values")
        return np.ascontiguousarray(l2_normalize(q))


class BM25Searcher(SearcherBase):
    """A :class:`scalingnote.sparse.BM25Retriever` behind the :class:`Searcher` interface:
    ``search(texts, k)`` -> :class:`SearchResult` (BM25 scores; ``indices`` are rows of the
    retriever's ``doc_ids``; no semantic IDs)."""

    def __init__(self, retriever: Any):
        self.retriever = retriever
        self.doc_ids = list(retriever.doc_ids)
        self._row = {d: i for i, d in enumerate(self.doc_ids)}

    def __len__(self) -> int:
        return len(self.doc_ids)

    def search(self, queries: str | Sequence[str], k: int = 10, **kw: Any) -> SearchResult:
        if kw:
            raise ScalingNoteError(f"BM25 search takes no {', '.join(sorted(kw))}")
        if k < 1:
            raise ScalingNoteError(f"k must be >= 1, got {k}")
        texts = [queries] if isinstance(queries, str) else list(queries)
        if not all(isinstance(t, str) for t in texts):
            raise ScalingNoteError("BM25 searches query texts, not vectors")
        lex = self.retriever.search({str(i): t for i, t in enumerate(texts)}, k=k, show_progress=False)
        # descending score, ties by document id (as trec_eval and the hybrid fusion order them)
        runs = [dict(sorted(lex[str(i)].items(), key=lambda x: (-x[1], x[0]))[:k]) for i in range(len(texts))]
        return SearchResult.from_runs(runs, k, self._row)


__all__ = [
    "BM25Searcher",
    "Queries",
    "SEARCH_OPTIONS",
    "SearchResult",
    "Searcher",
    "SearcherBase",
    "VectorSearcher",
    "encode_queries_quietly",
    "gather_rows",
    "search_options",
    "search_run",
]
