"""The HTTP API (FastAPI): ``create_app(index_dir, query_tower_dir, settings)``.

Endpoints
---------
``GET  /``              the search page (``static/index.html`` + ``app.js``: query box, mode, results)
``POST /search``        ``{"query": str, "k": int = 10, "mode": "dense"|"bm25"|"hybrid"
                        (default: fusion.json beside the index, else "dense"),
                        "nprobe"?: int, "ef_search"?: int, "rerank"?: int}``
                        -> ``{"results": [{"doc_id", "score", "title", "snippet", "semantic_id"}],
                        "found": int, "fewer_than_k": bool, "took_ms"}`` (``fewer_than_k``: fewer
                        hits than ``k`` came back — a small corpus, or IVF lists probed that hold
                        fewer than ``k`` documents: raise ``nprobe``)
``POST /search/batch``  ``{"queries": [str, ...], "k", ...}`` -> ``{"results": [[hit, ...], ...],
                        "found": [int, ...], "fewer_than_k": [bool, ...], "took_ms"}``
``GET  /healthz``       503 until the query tower and the index are loaded, then 200 with their identity
                        (``"status": "degraded"`` and ``writes`` while the live index refuses writes)
``GET  /metrics``       Prometheus text exposition
``POST /documents``     ``{"documents": [{"_id", "title"?, "topic"?, "text"}, ...]}`` (or the bare list) -> the
                        live index adds / replaces them by id, all or nothing: ``{"seq", "upserted", "replaced",
                        "documents": [{"index", "_id", "status": "added"|"replaced"}], "took_ms"}``; a refused
                        batch is a 422 ``invalid_document`` whose ``errors`` name every document (``index``,
                        ``_id``), ``field`` and ``message`` that refused it; ids are kept exactly as sent (one
                        with leading / trailing whitespace or control characters is refused).
``DELETE /documents/{id}`` 200, 404 if absent, 422 for an id that could never be stored (admin, as /admin/*)
``POST /admin/reload``  ``{"query_tower": DIR}`` -> hot swap (200), 409 if incompatible, 400 if unloadable;
                        needs the admin token (``Authorization: Bearer TOKEN`` or ``X-Admin-Token``;
                        401 without it) from a loopback client (403 otherwise), and refuses
                        requests carrying proxy forwarding headers (403: behind a reverse proxy
                        on the same host every client would look like loopback)

Every error is a JSON body ``{"error": code, "detail": message}`` (422 bodies add
``"errors": [{"field", "message", "type"}]``). Every POST body goes through one parser
(:func:`scalingnote.serve.processing.parse_json_body`): malformed JSON (also invalid UTF-8,
encoded surrogates, or JSON nested too deeply) -> 400 ``malformed_json``, a non-JSON content
type -> 415 ``unsupported_media_type``; a wrong method -> 405 with ``Allow``, unknown fields /
wrong types / out-of-range values / a query that is not valid Unicode (lone surrogate) or is
empty (only whitespace, NUL / control or zero-width characters) -> 422 naming the field,
too large a body -> 413, a query the tower cannot encode -> 500 ``encode_failed`` for that
request only (its micro-batch neighbours are retried alone and answered; no exception text in
any body, the cause is one log line), not ready / shutting
down / overloaded -> 503 (with ``Retry-After``: seconds until the queue has likely drained; a
``/search/batch`` counts by its size and may hold at most ``batch_queue_share`` of ``max_queue``, the
rest is kept for single queries: :mod:`scalingnote.serve.lanes`). Types are strict: ``"k": "10"`` or
``"k": 10.0`` is refused rather than coerced.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from scalingnote.serve.documents import add_document_routes
from scalingnote.serve.metrics import CONTENT_TYPE, ServeMetrics
from scalingnote.serve.processing import parse_json_body
from scalingnote.serve.service import SearchParams, SearchService, ServiceError
from scalingnote.serve.settings import ServeSettings, admin_denial, resolve_admin_token

log = logging.getLogger("scalingnote.serve")

ENDPOINTS = ("/search", "/search/batch", "/healthz", "/metrics", "/admin/reload", "/")

# the search page: package files (no build step, no CDN); every document field is set with textContent
_STATIC = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _static_text(name: str) -> str:
    return resources.files("scalingnote.serve").joinpath("static", name).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- request models


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _SearchOptions(_Strict):
    """The search parameters shared by ``/search`` and ``/search/batch``."""

    k: int = 10
    mode: Literal["dense", "bm25", "hybrid"] | None = (
        None  #: None = the service's default (the index's fusion.json, else dense)
    )
    nprobe: int | None = None
    ef_search: int | None = None
    rerank: int | None = None


class SearchRequest(_SearchOptions):
    query: str


class BatchSearchRequest(_SearchOptions):
    queries: list[str]


class ReloadRequest(_Strict):
    query_tower: str


# --------------------------------------------------------------------------- middleware


class _BodyTooLarge(StarletteHTTPException):
    def __init__(self, limit: int):
        super().__init__(413, f"request body larger than {limit} bytes")


class _Guard:
    """Pure ASGI middleware: request-body size limit, the admin guard, per-endpoint metrics, in-flight gauge."""

    def __init__(self, app, metrics: ServeMetrics, max_body_bytes: int, admin_token: bytes = b""):
        self.app = app
        self.metrics = metrics
        self.max_body = max_body_bytes
        self.admin_token = admin_token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        status = {"code": 500}
        t0 = time.perf_counter()
        self.metrics.in_flight.inc()

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if path.startswith("/admin/"):
                hdrs = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
                client = scope.get("client")
                denied = admin_denial(path, hdrs, client[0] if client else "", self.admin_token, self.metrics)
                if denied is not None:
                    resp = _error(
                        denied.status,
                        denied.error,
                        denied.detail,
                        headers={"WWW-Authenticate": "Bearer"} if denied.status == 401 else None,
                    )
                    await resp(scope, receive, send_wrapper)
                    return
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.max_body:
                self.metrics.rejected.inc(reason="body_too_large")
                resp = _error(
                    413,
                    "body_too_large",
                    f"request body of {int(length)} bytes is larger than the limit of {self.max_body}",
                )
                await resp(scope, receive, send_wrapper)
                return
            seen = {"n": 0}
            limit = self.max_body

            async def receive_limited():
                message = await receive()
                if message["type"] == "http.request":
                    seen["n"] += len(message.get("body", b""))
                    if seen["n"] > limit:
                        self.metrics.rejected.inc(reason="body_too_large")
                        raise _BodyTooLarge(limit)
                return message

            await self.app(scope, receive_limited, send_wrapper)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.requests.inc(endpoint=endpoint, status=str(status["code"]))
            self.metrics.latency.observe(time.perf_counter() - t0, endpoint=endpoint)


class _SafeJSONResponse(JSONResponse):
    """JSON that renders even when an echoed string (a field name from the request) holds a lone
    surrogate: such strings are written as ``\\uXXXX`` escapes instead of failing to encode."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _error(
    status: int,
    error: str,
    detail: Any,
    retry_after: int | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    headers = dict(headers or {})
    if status in (503, 507):
        headers["Retry-After"] = str(int(retry_after) if retry_after else 1)
    return _SafeJSONResponse({"error": error, "detail": detail, **extra}, status_code=status, headers=headers or None)


