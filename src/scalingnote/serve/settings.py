"""Service settings, the loopback rule and the admin rule."""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.index.backends import get_backend
from scalingnote.serve.processing import ServiceError

#: field metadata of a numeric setting that must be >= 1 / >= 0 (checked by ServeSettings)
AT_LEAST_1: dict[str, Any] = {"min": 1}
AT_LEAST_0: dict[str, Any] = {"min": 0}


@dataclass
class ServeSettings:
    """Settings of the query service (``scalingnote serve`` options).

    Micro-batching: the batcher takes the first waiting request, then keeps collecting
    until ``max_batch`` queries are gathered or ``max_wait_ms`` have passed since that
    first request arrived; the batch is encoded and searched in one model call.
    Limits: each query at most ``max_query_chars`` characters, ``1 <= k <= max_k``, at
    most ``max_batch_queries`` queries per ``/search/batch`` request, request bodies at
    most ``max_body_bytes``.

    Overload: at most ``max_queue`` queries wait for the model worker, a ``/search/batch``
    request counted by its size; a request that does not fit is shed at once with 503 +
    ``Retry-After``. Batches share the queue fairly (:mod:`scalingnote.serve.lanes`): batch
    requests together hold at most ``batch_queue_share x max_queue`` queries (a batch is
    always admitted when no other batch waits, so one of up to ``max_batch_queries`` is never
    refused for its size alone), and single ``/search`` queries always keep at least
    ``(1 - batch_queue_share) x max_queue`` places: a legal batch into an empty queue cannot
    make single queries fail. While both wait, single queries get at least half of every
    micro-batch (a batch is searched in chunks of ``max_batch // 2``). The worst queue wait is
    about ``max_queue / throughput``: pick
    ``max_queue ~= latency budget (s) x measured QPS`` (``benchmarks/serve_loadtest.py``
    measures QPS per concurrency and the offline ceiling; see the README for the numbers).
    The default 256 admits 64+ closed-loop clients with no 503 and bounds the wait to a few
    seconds at the tens of queries per second a shared 2-core CPU serves with MiniLM.
    ``max_wait_ms`` only adds latency at low load; ``max_batch`` caps one model call.

    Admin endpoints (``/admin/*``) need the admin token (``Authorization: Bearer TOKEN``
    or ``X-Admin-Token: TOKEN``) from a loopback client, and refuse requests that carry
    proxy forwarding headers. The token is ``admin_token``, else the first line of
    ``admin_token_file``, else generated at start (``resolve_admin_token``).
    """

    #: listen address (loopback only unless ``allow_remote``) and TCP port (0: a free port)
    host: str = "127.0.0.1"
    port: int = 8080
    #: BEIR directory or corpus file for result titles (None: the corpus the index records)
    corpus: str | None = None
    #: micro-batching: most queries in one model call; longest wait for a batch to fill
    max_batch: int = field(default=64, metadata=AT_LEAST_1)
    max_wait_ms: float = field(default=5.0, metadata=AT_LEAST_0)
    #: input limits (422 past them): query characters, k, re-rank depth and ef_search
    max_query_chars: int = field(default=1000, metadata=AT_LEAST_1)
    max_k: int = field(default=1000, metadata=AT_LEAST_1)
    max_rerank: int = field(default=10_000, metadata=AT_LEAST_1)
    #: queries per /search/batch request; request body bytes
    max_batch_queries: int = field(default=256, metadata=AT_LEAST_1)
    max_body_bytes: int = field(default=1 << 20, metadata=AT_LEAST_1)
    #: queries waiting for the model worker (503 + Retry-After past it)
    max_queue: int = field(default=256, metadata=AT_LEAST_1)
    batch_queue_share: float = 0.5  #: share of max_queue that /search/batch requests may hold together (0 < share < 1)
    allow_remote: bool = False
    shutdown_timeout_s: float = field(default=30.0, metadata=AT_LEAST_0)
    threads: int | None = field(default=None, metadata=AT_LEAST_1)  #: torch intra-op threads (None: torch's own)
    access_log: bool = False
    log_level: str = "info"
    # search back end: a name of scalingnote.index.backends ("faiss": the index directory;
    # "milvus": a collection exported by `scalingnote index export --to milvus`), or a dotted
    # path "package.module:attribute"; a back end located by URI reads uri / collection / token
    backend: str = "faiss"
    uri: str | None = None
    collection: str = "scalingnote"
    backend_token: str | None = field(default=None, repr=False)
    admin_token: str | None = field(default=None, repr=False)
    admin_token_file: str | None = None
    # query encoder: "torch" (eager PyTorch) or "onnx" (ONNX Runtime; scalingnote.serve.query_backend)
    query_backend: str = "torch"
    onnx_model: str | None = (
        None  #: export dir of `scalingnote models export --format onnx` (None: fp32, exported into the cache)
    )
    onnx_threads: int | None = field(
        default=None, metadata=AT_LEAST_1
    )  #: ONNX Runtime intra-op threads (None: query_backend.DEFAULT_ORT_THREADS)
    # the live index (scalingnote.live, scalingnote.serve.documents)
    #: serve the back end's live form where it has one (faiss: POST /documents, write-ahead log replayed at start)
    live: bool = True
    document_tower: str | None = None  #: tower encoding new documents (None: the one the index records)
    #: (back ends located by URI: milvus) the local index directory beside which the live index keeps
    #: its write-ahead log and BM25 side (`serve --index DIR`; None: the directory the collection was exported from)
    live_dir: str | None = None
    max_document_chars: int = field(
        default=100_000, metadata=AT_LEAST_1
    )  #: largest accepted document (title + topic + text)
    max_documents_per_request: int = field(default=1024, metadata=AT_LEAST_1)
    live_compact_docs: int = field(
        default=2000, metadata=AT_LEAST_1
    )  #: compact when the BM25 delta + tombstones reach this many documents
    #: while searches are being answered, encoding new documents uses at most this share of the
    #: ingest thread's wall time (it pauses between chunks of 16 documents), so searches keep their
    #: CPU; 1 = no pacing. Ingest runs at full speed whenever no search ran in the last second.
    ingest_duty: float = 0.5
    reload_min_overlap: float = 0.5  #: /admin/reload refuses a tower whose top-10 overlap with the running one is lower
    reload_sample_queries: int = field(
        default=64, metadata=AT_LEAST_1
    )  #: recent queries the reload check compares the towers on

    def __post_init__(self) -> None:
        for f in fields(self):  # the numeric settings with a lower bound (AT_LEAST_*; None where None is the default)
            v = getattr(self, f.name)
            if "min" in f.metadata and not (v is None and f.default is None):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v < f.metadata["min"]:
                    raise ConfigError(None, None, f.name, f"must be a number >= {f.metadata['min']}, got {v!r}")
        share = self.batch_queue_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
            raise ConfigError(
                None,
                None,
                "batch_queue_share",
                f"must be a number in (0, 1): the rest of max_queue is kept for single queries, got {share!r}",
            )
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(None, None, "port", f"must be an integer in 0..65535, got {self.port!r}")
        if self.log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
            raise ConfigError(None, None, "log_level", f"unknown level {self.log_level!r}")
        try:
            entry = get_backend(self.backend, "backend")
        except ScalingNoteError as e:
            raise ConfigError(None, None, "backend", str(e)) from None
        if entry.location == "uri" and not self.uri:
            raise ConfigError(
                None, None, "uri", f"required with backend {entry.name} ({entry.help or 'the back end service URI'})"
            )
        if self.query_backend not in ("torch", "onnx"):
            raise ConfigError(None, None, "query_backend", f"must be torch or onnx, got {self.query_backend!r}")
        if self.onnx_model is not None and self.query_backend != "onnx":
            raise ConfigError(None, None, "onnx_model", "is used only with query_backend onnx")
        if (
            isinstance(self.ingest_duty, bool)
            or not isinstance(self.ingest_duty, (int, float))
            or not 0 < self.ingest_duty <= 1
        ):
            raise ConfigError(None, None, "ingest_duty", f"must be in (0, 1], got {self.ingest_duty!r}")
        if (
            isinstance(self.reload_min_overlap, bool)
            or not isinstance(self.reload_min_overlap, (int, float))
            or not 0 <= self.reload_min_overlap <= 1
        ):
            raise ConfigError(None, None, "reload_min_overlap", f"must be in [0, 1], got {self.reload_min_overlap!r}")

        if self.admin_token is not None:
            _check_token(self.admin_token, "admin_token")

    def to_dict(self) -> dict[str, Any]:
        """The settings without secrets (tokens are shown as ``"***"``)."""
        d = asdict(self)
        for k in ("admin_token", "backend_token"):
            if d.get(k) is not None:
                d[k] = "***"
        return d


