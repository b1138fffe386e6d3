"""The live index behind the service (ScalingNote §3.5): ``POST /documents`` (a batch,
upsert by id, all or nothing) and ``DELETE /documents/{id}``, both admin endpoints (token,
loopback); live metrics in ``/metrics``; the top-10 overlap check of ``/admin/reload``.

A body goes through the API's one JSON parser (415 / 400, as ``/search``), then every record is
checked (:mod:`scalingnote.live.records`): a refused batch is one 422 naming every document,
field and reason, and nothing of it is applied. The answer lists each document's status
(``added`` / ``replaced``); upsert is by id, so re-sending a batch after a 503 or a dropped
connection leaves the same documents.

Ingest runs in its own thread, at a lower CPU priority (nice +10 for that thread) and with one
torch thread, so encoding new documents takes what the search worker leaves: searches keep
their latency while documents flow in. A request is answered only after its batch is in the
fsync-ed write-ahead log and applied (:class:`scalingnote.live.LiveIndex`).

A write the storage refuses answers 507 ``insufficient_storage`` (a full disk) or 503
``storage_error`` (an I/O error), a write the search back end refuses 503
``backend_unavailable``, all with ``Retry-After`` and nothing of the batch kept; until a later
write succeeds, ``/healthz`` says ``"status": "degraded"`` with the cause and ``/metrics`` sets
``scalingnote_live_writes_degraded`` to 1. Searches go on meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.index.backends import resolve_opener
from scalingnote.index.searcher import encode_queries_quietly
from scalingnote.live import LiveIndex
from scalingnote.live.errors import BackendUnavailable, LoggedNotApplied, StorageError, describe_os_error
from scalingnote.live.records import BatchError, documents_from_records, id_problem
from scalingnote.serve.processing import ServiceError, parse_json_body
from scalingnote.serve.settings import admin_denial

log = logging.getLogger("scalingnote.serve")

RECALL_REFRESH_S = 30.0
RETRY_AFTER_FULL_S = 30  # a full disk: space has to be freed
RETRY_AFTER_UNAVAILABLE_S = 5  # an I/O error or the back end: may pass


def open_serving_index(backend, location, tower, settings):
    """The searcher a service answers with: the back end's live (writable) form when it has one
    and ``settings.live`` (FAISS: a :class:`~scalingnote.live.LiveIndex`, log replayed;
    read-only when another process holds its writer lock), else the back end's searcher.
    ``backend``: an entry of :mod:`scalingnote.index.backends`."""
    if backend.live is None or not getattr(settings, "live", True):
        options = (
            {"collection": settings.collection, "token": settings.backend_token} if backend.location == "uri" else {}
        )
        return backend.open(location, query_tower=tower, **options)
    live_open = resolve_opener(backend.live, f"back end {backend.name} live")
    # a back end located by URI: its collection, token and the local directory of its log and BM25 side
    where = (
        {
            "collection": settings.collection,
            "token": settings.backend_token,
            "live_dir": getattr(settings, "live_dir", None),
        }
        if backend.location == "uri"
        else {}
    )
    try:
        return live_open(
            location, tower, document_tower=getattr(settings, "document_tower", None), corpus=settings.corpus, **where
        )
    except ScalingNoteError as e:
        if "another process" not in str(e):
            raise
        log.warning("scalingnote serve: %s; serving it read-only", e)
        return live_open(location, tower, writer=False, corpus=settings.corpus, **where)


def _ingest_thread_init() -> None:
    """Lower this thread's CPU priority by 10 nice levels (Linux: per thread; relative, so a
    service started under ``nice`` keeps its searches ahead) and use one torch thread."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + 10))
    except (OSError, AttributeError):
        pass
    import torch  # why: the ingest thread's torch setting; torch loads with the towers, not with this module

    torch.set_num_threads(1)


