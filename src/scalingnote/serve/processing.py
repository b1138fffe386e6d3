"""The work of one micro-batch (run in the service's worker thread): encode the texts that need
the query tower in one call, search per group of identical parameters, turn results into JSON
hits; plus the request / error types shared with the HTTP app."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError


log = logging.getLogger("scalingnote.serve")


class ServiceError(Exception):
    """An error with an HTTP status, an error code and a human-readable detail
    (``retry_after``: seconds for the ``Retry-After`` header of a 503)."""

    def __init__(self, status: int, error: str, detail: str, retry_after: int | None = None):
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.retry_after = retry_after


@dataclass(frozen=True)
class SearchParams:
    k: int = 10
    nprobe: int | None = None
    ef_search: int | None = None
    rerank: int | None = None
    mode: str = "dense"  # dense | bm25 | hybrid (scalingnote.index.hybrid)


@dataclass
class _Item:
    texts: list[str]
    params: SearchParams
    future: asyncio.Future
    enqueued: float  # loop.time() at arrival




class BatchProcessing:
    """Mixin of :class:`~scalingnote.serve.service.SearchService`: needs ``settings``,
    ``metrics``, ``searcher``, ``titles`` and ``snippets``."""

    def _process(self, tower, index, items: list[_Item]) -> list[Any]:
        """Worker thread: encode every text that needs the query tower (modes dense and hybrid)
        in one call, then search per parameter group (BM25 for bm25, fused for hybrid)."""
        texts = [t for it in items for t in it.texts]
        starts = np.cumsum([0] + [len(it.texts) for it in items])
        need = [i for i, it in enumerate(items) if it.params.mode != "bm25"]
        enc_rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in need]) if need else np.zeros(0, dtype=np.int64)
        vec_row = np.full(len(texts), -1, dtype=np.int64)
        vec_row[enc_rows] = np.arange(len(enc_rows))
        t0 = time.perf_counter()
        vecs = None
        encode_error: ServiceError | None = None
        if len(enc_rows):
            try:
                vecs = tower.encode_queries([texts[r] for r in enc_rows], batch_size=max(self.settings.max_batch, 1), show_progress=False)
            except Exception as e:  # noqa: BLE001 - only the items that needed the tower fail
                self.metrics.query_errors.inc(len(enc_rows), kind="encode")
                log.exception("query encoding failed")
                encode_error = ServiceError(500, "encode_failed", f"{type(e).__name__}: {e}")
                if len(need) == len(items):
                    return [encode_error] * len(items)
            else:
                self.metrics.batch_size.observe(len(enc_rows))
        t1 = time.perf_counter()
        if len(enc_rows) and encode_error is None:
            self.metrics.encode_seconds.observe(t1 - t0)

        groups: dict[SearchParams, list[int]] = defaultdict(list)
        for i, it in enumerate(items):
            groups[it.params].append(i)
        outs: list[Any] = [None] * len(items)
        searcher = self.searcher if self.searcher is not None and self.searcher.dense is index else None
        for params, members in groups.items():
            rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in members])
            kw = {"nprobe": params.nprobe, "ef_search": params.ef_search, "rerank": params.rerank}
            if encode_error is not None and params.mode != "bm25":
                for i in members:
                    outs[i] = encode_error
                continue
            try:
                if params.mode == "dense":
                    res = index.search(vecs[vec_row[rows]], params.k, **kw)
                elif searcher is None:
                    raise ScalingNoteError(f"mode {params.mode!r} needs a BM25 index; this service has none")
                else:
                    qv = vecs[vec_row[rows]] if params.mode == "hybrid" else None
                    res = searcher.search([texts[r] for r in rows], params.k, mode=params.mode, query_vectors=qv, **kw)
            except ScalingNoteError as e:
                self.metrics.query_errors.inc(len(rows), kind="search_params")
                for i in members:
                    outs[i] = ServiceError(422, "invalid_request", str(e))
                continue
            except Exception as e:  # noqa: BLE001
                self.metrics.query_errors.inc(len(rows), kind="search")
                log.exception("index search failed")
                for i in members:
                    outs[i] = ServiceError(500, "search_failed", f"{type(e).__name__}: {e}")
                continue
            hits = self._hits(res)
            pos = 0
            for i in members:
                n = len(items[i].texts)
                outs[i] = hits[pos : pos + n]
                pos += n
        self.metrics.search_seconds.observe(time.perf_counter() - t1)
        self.metrics.queries.inc(len(texts))
        return outs

    def _hits(self, res) -> list[list[dict[str, Any]]]:
        """JSON hits: doc id, score, title, snippet (from the index's document store, else the
        corpus given at start) and semantic ID."""
        titles, snippets = self.titles, self.snippets
        res_titles, res_snippets = getattr(res, "titles", None), getattr(res, "snippets", None)
        out = []
        for j, docs in enumerate(res.doc_ids):
            scores = res.scores[j]
            sem = res.semantic_ids[j].tolist() if res.semantic_ids is not None else None
            tj = res_titles[j] if res_titles is not None else None
            sj = res_snippets[j] if res_snippets is not None else None
            out.append(
                [
                    {
                        "doc_id": d,
                        "score": float(scores[r]),
                        "title": tj[r] if tj is not None else titles.get(d, ""),
                        "snippet": sj[r] if sj is not None else snippets.get(d, ""),
                        "semantic_id": sem[r] if sem is not None else None,
                    }
                    for r, d in enumerate(docs)
                ]
            )
        return out
