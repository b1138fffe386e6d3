"""scalingnote from Python: :func:`load` opens a quick start's (or a recipe's) output as a
:class:`Retriever` with the configuration ``scalingnote serve`` serves; :func:`quickstart` runs the
quick start and returns its results.

Everything here goes through the service's own code: the index, the query encoder and the served
default (``fusion.json``'s mode and fusion, the BM25 side) come from
:func:`scalingnote.serve.loading.load_served`, a search runs
:func:`scalingnote.serve.processing.search_encoded`, and :meth:`Retriever.add` /
:meth:`Retriever.delete` check documents and write the live index's write-ahead log exactly as
``POST /documents`` and ``DELETE /documents/{id}`` do. So ``load(run).search`` answers what the
service answers (the tests check nDCG@10 against the quick start's served row).

Examples:
    >>> import scalingnote
    >>> retriever = scalingnote.load(run_dir)              # run_dir: a quick start's --out
    >>> hits = retriever.search(["a note about a travel plan"], k=3)
    >>> len(hits), len(hits[0])
    (1, 3)
    >>> hit = hits[0][0]
    >>> isinstance(hit.id, str) and isinstance(hit.score, float) and isinstance(hit.title, str)
    True
    >>> retriever.close()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.data.types import Document
from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.live.records import id_problem
from scalingnote.quickstart.results import QuickstartResult, read_results, run_quickstart, served_paths
from scalingnote.serve.documents import check_batch
from scalingnote.serve.loading import Served, load_served
from scalingnote.serve.metrics import ServeMetrics
from scalingnote.serve.processing import SearchParams, ServiceError, hits_json, query_problem, search_encoded
from scalingnote.serve.settings import ServeSettings

#: :func:`quickstart` is :func:`scalingnote.quickstart.results.run_quickstart`
quickstart = run_quickstart


@dataclass(frozen=True)
class Hit:
    """One search result: the document's ``id``, its ``score`` (higher is better; dense: inner
    product of unit vectors, hybrid: the fused score, bm25: BM25), ``title``, ``snippet`` (the
    start of its text, as the service returns it) and ``semantic_id`` (its residual-K-means codes,
    when the index has them)."""

    id: str
    score: float
    title: str = ""
    snippet: str = ""
    semantic_id: tuple[int, ...] | None = None


class Retriever:
    """A quick start's served configuration in this process (open it with :func:`load`).

    :meth:`search` answers as the service does; :meth:`encode_queries` / :meth:`encode_documents`
    give the vectors it compares; :meth:`add` / :meth:`delete` change the live index (write-ahead
    log first). It holds the index's writer lock until :meth:`close` (or the end of a ``with``
    block); opened while a service writes the index, it is read-only (search only)."""

    def __init__(self, served: Served, settings: ServeSettings, index_dir: Path, query_tower: Path):
        self._served = served
        self.settings = settings
        self.index_dir = index_dir
        self.query_tower = query_tower
        self._metrics = ServeMetrics()  # the counters check_batch keeps (refused batches); unused otherwise

    # ------------------------------------------------------------------ info
    @property
    def modes(self) -> tuple[str, ...]:
        """The search modes answered: ``dense`` always; ``bm25`` and ``hybrid`` with a BM25 index."""
        return self._served.modes

    @property
    def default_mode(self) -> str:
        """The mode of a search without one: the quick start's served choice (``fusion.json``)."""
        return self._served.default_mode

    def __len__(self) -> int:
        return len(self._served.index)

    def __repr__(self) -> str:
        return (
            f"Retriever({str(self.index_dir)!r}, {len(self)} documents, modes {list(self.modes)}, "
            f"default {self.default_mode!r})"
        )

    # ------------------------------------------------------------------ search
    def search(self, queries: list[str], k: int = 10, mode: str | None = None) -> list[list[Hit]]:
        """The top ``k`` :class:`Hit` per query, best first, as ``POST /search/batch`` answers:
        ``mode`` ``dense`` (the query tower over the compressed index), ``bm25`` or ``hybrid``
        (fused with BM25); None: the served default (:attr:`default_mode`).

        Examples:
            >>> r = scalingnote.load(run_dir)
            >>> [len(h) for h in r.search(["travel plan", "a recipe"], k=5)]
            [5, 5]
            >>> r.search(["travel plan"], k=2, mode="bm25")[0][0].score > 0
            True
            >>> r.close()
        """
        texts = self._check_queries(queries)
        params = self._params(k, mode)
        if not texts:
            return []
        vectors = self._encode_raw(texts) if params.mode != "bm25" else None
        s = self._served
        searcher = s.searcher if s.searcher is not None and s.searcher.dense is s.index else None
        res = search_encoded(s.index, searcher, self.settings.backend, texts, vectors, params)
        return [
            [
                Hit(
                    h["doc_id"],
                    h["score"],
                    h["title"] or "",
                    h["snippet"] or "",
                    tuple(h["semantic_id"]) if h["semantic_id"] is not None else None,
                )
                for h in hits
            ]
            for hits in hits_json(res, s.titles, s.snippets)
        ]

    def _check_queries(self, queries: Iterable[str]) -> list[str]:
        if isinstance(queries, str):
            raise ScalingNoteError("queries: expected a list of strings, got one string (wrap it: [query])")
        texts = list(queries)
        for i, q in enumerate(texts):
            if not isinstance(q, str):
                raise ScalingNoteError(f"queries[{i}]: expected a string, got {type(q).__name__}")
            problem = query_problem(q)
            if problem is None and len(q) > self.settings.max_query_chars:
                problem = f"{len(q)} characters, more than the limit of {self.settings.max_query_chars}"
            if problem is not None:
                raise ScalingNoteError(f"queries[{i}]: {problem}")
        return texts

    def _params(self, k: int, mode: str | None) -> SearchParams:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.settings.max_k:
            raise ScalingNoteError(f"k: must be an integer in 1..{self.settings.max_k}, got {k!r}")
        mode = self.default_mode if mode is None else mode
        if mode not in self.modes:
            why = "unknown mode" if mode not in ("dense", "bm25", "hybrid") else "this index has no BM25 index"
            raise ScalingNoteError(f"mode: {mode!r} is not available: {why}; available: {', '.join(self.modes)}")
        return SearchParams(k=k, mode=mode)

    # ------------------------------------------------------------------ encode
    def _encode_raw(self, texts: list[str]) -> np.ndarray:
        return np.asarray(
            self._served.tower.encode_queries(texts, batch_size=self.settings.max_batch, show_progress=False),
            dtype=np.float32,
        )

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Query vectors ``(len(texts), dim)``: the served query tower's, cut to the indexed
        dimension and of unit norm, so ``encode_queries(q) @ encode_documents(d).T`` is the
        dense score (before the index's compression).

        Examples:
            >>> r = scalingnote.load(run_dir)
            >>> q, d = r.encode_queries(["travel plan"]), r.encode_documents(["a travel plan for the holidays"])
            >>> q.shape == (1, d.shape[1]) and bool(abs(np.linalg.norm(q) - 1) < 1e-4)
            True
            >>> r.close()
        """
        texts = self._check_queries(texts)
        dense = getattr(getattr(self._served.index, "store", None), "dense", self._served.index)
        return np.asarray(dense.query_vectors(self._encode_raw(texts)), dtype=np.float32)

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Document vectors ``(len(texts), dim)`` from the index's document tower (the LLM tower
        the index was built with), as :meth:`add` stores them: cut to the indexed dimension, unit norm."""
        if isinstance(texts, str):
            raise ScalingNoteError("texts: expected a list of strings, got one string (wrap it: [text])")
        docs = []
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ScalingNoteError(f"texts[{i}]: expected a non-empty string, got {t!r:.60}")
            docs.append(Document(id=str(i), content=t))
        index = self._served.index
        if not hasattr(index, "encode"):
            raise ScalingNoteError(
                f"{self.index_dir}: back end {self.settings.backend!r} has no document tower here (it is "
                "not served live)"
            )
        vectors: np.ndarray = index.encode(docs)[0]
        return vectors

    # ------------------------------------------------------------------ live index
    def _live(self, op: str) -> Any:
        """The served index back end (untyped: any live back end), when it can do ``op`` now."""
        index = self._served.index
        if not getattr(index, op, False):
            raise ScalingNoteError(
                f"{self.index_dir}: back end {self.settings.backend!r} cannot change documents while it is open"
            )
        if not getattr(index, "writer", True):
            raise ScalingNoteError(
                f"{self.index_dir}: another process (a running service or `scalingnote index add`) holds "
                "the index's writer lock: this retriever is read-only (send the documents to that process, "
                "or stop it and load again)"
            )
        return index

    def add(self, documents: list[dict[str, Any]]) -> dict[str, Any]:
        """Add or replace ``documents`` (records as ``POST /documents`` takes them: ``_id``,
        ``title``, ``text``, optional ``topic``), all or nothing: every record is checked first (a
        :class:`~scalingnote.errors.DataError` names each refused document, field and reason, and
        nothing is applied); the batch is encoded by the index's document tower, written to the
        fsync-ed write-ahead log, then applied. Returns ``seq``, ``upserted``, ``replaced`` and
        ``documents`` (each ``_id`` and its ``status``: ``added`` or ``replaced``).

        Examples:
            >>> r = scalingnote.load(run_dir)
            >>> r.add([{"_id": "new-1", "title": "zorblax", "text": "a zorblax note about a trip"}])["documents"]
            [{'index': 0, '_id': 'new-1', 'status': 'added'}]
            >>> r.search(["zorblax"], k=1, mode="bm25")[0][0].id
            'new-1'
            >>> r.delete(["new-1"])["deleted"]
            1
            >>> r.close()
        """
        try:
            docs = check_batch(documents, self.settings, self._metrics)
        except ServiceError as e:
            raise DataError("documents", None, None, e.detail) from None
        index = self._live("supports_upsert")
        res: dict[str, Any] = index.upsert(docs)
        self._after_write(index)
        status = res.pop("status", None) or ["upserted"] * len(docs)
        res["documents"] = [
            {"index": i, "_id": d.id, "status": st} for i, (d, st) in enumerate(zip(docs, status, strict=True))
        ]
        return res

    def delete(self, ids: list[str]) -> dict[str, Any]:
        """Delete the documents ``ids`` (write-ahead log first), as ``DELETE /documents/{id}`` does
        for each: an id the rule of :meth:`add` refuses is a :class:`~scalingnote.errors.DataError`.
        Returns ``seq``, ``deleted`` (how many were present) and ``missing`` (the ids that were not)."""
        if isinstance(ids, str):
            raise ScalingNoteError("ids: expected a list of ids, got one string (wrap it: [id])")
        ids = list(ids)
        for i, doc_id in enumerate(ids):
            why = id_problem(doc_id) if isinstance(doc_id, str) else f"expected a string, got {type(doc_id).__name__}"
            if why is not None:
                raise DataError("ids", None, f"ids[{i}]", why)
        index = self._live("supports_delete")
        res: dict[str, Any] = index.delete(ids)
        if res.get("deleted"):
            self._after_write(index)
        return res

    def _after_write(self, index: Any) -> None:
        """Compact when the delta (added documents + tombstones) reaches ``live_compact_docs``, as the
        service does."""
        pending = (
            index.compaction_pending()
            if hasattr(index, "compaction_pending")
            else index.stats()["bm25_delta_documents"] + index.store.tombstones
        )
        if pending >= self.settings.live_compact_docs:
            index.compact()

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Release the index (its write-ahead log and writer lock)."""
        close = getattr(self._served.index, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Retriever:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def load(
    run_dir: str | Path | None,
    *,
    index: str | Path | None = None,
    query_tower: str | Path | None = None,
    **settings: Any,
) -> Retriever:
    """Open a quick start's (or a recipe's) output ``run_dir`` as a :class:`Retriever` with the
    configuration ``scalingnote serve`` serves for it: the index ``<run_dir>/index/ivfpq`` at its
    tuned settings, the chosen student as the query tower, the served default mode and fusion.

    ``index`` / ``query_tower``: serve other directories (``run_dir`` may then be None);
    ``settings``: any :class:`~scalingnote.serve.settings.ServeSettings` field (``query_backend="onnx"``,
    ``corpus=...``, ``max_k`` ...). A missing or unfinished run is a
    :class:`~scalingnote.errors.ScalingNoteError` naming what is missing.

    Examples:
        >>> with scalingnote.load(run_dir) as r:
        ...     r.default_mode in r.modes
        True
    """
    if index is None or query_tower is None:
        if run_dir is None:
            raise ScalingNoteError("load: give a run directory, or both index= and query_tower=")
        found_index, found_tower = served_paths(Path(run_dir))
        index = found_index if index is None else index
        query_tower = found_tower if query_tower is None else query_tower
    fields = {f.name for f in dataclasses.fields(ServeSettings)}
    unknown = sorted(set(settings) - fields)
    if unknown:
        raise ScalingNoteError(f"load: {unknown[0]}: not a ServeSettings field")
    cfg = ServeSettings(**settings)
    served = load_served(Path(index), Path(query_tower), cfg)
    return Retriever(served, cfg, Path(index), Path(query_tower))


__all__ = ["Hit", "QuickstartResult", "Retriever", "load", "quickstart", "read_results"]