class _LiveState:
    """Per-app state of the document routes: the ingest thread and the cached recall estimate."""

    def __init__(self, service, metrics, settings):
        self.service, self.metrics, self.settings = service, metrics, settings
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="scalingnote-ingest", initializer=_ingest_thread_init
        )
        self.recall: float | None = None
        self.recall_at = 0.0
        self.recall_version = -1
        self._recall_running = False
        self.degraded: dict[str, Any] | None = None  # the last refused write's cause, until a write succeeds

    def pace(self, seconds: float) -> float:
        """In the ingest thread, after encoding a chunk that took ``seconds``: while searches are
        being answered (one ran in the last second), pause so that encoding takes at most
        ``ingest_duty`` of this thread's wall time; returns the seconds paused."""
        duty = float(getattr(self.settings, "ingest_duty", 1.0))
        if duty >= 1.0 or time.monotonic() - float(getattr(self.service, "last_search", 0.0)) > 1.0:
            return 0.0
        pause = min(5.0, seconds * (1.0 - duty) / duty)
        time.sleep(pause)
        return pause

    def live(self, write: bool = True, op: str = "supports_upsert"):
        self.service.check_ready()
        idx = self.service.index
        if not self.service.capability(op):
            what = "add or replace" if op == "supports_upsert" else "delete"
            raise ServiceError(
                409,
                "not_live",
                f"this service cannot {what} documents: back end {self.service.settings.backend!r} "
                "does not while it serves, or the live index is off (ServeSettings.live)",
            )
        if write and not getattr(idx, "writer", True):
            raise ServiceError(
                409,
                "read_only",
                f"{getattr(idx, 'state_dir', idx.root)}: another process holds the index's writer lock; this service "
                "serves it read-only",
            )
        if hasattr(idx, "pace"):
            idx.pace = self.pace
        return idx

    async def run(self, fn, *args):
        loop = asyncio.get_running_loop()
        try:
            out = await loop.run_in_executor(self.executor, fn, *args)
        except DataError as e:
            raise ServiceError(422, "invalid_document", str(e)) from None
        except (StorageError, OSError, BackendUnavailable, LoggedNotApplied) as e:
            raise self.refused(e) from None
        except ScalingNoteError as e:
            raise ServiceError(409, "ingest_refused", str(e)) from None
        self.degraded = None  # a write went through: the storage and the back end take writes again
        return out

    def refused(self, e: Exception, op: str = "write") -> ServiceError:
        """The answer to a write the storage or the back end refused; records the degraded state."""
        if isinstance(e, OSError):
            e = StorageError(f"{getattr(self.service.index, 'root', '')}: {describe_os_error(e)}", e.errno)
        if isinstance(e, StorageError):
            cause, status = e.cause, 507 if e.disk_full else 503
            error, retry = (
                ("insufficient_storage", RETRY_AFTER_FULL_S)
                if e.disk_full
                else ("storage_error", RETRY_AFTER_UNAVAILABLE_S)
            )
        elif isinstance(e, BackendUnavailable):
            cause, status, error, retry = "backend_unavailable", 503, "backend_unavailable", RETRY_AFTER_UNAVAILABLE_S
        else:  # LoggedNotApplied: durable in the log, applied before the next write goes ahead or at restart
            cause, status, error, retry = "backend_unavailable", 409, "ingest_refused", None
        self.degraded = {"cause": cause, "error": error, "detail": str(e), "since": time.time()}
        self.metrics.live_write_errors.inc(op=op, cause=cause)
        log.warning("scalingnote serve: a %s to the live index was refused: %s", op, e)
        return ServiceError(status, error, str(e), retry_after=retry)

    def write_health(self) -> dict[str, Any] | None:
        """``/healthz``'s ``writes`` entry while writes are refused (None when they are taken)."""
        d = self.degraded
        return None if d is None else {"status": "refused", **d}

    def after_write(self, idx) -> None:
        """In the ingest thread: compact when the delta is large, refresh the recall estimate."""
        limit = int(getattr(self.settings, "live_compact_docs", 2000))
        pending = (
            idx.compaction_pending()
            if hasattr(idx, "compaction_pending")
            else idx.stats()["bm25_delta_documents"] + idx.store.tombstones
        )
        if pending >= limit:
            try:
                log.info("scalingnote serve: compacting the live index (%s)", idx.compact())
            except (
                ScalingNoteError,
                OSError,
            ) as e:  # the log and the generation in use are kept: tried again after the next write
                self.metrics.live_write_errors.inc(op="compact", cause=getattr(e, "cause", None) or type(e).__name__)
                log.warning("scalingnote serve: compaction failed, the live index keeps its log: %s", e)
        self.refresh_recall(idx, force=False)

    def refresh_recall(self, idx, force: bool) -> None:
        now = time.monotonic()
        if force or (idx.version != self.recall_version and now - self.recall_at >= RECALL_REFRESH_S):
            self.recall_version, self.recall_at = idx.version, now
            self.recall = idx.recall_estimate()

    def collect(self) -> None:
        """Before each /metrics render: the live gauges (recall estimate refreshed in the background)."""
        idx = self.service.index
        if not isinstance(idx, LiveIndex) and not hasattr(
            idx, "compaction_pending"
        ):  # the gauges: a live index's own statistics
            return
        st = idx.stats()
        m = self.metrics
        m.live_documents.set(st["documents"])
        m.live_added_share.set(st["added_share"])
        m.live_log_records.set(st["log_records"])
        m.live_bm25_delta.set(st["bm25_delta_documents"])
        m.live_writes_degraded.set(0 if self.degraded is None else 1)
        if self.recall is not None:
            m.live_recall.set(self.recall)
        stale = idx.version != self.recall_version and time.monotonic() - self.recall_at >= RECALL_REFRESH_S
        if (self.recall is None or stale) and not self._recall_running:
            self._recall_running = True

            def job():
                try:
                    self.refresh_recall(idx, force=True)
                finally:
                    self._recall_running = False

            self.executor.submit(job)


