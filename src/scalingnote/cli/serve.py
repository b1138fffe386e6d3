"""``scalingnote serve``: a thin wrapper over :mod:`scalingnote.serve` (the load generator that
measures a running service is ``python -m benchmarks.loadgen``, outside the product packages)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import typer

from scalingnote.cli._options import backend_option_help, backends_located_by
from scalingnote.cli.search import COLLECTION_HELP, TOKEN_ENVVARS, TOKEN_HELP, backend_token
from scalingnote.index.backends import backend_location, get_backend
from scalingnote.serve.server import serve
from scalingnote.serve.settings import ServeSettings


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        index: Path | None = typer.Option(
            None,
            "--index",
            help=f"Index directory (`scalingnote index build`); required with a back end located by one ({backends_located_by('index')}); with --backend milvus: the directory the collection was exported from, where the live index keeps its write-ahead log and BM25 side (default: the one the collection records).",
        ),
        query_tower: str = typer.Option(
            ..., "--query-tower", help="Query tower: saved tower dir, HF dir or packaged name (minilm-l6)."
        ),
        host: str = typer.Option("127.0.0.1", "--host", help="Listen address (loopback only unless --allow-remote)."),
        port: int = typer.Option(8080, "--port", min=0, max=65535, help="TCP port (0: a free port, printed at start)."),
        document_tower: str | None = typer.Option(
            None,
            "--document-tower",
            help="Tower that encodes documents added through POST /documents (default: the one the index records, by its saved directory); its fingerprint must equal the index's.",
        ),
        ingest_duty: float = typer.Option(
            0.5,
            "--ingest-duty",
            min=0.01,
            max=1.0,
            help="While searches are answered, encoding documents added through POST /documents uses at most this share of the ingest thread's time (1: no pacing).",
        ),
        corpus: Path | None = typer.Option(
            None,
            "--corpus",
            help="BEIR directory or corpus.jsonl for result titles (default: the corpus recorded with the index's embeddings, if any).",
        ),
        max_batch: int = typer.Option(
            64, "--max-batch", min=1, help="Most queries encoded together in one micro-batch."
        ),
        max_wait_ms: float = typer.Option(
            5.0,
            "--max-wait-ms",
            min=0.0,
            help="Longest wait for a micro-batch to fill, from its first request's arrival.",
        ),
        max_query_chars: int = typer.Option(
            1000, "--max-query-chars", min=1, help="Longest accepted query (characters)."
        ),
        max_k: int = typer.Option(1000, "--max-k", min=1, help="Largest accepted k."),
        max_batch_queries: int = typer.Option(
            256,
            "--max-batch-queries",
            min=1,
            help="Most queries per /search/batch request (searched in chunks of --max-batch/2).",
        ),
        max_queue: int = typer.Option(
            256,
            "--max-queue",
            min=1,
            help="Most queries waiting for the model (a /search/batch counts by its size); past it requests get 503 + Retry-After. /search/batch requests "
            "together may hold at most --batch-queue-share of it (a batch is always admitted when no other batch waits); single /search queries keep "
            "the rest. Worst queue wait ~ max_queue / QPS.",
        ),
        batch_queue_share: float = typer.Option(
            0.5,
            "--batch-queue-share",
            min=0.01,
            max=0.99,
            help="Share of --max-queue that /search/batch requests may hold together; the rest is kept for single /search queries, which also get at "
            "least half of every micro-batch while batches wait.",
        ),
        allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback --host."),
        shutdown_timeout: float = typer.Option(
            30.0, "--shutdown-timeout", min=0.0, help="Seconds to drain requests in flight on shutdown."
        ),
        threads: int | None = typer.Option(None, "--threads", min=1, help="torch intra-op threads (default: torch's)."),
        access_log: bool = typer.Option(
            False, "--access-log/--no-access-log", help="uvicorn access log (one line per request)."
        ),
        log_level: str = typer.Option("info", "--log-level"),
        backend: str = typer.Option("faiss", "--backend", help=backend_option_help()),
        uri: str | None = typer.Option(
            None,
            "--uri",
            help=f"(back ends located by URI: {backends_located_by('uri')}) for milvus ./file.db (Milvus Lite) or http://host:19530.",
        ),
        collection: str = typer.Option("scalingnote", "--collection", help=COLLECTION_HELP),
        token: str | None = typer.Option(None, "--token", envvar=TOKEN_ENVVARS, help=TOKEN_HELP),
        milvus_token: str | None = typer.Option(None, "--milvus-token", hidden=True, help="Deprecated: --token."),
        admin_token: str | None = typer.Option(
            None,
            "--admin-token",
            envvar="SCALINGNOTE_ADMIN_TOKEN",
            show_envvar=True,
            help="Token for /admin/* (>= 16 characters; prefer the env var or --admin-token-file: command lines are visible to other users). Default: a random token, printed at start.",
        ),
        admin_token_file: Path | None = typer.Option(
            None, "--admin-token-file", help="File whose first line is the admin token."
        ),
        query_backend: str = typer.Option(
            "torch", "--query-backend", help="Query encoder: torch (eager PyTorch) or onnx (ONNX Runtime)."
        ),
        onnx_model: Path | None = typer.Option(
            None,
            "--onnx-model",
            help="(onnx) Export dir of `scalingnote models export --format onnx` (its default model: int8 if exported); default: fp32, exported once into the cache.",
        ),
        onnx_threads: int | None = typer.Option(
            None, "--onnx-threads", min=1, help="(onnx) ONNX Runtime intra-op threads (default 2, capped at the cores)."
        ),
    ) -> None:
        """Serve top-k search over HTTP: POST /search, /search/batch, /admin/reload; GET /healthz, /metrics."""
        token = backend_token(token, milvus_token)
        settings = settings_from_options(locals())
        entry = get_backend(backend, "--backend")
        if (
            entry.location == "uri" and index is not None
        ):  # milvus: the local directory of the live index's log and BM25 side
            settings = dataclasses.replace(settings, live_dir=str(index))
        serve(backend_location(entry, index, uri, "serve"), query_tower, settings)


#: ``scalingnote serve`` options whose ServeSettings field has another name
RENAMED = {"shutdown_timeout": "shutdown_timeout_s", "token": "backend_token"}


def settings_from_options(options: dict[str, Any]) -> ServeSettings:
    """The :class:`ServeSettings` of ``scalingnote serve``'s options (keyed by parameter name):
    each option sets the field of its name (:data:`RENAMED` aside), paths as strings, the log
    level in lower case; options that are no field (``index``, ``query_tower``) are left out."""
    fields = {f.name for f in dataclasses.fields(ServeSettings)}
    kw = {
        RENAMED.get(k, k): str(v) if isinstance(v, Path) else v
        for k, v in options.items()
        if RENAMED.get(k, k) in fields
    }
    kw["log_level"] = kw["log_level"].lower()
    return ServeSettings(**kw)