ADMIN_TOKEN_MIN_CHARS = 16


def _check_token(token: str, where: str) -> str:
    if (
        not isinstance(token, str)
        or len(token.strip()) < ADMIN_TOKEN_MIN_CHARS
        or any(c.isspace() for c in token.strip())
    ):
        raise ConfigError(
            None, None, where, f"the admin token must be at least {ADMIN_TOKEN_MIN_CHARS} characters without spaces"
        )
    return token.strip()


def resolve_admin_token(settings: ServeSettings) -> tuple[str, str]:
    """``(token, source)``: ``settings.admin_token`` ("option"), else the first line of
    ``settings.admin_token_file`` ("file"), else a new random token ("generated")."""
    if settings.admin_token is not None:
        return _check_token(settings.admin_token, "admin_token"), "option"
    if settings.admin_token_file is not None:
        p = Path(settings.admin_token_file)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(
                p, None, "admin_token_file", f"cannot read the admin token file: {getattr(e, 'strerror', None) or e}"
            ) from None
        first = text.strip().splitlines()[0] if text.strip() else ""
        try:
            return _check_token(first, "admin_token_file"), "file"
        except ConfigError as e:
            raise ConfigError(p, 1, "admin_token_file", e.reason) from None
    return secrets.token_urlsafe(32), "generated"


