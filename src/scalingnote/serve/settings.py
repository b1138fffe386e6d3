"""Service settings and the loopback rule."""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass
from typing import Any

from scalingnote.errors import ConfigError, ScalingNoteError


@dataclass
class ServeSettings:
    """Settings of the query service (``scalingnote serve`` options).

    Micro-batching: the batcher takes the first waiting request, then keeps collecting
    until ``max_batch`` queries are gathered or ``max_wait_ms`` have passed since that
    first request arrived; the batch is encoded and searched in one model call.
    Limits: each query at most ``max_query_chars`` characters, ``1 <= k <= max_k``, at
    most ``max_batch_queries`` queries per ``/search/batch`` request, request bodies at
    most ``max_body_bytes``; more than ``max_queue`` waiting queries -> 503 (overload).
    """

    host: str = "127.0.0.1"
    port: int = 8080
    corpus: str | None = None
    max_batch: int = 64
    max_wait_ms: float = 5.0
    max_query_chars: int = 1000
    max_k: int = 1000
    max_rerank: int = 10_000
    max_batch_queries: int = 256
    max_body_bytes: int = 1 << 20
    max_queue: int = 4096
    allow_remote: bool = False
    shutdown_timeout_s: float = 30.0
    threads: int | None = None
    access_log: bool = False
    log_level: str = "info"
    # search back end: "faiss" (the index directory) or "milvus" (a collection exported by
    # `scalingnote index export --to milvus`; scalingnote.index.milvus.MilvusSearcher)
    backend: str = "faiss"
    milvus_uri: str | None = None
    milvus_collection: str = "scalingnote"
    milvus_token: str | None = None
    # query encoder (issue 23): "torch" (eager PyTorch) or "onnx" (ONNX Runtime; scalingnote.serve.query_backend)
    query_backend: str = "torch"
    onnx_model: str | None = None  #: export dir of `scalingnote models export --format onnx` (None: fp32, exported into the cache)
    onnx_threads: int | None = None  #: ONNX Runtime intra-op threads (None: query_backend.DEFAULT_ORT_THREADS)

    def __post_init__(self) -> None:
        def positive(name: str, minimum: float = 1) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < minimum:
                raise ConfigError(None, None, name, f"must be a number >= {minimum}, got {v!r}")

        for name in ("max_batch", "max_query_chars", "max_k", "max_rerank", "max_batch_queries", "max_body_bytes", "max_queue"):
            positive(name)
        positive("max_wait_ms", 0)
        positive("shutdown_timeout_s", 0)
        if self.threads is not None:
            positive("threads")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(None, None, "port", f"must be an integer in 0..65535, got {self.port!r}")
        if self.log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
            raise ConfigError(None, None, "log_level", f"unknown level {self.log_level!r}")
        if self.backend not in ("faiss", "milvus"):
            raise ConfigError(None, None, "backend", f"must be faiss or milvus, got {self.backend!r}")
        if self.backend == "milvus" and not self.milvus_uri:
            raise ConfigError(None, None, "milvus_uri", "required with backend milvus (./file.db for Milvus Lite, or http://host:19530)")
        if self.query_backend not in ("torch", "onnx"):
            raise ConfigError(None, None, "query_backend", f"must be torch or onnx, got {self.query_backend!r}")
        if self.onnx_threads is not None:
            positive("onnx_threads")
        if self.onnx_model is not None and self.query_backend != "onnx":
            raise ConfigError(None, None, "onnx_model", "is used only with query_backend onnx")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