async def read_body(request: Request, model: type[BaseModel] | None = None) -> Any:
    """The request's JSON body through the one shared parser (:func:`~scalingnote.serve.processing.parse_json_body`:
    415 / 400), validated against ``model`` when given (422 naming each field)."""
    data = parse_json_body(request.headers.get("content-type"), await request.body())
    if model is None:
        return data
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False, include_input=False)) from None


def _found(hits: list, k: int) -> dict[str, Any]:
    """``found``: hits returned; ``fewer_than_k``: fewer than the ``k`` asked for (a small corpus,
    or an IVF index whose ``nprobe`` lists hold fewer than ``k`` documents: raise ``nprobe``)."""
    return {"found": len(hits), "fewer_than_k": len(hits) < k}


def _loc(loc) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) if parts else "body"


# --------------------------------------------------------------------------- app


def create_app(index_dir: str | Path, query_tower_dir: str | Path, settings: ServeSettings | None = None) -> FastAPI:
    """The service as an ASGI app. The query tower and index load in the background when
    the app starts (lifespan); ``/healthz`` answers 503 until they are ready. The
    :class:`SearchService` is ``app.state.service``."""
    settings = settings or ServeSettings()
    metrics = ServeMetrics()
    service = SearchService(index_dir, query_tower_dir, settings, metrics)
    admin_token, admin_token_source = resolve_admin_token(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        try:
            yield
        finally:
            await service.stop(settings.shutdown_timeout_s)

    app = FastAPI(
        title="scalingnote query service",
        description="Dense retrieval: distilled query tower + compressed FAISS index (ScalingNote §3.5).",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = service
    app.state.settings = settings
    app.state.admin_token = admin_token  # printed by `scalingnote serve` when generated
    app.state.admin_token_source = admin_token_source
    app.add_middleware(
        _Guard,
        metrics=metrics,
        max_body_bytes=settings.max_body_bytes,
        admin_token=admin_token.encode("latin-1", "replace"),
    )

    _add_error_handlers(app, metrics)
    _add_routes(app, service, settings, metrics)
    return app


def _add_error_handlers(app: FastAPI, metrics: ServeMetrics) -> None:
    """JSON errors with a machine-readable ``error`` code for every failure path."""

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        if exc.error in ("malformed_json", "unsupported_media_type"):
            metrics.rejected.inc(reason=exc.error)
        elif exc.status == 422 and exc.error != "invalid_document":  # invalid_document is counted where it is raised
            metrics.rejected.inc(reason="invalid_request")
        if exc.errors is not None:
            return _error(exc.status, exc.error, exc.detail, retry_after=exc.retry_after, errors=exc.errors)
        return _error(exc.status, exc.error, exc.detail, retry_after=exc.retry_after)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        errs = exc.errors()  # raised by read_body: the body was parsed already (415 / 400 there)
        metrics.rejected.inc(reason="invalid_request")
        fields = [
            {"field": _loc(e.get("loc", ())), "message": str(e.get("msg")), "type": str(e.get("type"))} for e in errs
        ]
        detail = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
        return _error(422, "invalid_request", detail, errors=fields)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        codes = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
        return _error(
            exc.status_code, codes.get(exc.status_code, "http_error"), exc.detail, headers=exc.headers
        )  # 405 keeps its Allow header

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return _error(
            500, "internal_error", "internal error; the service log has the cause"
        )  # never internals in the body


def _add_routes(app: FastAPI, service: SearchService, settings: ServeSettings, metrics: ServeMetrics) -> None:
    def params_of(req: _SearchOptions) -> SearchParams:
        p = SearchParams(
            k=req.k,
            nprobe=req.nprobe,
            ef_search=req.ef_search,
            rerank=req.rerank,
            mode=req.mode or service.default_mode,
        )
        service.validate_params(p)
        return p

    @app.post("/search")
    async def search(request: Request):
        t0 = time.perf_counter()
        req = await read_body(request, SearchRequest)
        service.check_ready()
        service.validate_query(req.query)
        hits = await service.search([req.query], params_of(req), batch=False)
        return JSONResponse(
            {"results": hits[0], **_found(hits[0], req.k), "took_ms": round(1000 * (time.perf_counter() - t0), 3)}
        )

    @app.post("/search/batch")
    async def search_batch(request: Request):
        t0 = time.perf_counter()
        req = await read_body(request, BatchSearchRequest)
        service.check_ready()
        if not req.queries:
            raise ServiceError(422, "invalid_request", "queries: empty list")
        if len(req.queries) > settings.max_batch_queries:
            raise ServiceError(
                422,
                "invalid_request",
                f"queries: {len(req.queries)} queries, more than the limit of {settings.max_batch_queries}",
            )
        for i, q in enumerate(req.queries):
            service.validate_query(q, f"queries.{i}")
        hits = await service.search(list(req.queries), params_of(req), batch=True)
        found = [_found(h, req.k) for h in hits]
        return JSONResponse(
            {
                "results": hits,
                "found": [f["found"] for f in found],
                "fewer_than_k": [f["fewer_than_k"] for f in found],
                "took_ms": round(1000 * (time.perf_counter() - t0), 3),
            }
        )

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return HTMLResponse(_static_text("index.html"), headers=_PAGE_HEADERS)

    @app.get("/static/{name}")
    async def static_file(name: str):
        if name not in _STATIC:
            raise StarletteHTTPException(404, f"/static/{name}: no such file")
        return Response(_static_text(name), media_type=_STATIC[name], headers=_PAGE_HEADERS)

    @app.get("/healthz")
    async def healthz():
        h = service.health()
        if h["status"] == "ok":
            writes = app.state.live.write_health() if getattr(app.state, "live", None) is not None else None
            return JSONResponse(
                h if writes is None else {**h, "status": "degraded", "writes": writes}
            )  # searches are answered
        detail = f"loading failed: {service.error}" if service.state == "failed" else f"not ready ({h['status']})"
        return JSONResponse(
            {**h, "error": "not_ready", "detail": detail}, status_code=503, headers={"Retry-After": "1"}
        )

    @app.get("/metrics")
    async def metrics_endpoint():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/admin/reload")
    async def reload(request: Request):
        req = await read_body(request, ReloadRequest)
        if not req.query_tower.strip():
            raise ServiceError(422, "invalid_request", "query_tower: empty path")
        return JSONResponse(await service.reload(req.query_tower))

    add_document_routes(app, service, settings, metrics)  # POST /documents, DELETE /documents/{id} (the live index)