def check_batch(body: Any, settings, metrics) -> list:
    """The documents of a ``POST /documents`` body (``{"documents": [...]}`` or a JSON array);
    422 ``invalid_document`` naming every document (position and ``_id``), field and reason
    that refuses the batch (``errors``), or ``invalid_request`` for the body's shape."""
    if isinstance(body, dict):
        extra = sorted(str(k).encode("utf-8", "backslashreplace").decode()[:100] for k in body if k != "documents")
        if extra:
            raise ServiceError(422, "invalid_request", f"{extra[0]}: unknown field (expected documents)")
        records = body.get("documents")
    else:
        records = body
    if not isinstance(records, list):
        raise ServiceError(
            422, "invalid_request", 'documents: expected a list of documents ({"documents": [...]} or a JSON array)'
        )
    max_docs = int(getattr(settings, "max_documents_per_request", 1024))
    if len(records) > max_docs:
        raise ServiceError(
            422, "invalid_request", f"documents: {len(records)} documents, more than the limit of {max_docs}"
        )
    try:
        return documents_from_records(
            records, where="request", max_chars=int(getattr(settings, "max_document_chars", 100_000))
        )
    except BatchError as e:
        metrics.rejected.inc(reason="invalid_document")
        errors = [
            {
                **p.to_json(),
                "field": f"documents.{p.index}" + (f".{p.field}" if p.field != "document" else ""),
                "type": "invalid_document",
            }
            for p in e.problems
        ]
        raise ServiceError(422, "invalid_document", str(e), errors=errors) from None