#: Headers a reverse proxy adds; an admin request carrying one came through a proxy.
FORWARDING_HEADERS = (
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-port",
    "x-forwarded-server",
    "x-real-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "via",
)


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1`` (nothing else)."""
    h = (host or "").strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def check_bind_host(host: str, allow_remote: bool) -> None:
    """Refuse to listen on a non-loopback address unless ``allow_remote``."""
    if not is_loopback_host(host) and not allow_remote:
        raise ScalingNoteError(
            f"--host {host!r} is not a loopback address: the service listens on 127.0.0.1 / ::1 / localhost only, "
            "unless --allow-remote is given (then put it behind your own authentication)"
        )


def admin_denial(
    path: str, headers: dict[str, str], client_host: str, token: bytes, metrics: Any
) -> ServiceError | None:
    """Why an ``/admin/*`` request is refused (None: allowed). Checked before routing and
    body parsing: proxy forwarding headers (403), a non-loopback peer (403), then the token
    (401; compared in constant time)."""
    proxied = [h for h in FORWARDING_HEADERS if h in headers]
    if proxied:
        metrics.rejected.inc(reason="admin_proxied")
        return ServiceError(
            403,
            "forbidden",
            f"{path}: refused, the request carries proxy forwarding headers ({', '.join(proxied)}); call admin "
            "endpoints directly on loopback",
        )
    if not is_loopback_host(client_host):
        metrics.rejected.inc(reason="admin_remote")
        return ServiceError(403, "forbidden", f"{path} is accepted from loopback clients only")
    scheme, _, value = headers.get("authorization", "").partition(" ")
    given = value.strip() if scheme.lower() == "bearer" else headers.get("x-admin-token", "").strip()
    if not given or not hmac.compare_digest(given.encode("latin-1", "replace"), token):
        metrics.rejected.inc(reason="admin_unauthorized")
        return ServiceError(
            401,
            "unauthorized",
            f"{path} needs the admin token: 'Authorization: Bearer TOKEN' (printed by `scalingnote serve` at start, "
            "or set with --admin-token-file / SCALINGNOTE_ADMIN_TOKEN)",
        )
    return None
