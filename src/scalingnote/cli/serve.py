"""``scalingnote serve``: a thin wrapper over :mod:`scalingnote.serve` (the load generator that
measures a running service is ``python -m benchmarks.loadgen``, outside the product packages)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from scalingnote.cli._options import backend_option_help, backends_located_by, live_help_option
from scalingnote.cli.search import COLLECTION_HELP, TOKEN_ENVVARS, TOKEN_HELP, backend_token
from scalingnote.index.backends import backend_location, get_backend
from scalingnote.serve.server import serve
from scalingnote.serve.settings import ServeSettings


def _index_help() -> str:
    return (
        "Index directory (`scalingnote index build`); required with a back end located by one "
        f"({backends_located_by('index')}); with --backend milvus: the directory the collection was exported from, "
        "where the live index keeps its write-ahead log and BM25 side (default: the one the collection records)."
    )


def _uri_help() -> str:
    return f"(back ends located by URI: {backends_located_by('uri')}) for milvus ./file.db (Milvus Lite) or http://host:19530."


# the options of ``scalingnote serve`` (typer reads each from its parameter's default); a help
# that lists the back ends is made when the command is built (live_help_option), so it names
# those registered by then
INDEX_OPTION = live_help_option(None, "--index", help_of=_index_help)
QUERY_TOWER_OPTION = typer.Option(
    ..., "--query-tower", help="Query tower: saved tower dir, HF dir or packaged name (minilm-l6)."
)
HOST_OPTION = typer.Option("127.0.0.1", "--host", help="Listen address (loopback only unless --allow-remote).")
PORT_OPTION = typer.Option(8080, "--port", min=0, max=65535, help="TCP port (0: a free port, printed at start).")
DOCUMENT_TOWER_OPTION = typer.Option(
    None,
    "--document-tower",
    help="Tower that encodes documents added through POST /documents (default: the one the index records, "
    "by its saved directory); its fingerprint must equal the index's.",
)
INGEST_DUTY_OPTION = typer.Option(
    0.5,
    "--ingest-duty",
    min=0.01,
    max=1.0,
    help="While searches are answered, encoding documents added through POST /documents uses at most this "
    "share of the ingest thread's time (1: no pacing).",
)
CORPUS_OPTION = typer.Option(
    None,
    "--corpus",
    help="BEIR directory or corpus.jsonl for result titles (default: the corpus recorded with the index's "
    "embeddings, if any).",
)
MAX_BATCH_OPTION = typer.Option(64, "--max-batch", min=1, help="Most queries encoded together in one micro-batch.")
MAX_WAIT_MS_OPTION = typer.Option(
    5.0,
    "--max-wait-ms",
    min=0.0,
    help="Longest wait for a micro-batch to fill, from its first request's arrival.",
)
MAX_QUERY_CHARS_OPTION = typer.Option(1000, "--max-query-chars", min=1, help="Longest accepted query (characters).")
MAX_K_OPTION = typer.Option(1000, "--max-k", min=1, help="Largest accepted k.")
MAX_BATCH_QUERIES_OPTION = typer.Option(
    256,
    "--max-batch-queries",
    min=1,
    help="Most queries per /search/batch request (searched in chunks of --max-batch/2).",
)
MAX_QUEUE_OPTION = typer.Option(
    256,
    "--max-queue",
    min=1,
    help="Most queries waiting for the model (a /search/batch counts by its size); past it requests get 503 + "
    "Retry-After. /search/batch requests "
    "together may hold at most --batch-queue-share of it (a batch is always admitted when no other batch waits); "
    "single /search queries keep "
    "the rest. Worst queue wait ~ max_queue / QPS.",
)
BATCH_QUEUE_SHARE_OPTION = typer.Option(
    0.5,
    "--batch-queue-share",
    min=0.01,
    max=0.99,
    help="Share of --max-queue that /search/batch requests may hold together; the rest is kept for single "
    "/search queries, which also get at "
    "least half of every micro-batch while batches wait.",
)
ALLOW_REMOTE_OPTION = typer.Option(False, "--allow-remote", help="Allow a non-loopback --host.")
SHUTDOWN_TIMEOUT_OPTION = typer.Option(
    30.0, "--shutdown-timeout", min=0.0, help="Seconds to drain requests in flight on shutdown."
)
THREADS_OPTION = typer.Option(None, "--threads", min=1, help="torch intra-op threads (default: torch's).")
ACCESS_LOG_OPTION = typer.Option(
    False, "--access-log/--no-access-log", help="uvicorn access log (one line per request)."
)
LOG_LEVEL_OPTION = typer.Option("info", "--log-level")
BACKEND_OPTION = live_help_option("faiss", "--backend", help_of=backend_option_help)
URI_OPTION = live_help_option(None, "--uri", help_of=_uri_help)
COLLECTION_OPTION = typer.Option("scalingnote", "--collection", help=COLLECTION_HELP)
TOKEN_OPTION = typer.Option(None, "--token", envvar=TOKEN_ENVVARS, help=TOKEN_HELP)
MILVUS_TOKEN_OPTION = typer.Option(None, "--milvus-token", hidden=True, help="Deprecated: --token.")
ADMIN_TOKEN_OPTION = typer.Option(
    None,
    "--admin-token",
    envvar="SCALINGNOTE_ADMIN_TOKEN",
    show_envvar=True,
    help="Token for /admin/* (>= 16 characters; prefer the env var or --admin-token-file: command lines are "
    "visible to other users). Default: a random token, printed at start.",
)
ADMIN_TOKEN_FILE_OPTION = typer.Option(None, "--admin-token-file", help="File whose first line is the admin token.")
QUERY_BACKEND_OPTION = typer.Option(
    "torch", "--query-backend", help="Query encoder: torch (eager PyTorch) or onnx (ONNX Runtime)."
)
ONNX_MODEL_OPTION = typer.Option(
    None,
    "--onnx-model",
    help="(onnx) Export dir of `scalingnote models export --format onnx` (its default model: int8 if exported); "
    "default: fp32, exported once into the cache.",
)
ONNX_THREADS_OPTION = typer.Option(
    None, "--onnx-threads", min=1, help="(onnx) ONNX Runtime intra-op threads (default 2, capped at the cores)."
)


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        index: Path | None = INDEX_OPTION,
        query_tower: str = QUERY_TOWER_OPTION,
        host: str = HOST_OPTION,
        port: int = PORT_OPTION,
        document_tower: str | None = DOCUMENT_TOWER_OPTION,
        ingest_duty: float = INGEST_DUTY_OPTION,
        corpus: Path | None = CORPUS_OPTION,
        max_batch: int = MAX_BATCH_OPTION,
        max_wait_ms: float = MAX_WAIT_MS_OPTION,
        max_query_chars: int = MAX_QUERY_CHARS_OPTION,
        max_k: int = MAX_K_OPTION,
        max_batch_queries: int = MAX_BATCH_QUERIES_OPTION,
        max_queue: int = MAX_QUEUE_OPTION,
        batch_queue_share: float = BATCH_QUEUE_SHARE_OPTION,
        allow_remote: bool = ALLOW_REMOTE_OPTION,
        shutdown_timeout: float = SHUTDOWN_TIMEOUT_OPTION,
        threads: int | None = THREADS_OPTION,
        access_log: bool = ACCESS_LOG_OPTION,
        log_level: str = LOG_LEVEL_OPTION,
        backend: str = BACKEND_OPTION,
        uri: str | None = URI_OPTION,
        collection: str = COLLECTION_OPTION,
        token: str | None = TOKEN_OPTION,
        milvus_token: str | None = MILVUS_TOKEN_OPTION,
        admin_token: str | None = ADMIN_TOKEN_OPTION,
        admin_token_file: Path | None = ADMIN_TOKEN_FILE_OPTION,
        query_backend: str = QUERY_BACKEND_OPTION,
        onnx_model: Path | None = ONNX_MODEL_OPTION,
        onnx_threads: int | None = ONNX_THREADS_OPTION,
    ) -> None:
        """Serve top-k search over HTTP: POST /search, /search/batch, /admin/reload; GET /healthz, /metrics."""
        # each option sets the setting of its name (--shutdown-timeout: shutdown_timeout_s, --token:
        # backend_token), paths as strings, the log level in lower case
        settings = ServeSettings(
            host=host,
            port=port,
            corpus=_path_text(corpus),
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            max_query_chars=max_query_chars,
            max_k=max_k,
            max_batch_queries=max_batch_queries,
            max_queue=max_queue,
            batch_queue_share=batch_queue_share,
            allow_remote=allow_remote,
            shutdown_timeout_s=shutdown_timeout,
            threads=threads,
            access_log=access_log,
            log_level=log_level.lower(),
            backend=backend,
            uri=uri,
            collection=collection,
            backend_token=backend_token(token, milvus_token),
            admin_token=admin_token,
            admin_token_file=_path_text(admin_token_file),
            query_backend=query_backend,
            onnx_model=_path_text(onnx_model),
            onnx_threads=onnx_threads,
            document_tower=document_tower,
            ingest_duty=ingest_duty,
        )
        entry = get_backend(backend, "--backend")
        if entry.location == "uri" and index is not None:
            # milvus: the local directory of the live index's log and BM25 side
            settings = dataclasses.replace(settings, live_dir=str(index))
        serve(backend_location(entry, index, uri, "serve"), query_tower, settings)


def _path_text(path: Path | None) -> str | None:
    """A path option as the setting stores it (a string; None when not given)."""
    return str(path) if path is not None else None
