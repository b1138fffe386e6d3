"""``scalingnote serve`` and ``scalingnote loadtest``: thin wrappers over :mod:`scalingnote.serve`."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        index: Path | None = typer.Option(None, "--index", help="Index directory (`scalingnote index build`); required with --backend faiss."),
        query_tower: str = typer.Option(..., "--query-tower", help="Query tower: saved tower dir, HF dir or packaged name (minilm-l6)."),
        host: str = typer.Option("127.0.0.1", "--host", help="Listen address (loopback only unless --allow-remote)."),
        port: int = typer.Option(8080, "--port", min=0, max=65535, help="TCP port (0: a free port, printed at start)."),
        corpus: Path | None = typer.Option(None, "--corpus", help="BEIR directory or corpus.jsonl for result titles (default: the corpus recorded with the index's embeddings, if any)."),
        max_batch: int = typer.Option(64, "--max-batch", min=1, help="Most queries encoded together in one micro-batch."),
        max_wait_ms: float = typer.Option(5.0, "--max-wait-ms", min=0.0, help="Longest wait for a micro-batch to fill, from its first request's arrival."),
        max_query_chars: int = typer.Option(1000, "--max-query-chars", min=1, help="Longest accepted query (characters)."),
        max_k: int = typer.Option(1000, "--max-k", min=1, help="Largest accepted k."),
        max_batch_queries: int = typer.Option(256, "--max-batch-queries", min=1, help="Most queries per /search/batch request."),
        max_queue: int = typer.Option(256, "--max-queue", min=1, help="Most queries waiting for the model; past it requests get 503 + Retry-After. Worst queue wait ~ max_queue / QPS."),
        allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback --host."),
        shutdown_timeout: float = typer.Option(30.0, "--shutdown-timeout", min=0.0, help="Seconds to drain requests in flight on shutdown."),
        threads: int | None = typer.Option(None, "--threads", min=1, help="torch intra-op threads (default: torch's)."),
        access_log: bool = typer.Option(False, "--access-log/--no-access-log", help="uvicorn access log (one line per request)."),
        log_level: str = typer.Option("info", "--log-level"),
        backend: str = typer.Option("faiss", "--backend", help="faiss (--index DIR) or milvus (--uri, --collection: `scalingnote index export --to milvus`)."),
        uri: str | None = typer.Option(None, "--uri", help="(milvus) ./file.db (Milvus Lite) or http://host:19530."),
        collection: str = typer.Option("scalingnote", "--collection", help="(milvus) Collection name."),
        milvus_token: str | None = typer.Option(None, "--milvus-token", envvar="MILVUS_TOKEN", help="(milvus) Token (user:password or API key)."),
        admin_token: str | None = typer.Option(
            None, "--admin-token", envvar="SCALINGNOTE_ADMIN_TOKEN", show_envvar=True,
            help="Token for /admin/* (>= 16 characters; prefer the env var or --admin-token-file: command lines are visible to other users). Default: a random token, printed at start.",
        ),
        admin_token_file: Path | None = typer.Option(None, "--admin-token-file", help="File whose first line is the admin token."),
        query_backend: str = typer.Option("torch", "--query-backend", help="Query encoder: torch (eager PyTorch) or onnx (ONNX Runtime)."),
        onnx_model: Path | None = typer.Option(None, "--onnx-model", help="(onnx) Export dir of `scalingnote models export --format onnx` (its default model: int8 if exported); default: fp32, exported once into the cache."),
        onnx_threads: int | None = typer.Option(None, "--onnx-threads", min=1, help="(onnx) ONNX Runtime intra-op threads (default 2, capped at the cores)."),
    ) -> None:
        """Serve top-k search over HTTP: POST /search, /search/batch, /admin/reload; GET /healthz, /metrics."""
        from scalingnote.serve import ServeSettings, serve

        settings = ServeSettings(
            host=host,
            port=port,
            corpus=str(corpus) if corpus is not None else None,
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            max_query_chars=max_query_chars,
            max_k=max_k,
            max_batch_queries=max_batch_queries,
            max_queue=max_queue,
            allow_remote=allow_remote,
            shutdown_timeout_s=shutdown_timeout,
            threads=threads,
            access_log=access_log,
            log_level=log_level.lower(),
            backend=backend,
            milvus_uri=uri,
            milvus_collection=collection,
            milvus_token=milvus_token,
            admin_token=admin_token,
            admin_token_file=str(admin_token_file) if admin_token_file is not None else None,
            query_backend=query_backend,
            onnx_model=str(onnx_model) if onnx_model is not None else None,
            onnx_threads=onnx_threads,
        )
        if backend == "faiss" and index is None:
            from scalingnote.errors import ScalingNoteError

            raise ScalingNoteError("serve: --index DIR is required with --backend faiss")
        serve(index if backend == "faiss" else uri, query_tower, settings)

    @app.command("loadtest")
    def loadtest_cmd(
        url: str = typer.Option(..., "--url", help="Service URL on loopback, e.g. http://127.0.0.1:8080."),
        queries: Path = typer.Option(..., "--queries", help="BEIR queries.jsonl (or BEIR dir), or a text file with one query per line."),
        concurrency: int = typer.Option(8, "--concurrency", min=1, help="Concurrent clients (closed loop)."),
        duration: float = typer.Option(10.0, "--duration", min=0.001, help="Seconds to run."),
        max_requests: int | None = typer.Option(None, "--max-requests", min=1, help="Stop after this many requests."),
        k: int = typer.Option(10, "--k", min=1),
        rerank: int | None = typer.Option(None, "--rerank", min=1, help="Ask the service to re-rank N candidates."),
        timeout: float = typer.Option(30.0, "--timeout", min=0.001, help="Per-request timeout (seconds)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the query order."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
        out: Path | None = typer.Option(None, "--out", help="Also write the result + config + versions as JSON (atomically)."),
    ) -> None:
        """Load-test a running service (loopback only): QPS, p50/p95/p99 latency, errors."""
        from scalingnote.serve import check_loopback_url, read_queries_file, run_loadtest
        from scalingnote.utils import run_metadata, write_json

        check_loopback_url(url)  # refuse before reading anything
        texts = read_queries_file(queries)
        res = run_loadtest(
            url, texts, concurrency=concurrency, duration_s=duration, max_requests=max_requests, k=k, timeout_s=timeout, seed=seed,
            extra={"rerank": rerank} if rerank is not None else None,
        )
        if out is not None:
            meta = run_metadata({"url": url, "queries": str(queries), "concurrency": concurrency, "duration": duration,
                                 "max_requests": max_requests, "k": k, "rerank": rerank, "timeout": timeout, "seed": seed})
            meta["result"] = res.to_dict()
            write_json(out, meta)
        if as_json:
            typer.echo(json.dumps(res.to_dict()))
        else:
            typer.echo(res.table())
        _exit_unless_any_succeeded(res)


def _exit_unless_any_succeeded(res) -> None:
    """``scalingnote loadtest`` exits 1 when no request succeeded (a closed port, a broken service)."""
    if res.ok == 0:
        typer.echo(f"loadtest: no request succeeded ({res.errors} errors, stopped by {res.stopped_by})", err=True)
        raise typer.Exit(1)
