"""``scalingnote search``: a thin wrapper over :mod:`scalingnote.index` (dense search on any back
end of :mod:`scalingnote.index.backends`; BM25 or hybrid beside an index directory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from scalingnote.cli._options import backend_option_help, backends_located_by
from scalingnote.errors import ScalingNoteError
from scalingnote.index.backends import backend_location, get_backend, open_searcher, resolve_opener
from scalingnote.index.hybrid import MODES, hybrid_queries_to_run, open_hybrid, served_fusion
from scalingnote.index.pipeline import load_tower_for, read_search_queries, search_queries_to_run
from scalingnote.index.searcher import SearchResult, search_options
from scalingnote.live.generation import current_generation, logged_after_generation
from scalingnote.live.milvus import MilvusLive

#: where ``--token`` is read from when not given (the first set wins)
TOKEN_ENVVARS = ["SCALINGNOTE_BACKEND_TOKEN", "MILVUS_TOKEN"]
TOKEN_HELP = "Token of a back end located by URI (user:password or API key)."
COLLECTION_HELP = "Collection (or namespace) name, for a back end located by URI."


def backend_token(token: str | None, deprecated: str | None) -> str | None:
    """``--token``, or the deprecated ``--milvus-token`` (with a note on stderr) when only it is given."""
    if deprecated is None:
        return token
    typer.echo("note: --milvus-token is deprecated; use --token (any back end located by URI)", err=True)
    if token is not None and token != deprecated:
        raise ScalingNoteError("--token and --milvus-token (deprecated) disagree; give --token only")
    return deprecated


def register(app: typer.Typer) -> None:
    @app.command("search")
    def search(
        index: Path | None = typer.Option(
            None, "--index", help=f"Index directory (back ends located by one: {backends_located_by('index')})."
        ),
        query_tower: str | None = typer.Option(
            None,
            "--query-tower",
            help="Query tower: packaged name, HF dir or saved tower dir (modes dense and hybrid).",
        ),
        queries: Path | None = typer.Option(
            None, "--queries", help="queries.jsonl, or a BEIR directory (with --split)."
        ),
        out: Path | None = typer.Option(
            None, "--out", help="TREC run file to write (+ <out>.meta.json); with --queries."
        ),
        query: str | None = typer.Option(
            None,
            "--query",
            help="One query: print its hits (title, snippet, score, semantic ID) as JSON lines instead of writing a run.",
        ),
        split: str | None = typer.Option(
            "test", "--split", help="With a BEIR directory: search the queries judged in qrels/<split>.tsv."
        ),
        k: int = typer.Option(100, "--k", min=1),
        mode: str | None = typer.Option(
            None,
            "--mode",
            help=f"{' | '.join(MODES)} (hybrid: BM25 fused with dense); default: the index's served default (fusion.json, as `scalingnote serve`), else dense.",
        ),
        corpus: Path | None = typer.Option(
            None,
            "--corpus",
            help="(bm25/hybrid) corpus for the BM25 index beside the dense index (built once; default: the saved one or the corpus the index records).",
        ),
        fusion: str | None = typer.Option(
            None,
            "--fusion",
            help="(hybrid) rrf or weighted; default: the index's fusion.json (what `scalingnote serve` uses), else rrf.",
        ),
        rrf_k: int | None = typer.Option(None, "--rrf-k", min=0, help="(hybrid rrf) RRF constant (default 60)."),
        weight: float | None = typer.Option(
            None,
            "--weight",
            min=0.0,
            max=1.0,
            help="(hybrid weighted) weight of the dense side; choose it on validation queries (default: fusion.json's, else 0.5).",
        ),
        norm: str | None = typer.Option(
            None, "--norm", help="(hybrid weighted) minmax or zscore (default: fusion.json's, else minmax)."
        ),
        depth: int | None = typer.Option(
            None, "--depth", min=1, help="(hybrid) candidates from each side before fusion (default 100)."
        ),
        nprobe: int | None = typer.Option(
            None, "--nprobe", min=1, help="IVF lists probed (a back end with an IVF layer)."
        ),
        ef_search: int | None = typer.Option(
            None, "--ef-search", min=1, help="HNSW beam width (a back end with an HNSW graph)."
        ),
        rerank: int | None = typer.Option(
            None,
            "--rerank",
            min=1,
            help="Re-rank the top N candidates with full-precision vectors (a back end that re-ranks).",
        ),
        batch_size: int = typer.Option(256, "--batch-size", min=1),
        backend: str = typer.Option("faiss", "--backend", help=backend_option_help()),
        uri: str | None = typer.Option(
            None,
            "--uri",
            help=f"(back ends located by URI: {backends_located_by('uri')}) for milvus ./file.db (Milvus Lite) or http://127.0.0.1:19530 (a Milvus server).",
        ),
        collection: str = typer.Option("scalingnote", "--collection", help=COLLECTION_HELP),
        token: str | None = typer.Option(None, "--token", envvar=TOKEN_ENVVARS, help=TOKEN_HELP),
        milvus_token: str | None = typer.Option(None, "--milvus-token", hidden=True, help="Deprecated: --token."),
    ) -> None:
        """Search an index (dense on any back end; BM25 or hybrid beside an index directory) and write a
        TREC run, or print one query's hits."""
        # one default with `scalingnote serve`: the index's fusion.json, each flag given overriding it
        fusion_flags = dict(method=fusion, rrf_k=rrf_k, weight=weight, norm=norm, depth=depth)
        fusion_cfg, served_mode = served_fusion(index, **fusion_flags)
        mode_flag, mode = mode, mode or served_mode
        _check_request(mode, query_tower, query, queries, out)
        entry = get_backend(backend, "--backend")
        # the live index as `serve` sees it: batches logged after the current generation are replayed
        # (read-only: the log is neither cut nor compacted); else the current generation itself
        live, local_dir = False, None
        if entry.name == "faiss" and index is not None:
            live = entry.live is not None and logged_after_generation(index)
            index = index if live else current_generation(index)
        location = backend_location(entry, index, uri, "search")
        tower = load_tower_for(query_tower, "query") if mode != "bm25" else None
        if live:
            dense = resolve_opener(entry.live, "back end faiss live")(index, tower, writer=False, corpus=corpus)
        else:
            dense = open_searcher(
                entry,
                index_dir=index,
                uri=uri,
                collection=collection,
                query_tower=tower,
                token=backend_token(token, milvus_token),
            )
            if (
                entry.name == "milvus"
            ):  # its live index (checkpoint + log beside the index directory), read-only, as `serve` sees it
                local_dir = _milvus_local_dir(dense, index)
                if index is None and local_dir is not None:  # the served default of the directory it was exported from
                    fusion_cfg, served_mode = served_fusion(local_dir, **fusion_flags)
                    mode = mode_flag or served_mode
                dense, live = _milvus_live_reader(dense, local_dir, corpus)
        try:
            dense_kw = search_options(dense, entry.name, nprobe=nprobe, ef_search=ef_search, rerank=rerank)
            local = (
                getattr(dense, "local_dir", None) or local_dir
            )  # (milvus: the directory the collection was exported from)
            if mode == "dense" and (query is None or local is None) and not live:  # the back end alone
                if query is not None:
                    _print_hits(_search_one(dense, query, k, dense_kw))
                    return
                qs = read_search_queries(queries, split if queries.is_dir() else None)
                meta = search_queries_to_run(
                    getattr(dense, "root", location),
                    qs,
                    out,
                    k=k,
                    batch_size=batch_size,
                    searcher=dense,
                    **dense_kw,
                    config={"queries": str(queries), "split": split, "query_tower": query_tower, "backend": backend},
                )
                typer.echo(f"wrote {out} ({len(qs)} queries; search {meta['timings']['search_qps']} q/s)", err=True)
                return
            if local is None:
                raise ScalingNoteError(
                    f"--backend {entry.name}: --mode {mode} needs an index directory beside the searcher "
                    "(its BM25 index; the searcher declares none: local_dir), e.g. --backend faiss"
                )
            searcher = (
                dense.searcher(fusion_cfg)
                if live
                else open_hybrid(local, corpus=corpus, fusion=fusion_cfg, bm25=mode != "dense", dense=dense)
            )
            if query is not None:
                _print_hits(searcher.search([query], k, mode=mode, **dense_kw))
                return
            qs = read_search_queries(queries, split if queries.is_dir() else None)
            meta = hybrid_queries_to_run(
                searcher,
                qs,
                out,
                mode=mode,
                k=k,
                batch_size=batch_size,  # type: ignore[arg-type]
                config={"queries": str(queries), "split": split, "query_tower": query_tower},
                **dense_kw,
            )
            typer.echo(
                f"wrote {out} ({len(qs)} queries, mode {mode}; search {meta['timings']['search_qps']} q/s)", err=True
            )
        finally:
            if hasattr(dense, "close"):
                dense.close()


