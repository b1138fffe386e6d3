"""The work of one micro-batch (run in the service's worker thread): encode the texts that need
the query tower in one call (if that call fails, each request's texts on their own, so only the
request the tower cannot encode fails), search per group of identical parameters, turn results
into JSON hits; plus the request / error types shared with the HTTP app. Error bodies never
carry exception text: the cause goes to the service log, one line per micro-batch."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import unicodedata
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.searcher import search_options
from scalingnote.serve.metrics import ServeMetrics

log = logging.getLogger("scalingnote.serve")


class ServiceError(Exception):
    """An error with an HTTP status, an error code and a human-readable detail
    (``retry_after``: seconds for the ``Retry-After`` header of a 503; ``errors``: the per-field
    entries of a 422 body)."""

    def __init__(
        self,
        status: int,
        error: str,
        detail: str,
        retry_after: int | None = None,
        errors: list[dict[str, Any]] | None = None,
    ):
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.retry_after = retry_after
        self.errors = errors


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


# --------------------------------------------------------------------------- request bodies


def is_json_type(content_type: str | None) -> bool:
    """No content type, ``application/json`` or ``application/*+json``."""
    if not content_type:
        return True
    main = content_type.split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/") and main.endswith("+json"))


def parse_json_body(content_type: str | None, raw: bytes) -> Any:
    """The one JSON body parser of the HTTP API (every POST endpoint): a non-JSON content type
    -> 415 ``unsupported_media_type``; a body that is not UTF-8 (encoded surrogates such as
    ``\xed\xa0\x80`` included), not JSON, or nested too deeply for the parser -> 400
    ``malformed_json``. Lone surrogates written as JSON escapes (``"\ud800"``) are valid JSON:
    the field checks refuse them (422 naming the field)."""
    if not is_json_type(content_type):
        raise ServiceError(
            415,
            "unsupported_media_type",
            f"content type {str(content_type)[:100]!r} is not accepted; send application/json",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ServiceError(
            400,
            "malformed_json",
            f"request body is not valid JSON: not UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start})",
        ) from None
    if not text.strip():
        return None  # no body: the endpoint's own check names what is missing (422)
    try:
        return json.loads(text)
    except RecursionError:
        raise ServiceError(400, "malformed_json", "request body is not valid JSON: nested too deeply") from None
    except ValueError as e:
        raise ServiceError(400, "malformed_json", f"request body is not valid JSON: {e}") from None


# characters that carry no text: whitespace, control (NUL ...), format (zero-width space / joiners,
# BOM, bidi marks) and separators; a query made only of these is empty
_BLANK_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})


def query_problem(q: str) -> str | None:
    """Why ``q`` cannot be searched (None: it can): not valid Unicode (a lone surrogate, which
    JSON's ``\\ud800`` escapes can carry but no encoder accepts), or empty (nothing but
    whitespace, control characters such as NUL, and zero-width / format characters)."""
    try:
        q.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"not valid Unicode: lone surrogate U+{ord(q[e.start]):04X} at character {e.start}"
    if all(c.isspace() or unicodedata.category(c) in _BLANK_CATEGORIES for c in q):
        return "empty query" if not q.strip() else "empty query (only control, zero-width or format characters)"
    return None


def _one_line(e: BaseException) -> str:
    """``Type: message`` on one line, at most 300 characters (for the service log)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


class BatchSettings(Protocol):
    """The settings a micro-batch reads (:class:`~scalingnote.serve.settings.ServeSettings` has them)."""

    @property
    def max_batch(self) -> int: ...

    @property
    def backend(self) -> str: ...


class BatchProcessing:
    """Mixin of :class:`~scalingnote.serve.service.SearchService`: needs ``settings``,
    ``metrics``, ``searcher``, ``titles`` and ``snippets``."""

    last_search: float = 0.0  #: time.monotonic() of the last micro-batch (0: none yet)
    settings: BatchSettings
    metrics: ServeMetrics
    searcher: Any  #: the hybrid searcher over an index directory (None: dense only)
    titles: dict[str, str]
    snippets: dict[str, str]

    def _process(self, tower, index, items: list[_Item]) -> list[Any]:
        """Worker thread: encode every text that needs the query tower (modes dense and hybrid)
        in one call, then search per parameter group (BM25 for bm25, fused for hybrid)."""
        self.last_search = time.monotonic()  # read by the live index's ingest pacing (serve.documents)
        texts = [t for it in items for t in it.texts]
        starts = np.cumsum([0] + [len(it.texts) for it in items])
        need = [i for i, it in enumerate(items) if it.params.mode != "bm25"]
        enc_rows = (
            np.concatenate([np.arange(starts[i], starts[i + 1]) for i in need]) if need else np.zeros(0, dtype=np.int64)
        )
        vec_row = np.full(len(texts), -1, dtype=np.int64)
        vec_row[enc_rows] = np.arange(len(enc_rows))
        t0 = time.perf_counter()
        vecs, failed = self._encode(tower, texts, enc_rows, items, need)
        if failed and len(failed) == len(items):
            return [failed[i] for i in range(len(items))]
        t1 = time.perf_counter()
        if len(enc_rows) and not failed:
            self.metrics.encode_seconds.observe(t1 - t0)

        groups: dict[SearchParams, list[int]] = defaultdict(list)
        for i, it in enumerate(items):
            groups[it.params].append(i)
        outs: list[Any] = [None] * len(items)
        searcher = self.searcher if self.searcher is not None and self.searcher.dense is index else None
        for params, members in groups.items():
            if params.mode != "bm25":  # items the tower could not encode fail alone
                for i in members:
                    if i in failed:
                        outs[i] = failed[i]
                members = [i for i in members if i not in failed]
                if not members:
                    continue
            rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in members])
            try:
                # only the options a request set, each declared by the back end (validated at admission)
                qv = None
                if params.mode != "bm25":
                    assert vecs is not None  # these items' texts were encoded (enc_rows holds their rows)
                    qv = vecs[vec_row[rows]]
                res = search_encoded(index, searcher, self.settings.backend, [texts[r] for r in rows], qv, params)
            except ScalingNoteError as e:
                self.metrics.query_errors.inc(len(rows), kind="search_params")
                for i in members:
                    outs[i] = ServiceError(422, "invalid_request", str(e))
                continue
            except Exception as e:  # noqa: BLE001 - internals go to the log (one line), never into the body
                self.metrics.query_errors.inc(len(rows), kind="search")
                log.error(
                    "index search failed for %d queries (mode %s, k %d): %s",
                    len(rows),
                    params.mode,
                    params.k,
                    _one_line(e),
                )
                for i in members:
                    outs[i] = ServiceError(
                        500, "search_failed", "the index search failed; the service log has the cause"
                    )
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

    def _encode(
        self, tower, texts: list[str], enc_rows: np.ndarray, items: list[_Item], need: list[int]
    ) -> tuple[np.ndarray | None, dict[int, ServiceError]]:
        """Encode ``texts[enc_rows]`` in one call. If that call fails, encode each item's texts on
        their own, so that only the items the tower cannot encode fail (one bad query must not
        fail its micro-batch neighbours); one log line says how many failed and why. Returns the
        vectors (row ``r`` of ``enc_rows`` -> row ``r``; failed items' rows are zero) and the
        failed items by index."""
        if not len(enc_rows):
            return None, {}
        bs = max(self.settings.max_batch, 1)
        try:
            vecs = tower.encode_queries([texts[r] for r in enc_rows], batch_size=bs, show_progress=False)
        except Exception as batch_error:  # noqa: BLE001 - retried item by item below
            first_error = batch_error
        else:
            self.metrics.batch_size.observe(len(enc_rows))
            return vecs, {}
        parts: dict[int, np.ndarray] = {}
        failed: dict[int, ServiceError] = {}
        cause: BaseException = first_error
        for i in need:
            try:
                parts[i] = np.asarray(
                    tower.encode_queries(items[i].texts, batch_size=bs, show_progress=False), dtype=np.float32
                )
            except Exception as e:  # noqa: BLE001 - this item fails alone
                cause = e
                failed[i] = ServiceError(
                    500, "encode_failed", "the query tower could not encode this query; the service log has the cause"
                )
        n_bad = sum(len(items[i].texts) for i in failed)
        if n_bad:
            self.metrics.query_errors.inc(n_bad, kind="encode")
        log.error(
            "query encoding failed for a micro-batch of %d queries; retried one request at a time: %d of %d requests "
            "failed (%s)",
            len(enc_rows),
            len(failed),
            len(need),
            _one_line(cause),
        )
        if not parts:
            return None, failed
        dim = next(iter(parts.values())).shape[1]
        vecs = np.zeros((len(enc_rows), dim), dtype=np.float32)
        pos = 0
        for i in need:
            n = len(items[i].texts)
            if i in parts:
                vecs[pos : pos + n] = parts[i]
            pos += n
        self.metrics.batch_size.observe(len(enc_rows) - n_bad)
        return vecs, failed

    def _hits(self, res) -> list[list[dict[str, Any]]]:
        """JSON hits of ``res`` (:func:`hits_json` with the titles and snippets loaded at start)."""
        return hits_json(res, self.titles, self.snippets)


def search_encoded(
    index, searcher, backend: str | None, texts: list[str], vectors: np.ndarray | None, params: SearchParams
):
    """One search as the service runs it: ``texts`` encoded already (``vectors``, None for mode
    bm25); mode dense on ``index`` itself, bm25 / hybrid through ``searcher`` (the served
    :class:`~scalingnote.index.hybrid.HybridSearcher`, None: no BM25 index); only the search
    options ``params`` sets, each declared by the back end. Returns the back end's result."""
    kw = search_options(index, backend, nprobe=params.nprobe, ef_search=params.ef_search, rerank=params.rerank)
    if params.mode == "dense":
        return index.search(vectors, params.k, **kw)
    if searcher is None:
        raise ScalingNoteError(f"mode {params.mode!r} needs a BM25 index; this service has none")
    return searcher.search(
        texts, params.k, mode=params.mode, query_vectors=vectors if params.mode == "hybrid" else None, **kw
    )


def hits_json(res, titles: dict[str, str], snippets: dict[str, str]) -> list[list[dict[str, Any]]]:
    """JSON hits: doc id, score, title, snippet (from the result where the index stores them, else
    ``titles`` / ``snippets``: the corpus given at start) and semantic ID."""
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
