"""The search service behind the HTTP app: loading, dynamic micro-batching, hot swap.

Online query retrieval (ScalingNote §3.5): the small query tower encodes the query,
the compressed (IVFPQ / HNSW+PQ, TMJ §6) index of the frozen LLM document embeddings
returns the top-k documents with their semantic IDs.

Concurrency model
-----------------
* Requests put work items (query texts + search parameters) in two lanes
  (:mod:`scalingnote.serve.lanes`): ``/search`` queries in the single lane, ``/search/batch``
  requests split into chunks of at most ``max_batch // 2`` queries in the batch lane. One
  batcher task takes the first waiting item, then collects more until ``max_batch`` queries
  or ``max_wait_ms`` after the first item's arrival (single queries get at least half of
  every micro-batch while batches wait), and hands the whole micro-batch to **one** worker
  thread: the query tower encodes all texts in one call, then the back end searches them
  (grouped by identical parameters). torch modules and the index are used from that single
  thread only.
* Hot swap: a new query tower is loaded in another thread (a different model object,
  so no shared state with the worker), checked against the index with
  :func:`scalingnote.index.check_query_tower`, then swapped in by one assignment on the
  event loop. The batcher reads the tower once per micro-batch, so every batch runs
  entirely on the old or entirely on the new tower, and requests keep being answered.
* Overload: the queue is bounded by ``max_queue`` queries, a batch counted by its size.
  Batches together hold at most ``batch_queue_share x max_queue`` of them (a batch is always
  admitted when no other batch waits, so a legal batch is never refused for its size alone);
  single queries are admitted while singles + min(batch queries, that share) < ``max_queue``,
  so they always keep ``(1 - batch_queue_share) x max_queue`` places: a legal batch cannot
  make single queries fail. A request that does not fit is shed at once with 503 +
  ``Retry-After`` (the estimated time to drain the queue at the measured throughput), so the
  worst queue wait stays near ``max_queue / throughput`` instead of growing with the number
  of clients.
* Shutdown: new work is refused (503), queued work is finished, then the worker stops.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from scalingnote.errors import ScalingNoteError
from scalingnote.index import check_query_tower, tower_identity
from scalingnote.index.backends import get_backend
from scalingnote.index.pipeline import load_tower_for
from scalingnote.index.searcher import search_options
from scalingnote.serve.documents import check_reload
from scalingnote.serve.lanes import Lanes
from scalingnote.serve.loading import load_served, query_encoder
from scalingnote.serve.metrics import ServeMetrics
from scalingnote.serve.processing import (  # re-exported for the app
    BatchProcessing,
    SearchParams,
    ServiceError,
    _Item,
    query_problem,
)
from scalingnote.serve.settings import ServeSettings

log = logging.getLogger("scalingnote.serve")


# --------------------------------------------------------------------------- service


class SearchService(BatchProcessing):
    """Owns the query tower, the index, the titles, the batcher and the worker thread."""

    def __init__(
        self,
        index_dir: str | Path,
        query_tower: str | Path,
        settings: ServeSettings | None = None,
        metrics: ServeMetrics | None = None,
    ):
        self.index_dir = Path(index_dir)
        self.tower_source = str(query_tower)
        self.settings: ServeSettings = settings or ServeSettings()
        self.metrics = metrics or ServeMetrics()
        self.metrics.queue_limit.set(self.settings.max_queue)
        self.state = "starting"  # starting -> loading -> ready | failed; -> stopping -> stopped
        self.error: str | None = None
        self.index: Any = None  # the back end's searcher (any back end of scalingnote.index.backends)
        self.tower: Any = None
        self.titles: dict[str, str] = {}
        self.snippets: dict[str, str] = {}
        self.searcher: Any = None  # scalingnote.index.hybrid.HybridSearcher (a back end with an index directory)
        self.default_mode = "dense"  #: a request without ``mode``; the index's fusion.json may make it hybrid
        self.corpus_path: Path | None = None
        self.loaded_at: float | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        self._lanes = Lanes(
            self.settings.max_queue, self.settings.batch_queue_share
        )  # queries waiting (backpressure, metrics)
        self._rate: float | None = None  # EWMA of worker throughput (queries/s), for Retry-After
        self._executor: ThreadPoolExecutor | None = None
        self._batcher: asyncio.Task | None = None
        self._loader: asyncio.Task | None = None
        self._reload_lock: asyncio.Lock | None = None
        self._closing = False
        self.recent_queries: deque[str] = deque(maxlen=256)  # the /admin/reload overlap check samples them

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the batcher and load the model + index in the background (returns at once)."""
        self._reload_lock = asyncio.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scalingnote-model")
        self._batcher = asyncio.create_task(self._batch_loop(), name="scalingnote-batcher")
        self._loader = asyncio.create_task(self._load(), name="scalingnote-loader")

    async def wait_ready(self, timeout: float | None = None) -> None:
        if self._loader is not None:
            await asyncio.wait_for(asyncio.shield(self._loader), timeout)
        if self.state != "ready":
            raise ScalingNoteError(f"service not ready: {self.error or self.state}")

    async def _load(self) -> None:
        self.state = "loading"
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._load_sync)
        except BaseException as e:  # reported through /healthz and on_failure
            self.state = "failed"
            self.error = str(e) if isinstance(e, ScalingNoteError) else f"{type(e).__name__}: {e}"
            log.error("scalingnote serve: loading failed: %s", self.error)
            if self.on_failure is not None:
                self.on_failure(e)
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        self.state = "ready"
        self.loaded_at = time.time()
        self.metrics.ready.set(1)
        log.info("scalingnote serve: ready (%d documents, tower %s)", len(self.index), self.tower_source)

    def _load_sync(self) -> None:
        """Runs in the worker thread: tower, index (compatibility checked), titles
        (:func:`~scalingnote.serve.loading.load_served`). The back end comes from
        :mod:`scalingnote.index.backends`; what it can do, from its searcher's flags."""
        if self.settings.threads:
            import torch  # why: torch loads with the first tower, after serve() sets OMP_WAIT_POLICY

            torch.set_num_threads(int(self.settings.threads))
        served = load_served(self.location, self.tower_source, self.settings)
        self.snippets, self.searcher, self.default_mode = served.snippets, served.searcher, served.default_mode
        tower = served.tower
        # warm-up: the first forward pass allocates; keep that out of the first request's latency
        tower.encode_queries(["warm up"], batch_size=1, show_progress=False)
        self.index, self.tower, self.titles, self.corpus_path = served.index, tower, served.titles, served.corpus_path
        self._set_tower_info(tower)

    @property
    def location(self) -> str | Path:
        """Where the back end lives: the index directory, or ``settings.uri`` for one located by URI."""
        if get_backend(self.settings.backend, "backend").location == "uri":
            assert self.settings.uri is not None  # ServeSettings refuses a back end located by URI without one
            return self.settings.uri
        return self.index_dir

    def capability(self, flag: str) -> bool:
        """A capability flag of the served searcher (:class:`~scalingnote.index.searcher.SearcherBase`);
        False for a flag the back end does not declare."""
        return bool(getattr(self.index, flag, False))

    def _set_tower_info(self, tower) -> None:
        self.metrics.tower_info.clear()
        self.metrics.tower_info.set(
            1, name=self.tower_source, fingerprint=str(tower.fingerprint), compat_id=str(tower.compat_id)
        )

    async def stop(self, timeout: float | None = None) -> None:
        """Refuse new work, finish queued work (at most ``timeout`` s), stop the worker."""
        timeout = self.settings.shutdown_timeout_s if timeout is None else timeout
        if self.state in ("stopping", "stopped"):
            return
        self._closing = True
        prev, self.state = self.state, "stopping"
        self.metrics.ready.set(0)
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()
        if self._batcher is not None:
            self._lanes.stop()
            try:
                await asyncio.wait_for(asyncio.shield(self._batcher), timeout)
            except (TimeoutError, asyncio.CancelledError):
                log.warning("scalingnote serve: shutdown timeout (%.1fs): cancelling queued requests", timeout)
                self._batcher.cancel()
                self._fail_queued(ServiceError(503, "shutting_down", "the service is shutting down"))
        if self._executor is not None:
            self._executor.shutdown(wait=prev != "loading", cancel_futures=True)
        self.state = "stopped"

    def _fail_queued(self, exc: BaseException) -> None:
        for it in self._lanes.drain():
            if not it.future.done():
                it.future.set_exception(exc)

    # ------------------------------------------------------------------ requests
    @property
    def queued(self) -> int:
        """Queries accepted and waiting for the model worker (not yet in a micro-batch)."""
        return self._lanes.queued

    def check_ready(self) -> None:
        if self._closing:
            raise ServiceError(503, "shutting_down", "the service is shutting down")
        if self.state != "ready":
            detail = (
                f"loading failed: {self.error}"
                if self.state == "failed"
                else f"not ready ({self.state}): the query tower and index are loading"
            )
            raise ServiceError(503, "not_ready", detail)

    def validate_params(self, params: SearchParams) -> None:
        """Range checks that depend on the settings and the index (422 on failure)."""
        s = self.settings
        if not 1 <= params.k <= s.max_k:
            raise ServiceError(422, "invalid_request", f"k: must be in 1..{s.max_k}, got {params.k}")
        try:  # only the options the back end declares (its capability flags)
            search_options(
                self.index,
                self.settings.backend,
                nprobe=params.nprobe,
                ef_search=params.ef_search,
                rerank=params.rerank,
            )
        except ScalingNoteError as e:
            raise ServiceError(422, "invalid_request", str(e)) from None
        if params.nprobe is not None:
            nlist = int(self.index.manifest.get("nlist") or 1)
            if not 1 <= params.nprobe <= nlist:
                raise ServiceError(
                    422, "invalid_request", f"nprobe: must be in 1..{nlist} (the index's nlist), got {params.nprobe}"
                )
        if params.ef_search is not None and not 1 <= params.ef_search <= s.max_rerank:
            raise ServiceError(
                422, "invalid_request", f"ef_search: must be in 1..{s.max_rerank}, got {params.ef_search}"
            )
        if params.rerank is not None and not 1 <= params.rerank <= s.max_rerank:
            raise ServiceError(422, "invalid_request", f"rerank: must be in 1..{s.max_rerank}, got {params.rerank}")
        if params.mode not in self.modes:
            why = (
                "unknown mode"
                if params.mode not in ("dense", "bm25", "hybrid")
                else "this service has no BM25 index (start it with --corpus, or build one with `scalingnote index "
                "bm25`)"
            )
            raise ServiceError(
                422,
                "invalid_request",
                f"mode: {params.mode!r} is not available: {why}; available: {', '.join(self.modes)}",
            )

    @property
    def modes(self) -> tuple[str, ...]:
        """Search modes this service answers: dense always; bm25 and hybrid with a BM25 index."""
        return self.searcher.modes if self.searcher is not None else ("dense",)

    def validate_query(self, q: str, where: str = "query") -> None:
        """422 naming ``where`` for a query that is not valid Unicode, empty (see
        :func:`~scalingnote.serve.processing.query_problem`) or too long: refused before batching."""
        problem = query_problem(q)
        if problem is not None:
            raise ServiceError(422, "invalid_request", f"{where}: {problem}")
        if len(q) > self.settings.max_query_chars:
            raise ServiceError(
                422,
                "invalid_request",
                f"{where}: {len(q)} characters, more than the limit of {self.settings.max_query_chars}",
            )

    def retry_after_s(self) -> int:
        """Seconds until the queue has likely drained (queued / measured throughput), 1..60."""
        rate = self._rate or 0.0
        if rate <= 0:
            return 1
        return int(min(60, max(1, math.ceil(self.queued / rate))))

    def admits(self, n: int, batch: bool = False) -> bool:
        """Whether a request of ``n`` queries may wait (:meth:`scalingnote.serve.lanes.Lanes.admits`):
        a single query while singles + min(batch queries, the batch share) < ``max_queue`` (or
        nothing waits), a batch while the batch share has room or no other batch waits."""
        return self._lanes.admits(n, batch)

    async def search(
        self, texts: list[str], params: SearchParams, batch: bool | None = None
    ) -> list[list[dict[str, Any]]]:
        """Top-k hits for each text (via the micro-batcher); ``batch`` (default: more than one
        text) puts them in the batch lane, in chunks of at most ``max_batch // 2``."""
        self.check_ready()
        batch = len(texts) > 1 if batch is None else batch
        if not self.admits(len(texts), batch):  # shed load now rather than queue it behind an unbounded wait
            self.metrics.rejected.inc(reason="overload")
            self.metrics.shed_queries.inc(len(texts))
            lanes = self._lanes
            why = (
                f"{lanes.queued_batch} batch queries are waiting (batches may hold {lanes.batch_cap} of the queue "
                f"limit {self.settings.max_queue})"
                if batch
                else f"{lanes.queued} queries are waiting (limit {self.settings.max_queue})"
            )
            raise ServiceError(503, "overloaded", f"{why}; retry later", retry_after=self.retry_after_s())
        loop = asyncio.get_running_loop()
        self.recent_queries.extend(texts)
        texts = list(texts)
        step = max(1, self.settings.max_batch // 2) if batch else max(1, len(texts))
        items = [
            _Item(texts[i : i + step], params, loop.create_future(), loop.time()) for i in range(0, len(texts), step)
        ]
        for it in items:
            self._lanes.put(it, batch)
        self.metrics.queue_depth.set(self.queued)
        if len(items) == 1:
            return await items[0].future
        parts = await asyncio.gather(*(it.future for it in items), return_exceptions=True)
        failed = next((p for p in parts if isinstance(p, BaseException)), None)
        if failed is not None:  # a chunk failed: the request fails with its error
            raise failed
        return [hits for part in parts if not isinstance(part, BaseException) for hits in part]

    # ------------------------------------------------------------------ batching
    async def _next_batch(self) -> list[_Item] | None:
        return await self._lanes.next_batch(self.settings.max_batch, self.settings.max_wait_ms / 1000.0)

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                batch = await self._next_batch()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the batcher die: requests would hang
                log.exception("scalingnote serve: batcher error")
                continue
            if batch is None:
                return
            self.metrics.queue_depth.set(self.queued)
            live = [it for it in batch if not it.future.done()]  # a disconnected client's request is cancelled
            if not live:
                continue
            now = loop.time()
            for it in live:
                self.metrics.queue_wait.observe(now - it.enqueued)
            tower, index = self.tower, self.index  # the swap point: one tower per micro-batch
            t_start = loop.time()
            try:
                outs = await loop.run_in_executor(self._executor, self._process, tower, index, live)
            except BaseException as e:  # delivered to the waiting requests
                if isinstance(e, asyncio.CancelledError):
                    for it in live:
                        if not it.future.done():
                            it.future.set_exception(ServiceError(503, "shutting_down", "the service is shutting down"))
                    raise
                outs = [e] * len(live)
            took = loop.time() - t_start
            if took > 0:  # worker throughput, smoothed (only used for the Retry-After estimate)
                r = sum(len(it.texts) for it in live) / took
                self._rate = r if self._rate is None else 0.8 * self._rate + 0.2 * r
            for it, out in zip(live, outs, strict=True):
                if it.future.done():
                    continue
                if isinstance(out, BaseException):
                    it.future.set_exception(out)
                else:
                    it.future.set_result(out)

    # ------------------------------------------------------------------ hot swap
    async def reload(self, query_tower: str | Path) -> dict[str, Any]:
        """Load ``query_tower`` in a background thread; swap it in if the index accepts it.

        409 if incompatible (or another reload is running), 400 if it cannot be loaded;
        the old tower keeps serving in every failure case.
        """
        self.check_ready()
        reload_lock = self._reload_lock
        assert reload_lock is not None  # set by start(), before the service can be ready
        if reload_lock.locked():
            self.metrics.reloads.inc(result="busy")
            raise ServiceError(409, "reload_in_progress", "another reload is in progress")
        async with reload_lock:
            source = str(query_tower)

            def load():
                if self.settings.threads:
                    import torch  # why: as in _load_sync

                    torch.set_num_threads(int(self.settings.threads))
                try:
                    t = load_tower_for(source, "query")
                except ScalingNoteError as e:
                    raise ServiceError(400, "tower_load_failed", str(e)) from None
                except Exception as e:  # noqa: BLE001 - a corrupt directory etc.
                    raise ServiceError(400, "tower_load_failed", f"{source}: {type(e).__name__}: {e}") from None
                try:
                    check_query_tower(self.index.manifest, t, getattr(self.index, "root", self.location))
                except ScalingNoteError as e:
                    raise ServiceError(409, "incompatible_query_tower", str(e)) from None
                try:  # the same query backend as at start (ONNX Runtime under --query-backend onnx)
                    t = query_encoder(t, self.settings)
                except ScalingNoteError as e:
                    raise ServiceError(400, "tower_load_failed", str(e)) from None
                t.encode_queries(["warm up"], batch_size=1, show_progress=False)  # own thread, own model object
                return t

            t0 = time.perf_counter()
            try:
                new = await asyncio.to_thread(load)
            except ServiceError as e:  # the old tower keeps serving
                self.metrics.reloads.inc(result="incompatible" if e.status == 409 else "failed")
                raise
            except Exception as e:  # noqa: BLE001
                self.metrics.reloads.inc(result="failed")
                raise ServiceError(400, "tower_load_failed", f"{source}: {type(e).__name__}: {e}") from None
            try:  # the new tower's top-10 must overlap the running tower's
                check = await asyncio.get_running_loop().run_in_executor(self._executor, check_reload, self, new)
            except ServiceError:
                self.metrics.reloads.inc(result="low_overlap")
                raise
            if self._closing:
                raise ServiceError(503, "shutting_down", "the service is shutting down")
            old = self.tower
            self.tower, self.tower_source = new, source  # atomic between micro-batches
            self._set_tower_info(new)
            self.metrics.reloads.inc(result="swapped")
            log.info("scalingnote serve: query tower swapped to %s (fingerprint %s)", source, new.fingerprint)
            return {
                "status": "swapped",
                "query_tower": self.tower_info(),
                "previous_fingerprint": str(old.fingerprint) if old is not None else None,
                "load_seconds": round(time.perf_counter() - t0, 3),
                "overlap_check": check,
            }

    # ------------------------------------------------------------------ info
    def tower_info(self) -> dict[str, Any]:
        info = tower_identity(self.tower) if self.tower is not None else {}
        info["source"] = self.tower_source
        return info

    def index_info(self) -> dict[str, Any]:
        m = self.index.manifest
        sem = m.get("semantic_ids") or {}
        return {
            "path": str(getattr(self.index, "root", self.location)),
            "factory": m.get("factory"),
            "n_vectors": m.get("n_vectors"),
            "dim": m.get("dim"),
            "nlist": m.get("nlist"),
            "search_defaults": m.get("search_defaults"),
            "semantic_id_layers": sem.get("n_layers"),
            "document_tower": {
                k: (m.get("tower") or {}).get(k) for k in ("name", "path", "fingerprint", "compat_id", "dim")
            },
        }

    def health(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": "ok" if self.state == "ready" and not self._closing else self.state}
        if self.state == "ready":
            out.update(
                {
                    "query_tower": self.tower_info(),
                    "index": self.index_info(),
                    "titles": {"corpus": str(self.corpus_path) if self.corpus_path else None, "n": len(self.titles)},
                    "modes": list(self.modes),
                    "default_mode": self.default_mode,  # a request without "mode" (the page selects it too)
                    "queue_queries": self.queued,
                    "reloading": bool(self._reload_lock and self._reload_lock.locked()),
                }
            )
        if self.error:
            out["load_error"] = self.error
        return out