def _milvus_local_dir(base: Any, index: Path | None) -> Path | None:
    """The index directory beside a Milvus collection: ``--index``, else the one the collection
    records it was exported from (when it is still there); None without one."""
    local = index or (base.manifest.get("source") or {}).get("path")
    return Path(local) if local and (Path(local) / "manifest.json").exists() else None


def _milvus_live_reader(base: Any, local: Path | None, corpus: Path | None) -> tuple[Any, bool]:
    """``base`` (a Milvus collection) in the live form ``serve --backend milvus`` serves, opened
    read-only over the index directory ``local`` it was exported from: its BM25 side and titles,
    and the live index's checkpoint and logged batches replayed (nothing written to Milvus or the
    directory, the log not cut), so a search sees live-added documents and no deleted one; without
    ``local``, ``base`` itself (dense only)."""
    if local is None:
        return base, False
    try:
        return MilvusLive(base, local, writer=False, corpus=corpus), True
    except BaseException:
        base.close()
        raise


def _check_request(
    mode: str, query_tower: str | None, query: str | None, queries: Path | None, out: Path | None
) -> None:
    """The option combinations ``scalingnote search`` refuses before opening anything."""
    if mode not in MODES:
        raise ScalingNoteError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode != "bm25" and query_tower is None:
        raise ScalingNoteError(f"--mode {mode} needs --query-tower")
    if (query is None) == (queries is None):
        raise ScalingNoteError("give --queries FILE/DIR with --out RUN, or one --query TEXT")
    if queries is not None and out is None:
        raise ScalingNoteError("--queries needs --out (the TREC run to write)")
    if query is not None and not query.strip():
        raise ScalingNoteError("--query: empty query")


def _search_one(searcher: Any, query: str, k: int, kw: dict[str, Any]) -> SearchResult:
    """One query's hits (a back end's own searcher adds titles and snippets where it stores
    documents: ``attach_documents``)."""
    res = searcher.search([query], k, **kw)
    attach = getattr(searcher, "attach_documents", None)
    return attach(res) if attach is not None else res


def _print_hits(res: SearchResult) -> None:
    """``scalingnote search --query``: one JSON line per hit (rank, id, score, title, snippet, semantic ID)."""
    titles = res.titles[0] if res.titles is not None else None
    snippets = res.snippets[0] if res.snippets is not None else None
    for r, d in enumerate(res.doc_ids[0]):
        hit = {
            "rank": r + 1,
            "doc_id": d,
            "score": round(float(res.scores[0][r]), 6),
            "title": titles[r] if titles is not None else "",
            "snippet": snippets[r] if snippets is not None else "",
            "semantic_id": res.semantic_ids[0][r].tolist() if res.semantic_ids is not None else None,
        }
        typer.echo(json.dumps(hit, ensure_ascii=False))