def add_document_routes(app: FastAPI, service, settings, metrics) -> None:
    """``POST /documents`` and ``DELETE /documents/{id}``, guarded as ``/admin/*`` is (admin token
    from a loopback client, no proxy forwarding headers)."""
    state = _LiveState(service, metrics, settings)
    app.state.live = state
    metrics.collectors.append(state.collect)

    def guard(request: Request) -> None:  # the admin rule of /admin/* (token, loopback, no proxy headers)
        hdrs = {k.lower(): v for k, v in request.headers.items()}
        token = str(request.app.state.admin_token).encode("latin-1", "replace")
        denied = admin_denial(request.url.path, hdrs, request.client.host if request.client else "", token, metrics)
        if denied is not None:
            raise denied

    async def upsert(request: Request):
        guard(request)
        body = parse_json_body(
            request.headers.get("content-type"), await request.body()
        )  # the shared parser: 415 / 400
        docs = check_batch(
            body, settings, metrics
        )  # all or nothing: every record checked before anything is encoded or logged
        idx = state.live()
        t0 = time.perf_counter()
        res = await state.run(idx.upsert, docs)
        metrics.live_documents_total.inc(len(docs), op="upsert")
        state.executor.submit(state.after_write, idx)
        status = res.pop("status", None) or ["upserted"] * len(docs)  # a back end that cannot tell added from replaced
        res["documents"] = [
            {"index": i, "_id": d.id, "status": st} for i, (d, st) in enumerate(zip(docs, status, strict=True))
        ]
        return JSONResponse({**res, "took_ms": round(1000 * (time.perf_counter() - t0), 3)})

    async def delete(doc_id: str, request: Request):
        guard(request)
        why = id_problem(doc_id)
        if why is not None:  # the id rule of POST /documents: such an id is never stored
            raise ServiceError(422, "invalid_request", f"_id: {why}")
        idx = state.live(op="supports_delete")
        t0 = time.perf_counter()
        res = await state.run(idx.delete, [doc_id])
        if not res["deleted"]:
            raise ServiceError(404, "not_found", f"document {doc_id!r} is not in the index")
        metrics.live_documents_total.inc(1, op="delete")
        state.executor.submit(state.after_write, idx)
        return JSONResponse({**res, "took_ms": round(1000 * (time.perf_counter() - t0), 3)})

    app.add_api_route("/documents", upsert, methods=["POST"])
    app.add_api_route("/documents/{doc_id:path}", delete, methods=["DELETE"])


# --------------------------------------------------------------------------- /admin/reload check


def reload_overlap(index, old_tower, new_tower, queries: list[str], k: int = 10) -> float:
    """Mean overlap |top-k(old) & top-k(new)| / k of two query towers over ``index`` (dense)."""
    qo = np.asarray(encode_queries_quietly(old_tower, queries), dtype=np.float32)
    qn = np.asarray(encode_queries_quietly(new_tower, queries), dtype=np.float32)
    a = index.search(qo, k).doc_ids
    b = index.search(qn, k).doc_ids
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b, strict=True)]))


def probe_queries(recent: list[str], index, n: int, seed: int = 0) -> tuple[list[str], str]:
    """The last ``n`` distinct recent queries; with none yet, titles of a seeded sample of documents."""
    qs = list(dict.fromkeys(reversed(recent)))[:n]
    if qs:
        return qs, "recent queries"
    titles = [t for t in (getattr(getattr(index, "store", index), "titles", None) or []) if t and t.strip()]
    rng = np.random.default_rng(seed)
    pick: np.ndarray | list[int] = rng.choice(len(titles), size=min(n, len(titles)), replace=False) if titles else []
    return [titles[i] for i in pick], "document titles (no recent queries)"


def check_reload(service, new_tower) -> dict[str, Any]:
    """Refuse (409) a new query tower whose top-10 over the live index overlaps
    the running tower's by less than ``settings.reload_min_overlap`` on a sample of recent queries."""
    s = service.settings
    threshold = float(getattr(s, "reload_min_overlap", 0.5))
    if service.tower is None or threshold <= 0:
        return {"overlap": None}
    queries, source = probe_queries(
        list(service.recent_queries), service.index, int(getattr(s, "reload_sample_queries", 64))
    )
    if not queries:
        return {"overlap": None}
    overlap = reload_overlap(service.index, service.tower, new_tower, queries)
    info = {"overlap@10": round(overlap, 4), "threshold": threshold, "n_queries": len(queries), "queries": source}
    if overlap < threshold:
        raise ServiceError(
            409,
            "reload_low_overlap",
            f"the new query tower's top-10 overlaps the running tower's by {overlap:.3f} on {len(queries)} {source} "
            f"(threshold {threshold}); the running tower keeps serving",
        )
    return info
