"""``scalingnote search``: a thin wrapper over :mod:`scalingnote.index` (dense search on any back
end of :mod:`scalingnote.index.backends`; BM25 or hybrid beside an index directory)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import typer

from scalingnote.cli._options import backend_option_help, backends_located_by, live_help_option
from scalingnote.errors import ScalingNoteError
from scalingnote.index.backends import backend_location, get_backend, open_searcher, resolve_opener
from scalingnote.index.hybrid import MODES, Mode, hybrid_queries_to_run, open_hybrid, served_fusion
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


def _index_help() -> str:
    return f"Index directory (back ends located by one: {backends_located_by('index')})."


def _uri_help() -> str:
    return (
        f"(back ends located by URI: {backends_located_by('uri')}) for milvus ./file.db (Milvus Lite) or "
        "http://127.0.0.1:19530 (a Milvus server)."
    )


# the options of ``scalingnote search`` (typer reads each from its parameter's default); a help
# that lists the back ends is made when the command is built (live_help_option), so it names
# those registered by then
INDEX_OPTION = live_help_option(None, "--index", help_of=_index_help)
QUERY_TOWER_OPTION = typer.Option(
    None,
    "--query-tower",
    help="Query tower: packaged name, HF dir or saved tower dir (modes dense and hybrid).",
)
QUERIES_OPTION = typer.Option(None, "--queries", help="queries.jsonl, or a BEIR directory (with --split).")
OUT_OPTION = typer.Option(None, "--out", help="TREC run file to write (+ <out>.meta.json); with --queries.")
QUERY_OPTION = typer.Option(
    None,
    "--query",
    help="One query: print its hits (title, snippet, score, semantic ID) as JSON lines instead of writing a run.",
)
SPLIT_OPTION = typer.Option(
    "test", "--split", help="With a BEIR directory: search the queries judged in qrels/<split>.tsv."
)
K_OPTION = typer.Option(100, "--k", min=1)
MODE_OPTION = typer.Option(
    None,
    "--mode",
    help=f"{' | '.join(MODES)} (hybrid: BM25 fused with dense); default: the index's served default "
    "(fusion.json, as `scalingnote serve`), else dense.",
)
CORPUS_OPTION = typer.Option(
    None,
    "--corpus",
    help="(bm25/hybrid) corpus for the BM25 index beside the dense index (built once; default: the saved one "
    "or the corpus the index records).",
)
FUSION_OPTION = typer.Option(
    None,
    "--fusion",
    help="(hybrid) rrf or weighted; default: the index's fusion.json (what `scalingnote serve` uses), else rrf.",
)
RRF_K_OPTION = typer.Option(None, "--rrf-k", min=0, help="(hybrid rrf) RRF constant (default 60).")
WEIGHT_OPTION = typer.Option(
    None,
    "--weight",
    min=0.0,
    max=1.0,
    help="(hybrid weighted) weight of the dense side; choose it on validation queries (default: fusion.json's, "
    "else 0.5).",
)
NORM_OPTION = typer.Option(
    None, "--norm", help="(hybrid weighted) minmax or zscore (default: fusion.json's, else minmax)."
)
DEPTH_OPTION = typer.Option(
    None, "--depth", min=1, help="(hybrid) candidates from each side before fusion (default 100)."
)
NPROBE_OPTION = typer.Option(None, "--nprobe", min=1, help="IVF lists probed (a back end with an IVF layer).")
EF_SEARCH_OPTION = typer.Option(None, "--ef-search", min=1, help="HNSW beam width (a back end with an HNSW graph).")
RERANK_OPTION = typer.Option(
    None,
    "--rerank",
    min=1,
    help="Re-rank the top N candidates with full-precision vectors (a back end that re-ranks).",
)
BATCH_SIZE_OPTION = typer.Option(256, "--batch-size", min=1)
BACKEND_OPTION = live_help_option("faiss", "--backend", help_of=backend_option_help)
URI_OPTION = live_help_option(None, "--uri", help_of=_uri_help)
COLLECTION_OPTION = typer.Option("scalingnote", "--collection", help=COLLECTION_HELP)
TOKEN_OPTION = typer.Option(None, "--token", envvar=TOKEN_ENVVARS, help=TOKEN_HELP)
MILVUS_TOKEN_OPTION = typer.Option(None, "--milvus-token", hidden=True, help="Deprecated: --token.")


@dataclass
class _Output:
    """What ``scalingnote search`` searches and where the hits go: one ``query`` printed, or the
    ``queries`` of a file or BEIR directory (``split``) written to the TREC run ``out``."""

    query: str | None
    queries: Path | None
    out: Path | None
    split: str | None
    k: int
    batch_size: int
    query_tower: str | None


def register(app: typer.Typer) -> None:
    @app.command("search")
    def search(
        index: Path | None = INDEX_OPTION,
        query_tower: str | None = QUERY_TOWER_OPTION,
        queries: Path | None = QUERIES_OPTION,
        out: Path | None = OUT_OPTION,
        query: str | None = QUERY_OPTION,
        split: str | None = SPLIT_OPTION,
        k: int = K_OPTION,
        mode: str | None = MODE_OPTION,
        corpus: Path | None = CORPUS_OPTION,
        fusion: str | None = FUSION_OPTION,
        rrf_k: int | None = RRF_K_OPTION,
        weight: float | None = WEIGHT_OPTION,
        norm: str | None = NORM_OPTION,
        depth: int | None = DEPTH_OPTION,
        nprobe: int | None = NPROBE_OPTION,
        ef_search: int | None = EF_SEARCH_OPTION,
        rerank: int | None = RERANK_OPTION,
        batch_size: int = BATCH_SIZE_OPTION,
        backend: str = BACKEND_OPTION,
        uri: str | None = URI_OPTION,
        collection: str = COLLECTION_OPTION,
        token: str | None = TOKEN_OPTION,
        milvus_token: str | None = MILVUS_TOKEN_OPTION,
    ) -> None:
        """Search an index (dense on any back end; BM25 or hybrid beside an index directory) and write a
        TREC run, or print one query's hits."""
        # one default with `scalingnote serve`: the index's fusion.json, each flag given overriding it
        fusion_flags = dict(method=fusion, rrf_k=rrf_k, weight=weight, norm=norm, depth=depth)
        fusion_cfg, served_mode = served_fusion(index, **fusion_flags)
        mode_flag, chosen = mode, mode or served_mode
        checked = _check_request(chosen, query_tower, query, queries, out)
        entry = get_backend(backend, "--backend")
        # the live index as `serve` sees it: batches logged after the current generation are replayed
        # (read-only: the log is neither cut nor compacted); else the current generation itself
        live, local_dir = False, None
        if entry.name == "faiss" and index is not None:
            live = entry.live is not None and logged_after_generation(index)
            index = index if live else current_generation(index)
        location = backend_location(entry, index, uri, "search")
        tower = None
        if checked != "bm25":
            assert query_tower is not None  # _check_request: modes dense and hybrid need --query-tower
            tower = load_tower_for(query_tower, "query")
        if live:
            assert entry.live is not None  # live is only set for a back end with a live form
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
            if entry.name == "milvus":
                # its live index (checkpoint + log beside the index directory), read-only, as `serve` sees it
                local_dir = _milvus_local_dir(dense, index)
                if index is None and local_dir is not None:  # the served default of the directory it was exported from
                    fusion_cfg, served_mode = served_fusion(local_dir, **fusion_flags)
                    checked = _mode(mode_flag or served_mode)
                dense, live = _milvus_live_reader(dense, local_dir, corpus)
        output = _Output(query, queries, out, split, k, batch_size, query_tower)
        try:
            dense_kw = search_options(dense, entry.name, nprobe=nprobe, ef_search=ef_search, rerank=rerank)
            # (milvus: the directory the collection was exported from)
            local = getattr(dense, "local_dir", None) or local_dir
            if checked == "dense" and (query is None or local is None) and not live:  # the back end alone
                _search_dense(dense, getattr(dense, "root", location), output, dense_kw, backend)
                return
            if local is None:
                raise ScalingNoteError(
                    f"--backend {entry.name}: --mode {checked} needs an index directory beside the searcher "
                    "(its BM25 index; the searcher declares none: local_dir), e.g. --backend faiss"
                )
            searcher = (
                dense.searcher(fusion_cfg)
                if live
                else open_hybrid(local, corpus=corpus, fusion=fusion_cfg, bm25=checked != "dense", dense=dense)
            )
            _search_hybrid(searcher, checked, output, dense_kw)
        finally:
            if hasattr(dense, "close"):
                dense.close()


def _search_dense(dense: Any, root: Any, output: _Output, dense_kw: dict[str, Any], backend: str) -> None:
    """Mode dense on the back end alone: print ``output.query``'s hits, or write the run of ``output.queries``."""
    if output.query is not None:
        _print_hits(_search_one(dense, output.query, output.k, dense_kw))
        return
    queries, out = output.queries, output.out
    assert queries is not None and out is not None  # _check_request: --queries (with --out) when no --query
    qs = read_search_queries(queries, output.split if queries.is_dir() else None)
    meta = search_queries_to_run(
        root,
        qs,
        out,
        k=output.k,
        batch_size=output.batch_size,
        searcher=dense,
        **dense_kw,
        config={"queries": str(queries), "split": output.split, "query_tower": output.query_tower, "backend": backend},
    )
    typer.echo(f"wrote {out} ({len(qs)} queries; search {meta['timings']['search_qps']} q/s)", err=True)


def _search_hybrid(searcher: Any, mode: Mode, output: _Output, dense_kw: dict[str, Any]) -> None:
    """Modes bm25 and hybrid (and dense through the live index): print ``output.query``'s hits, or
    write the run of ``output.queries``."""
    if output.query is not None:
        _print_hits(searcher.search([output.query], output.k, mode=mode, **dense_kw))
        return
    queries, out = output.queries, output.out
    assert queries is not None and out is not None  # _check_request: --queries (with --out) when no --query
    qs = read_search_queries(queries, output.split if queries.is_dir() else None)
    meta = hybrid_queries_to_run(
        searcher,
        qs,
        out,
        mode=mode,
        k=output.k,
        batch_size=output.batch_size,
        config={"queries": str(queries), "split": output.split, "query_tower": output.query_tower},
        **dense_kw,
    )
    typer.echo(f"wrote {out} ({len(qs)} queries, mode {mode}; search {meta['timings']['search_qps']} q/s)", err=True)


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


def _is_mode(mode: str) -> TypeGuard[Mode]:
    return mode in MODES


def _mode(mode: str) -> Mode:
    """``mode`` if it is one of :data:`MODES`; else a clear error."""
    if not _is_mode(mode):
        raise ScalingNoteError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def _check_request(
    mode: str, query_tower: str | None, query: str | None, queries: Path | None, out: Path | None
) -> Mode:
    """The option combinations ``scalingnote search`` refuses before opening anything; the mode."""
    checked = _mode(mode)
    if mode != "bm25" and query_tower is None:
        raise ScalingNoteError(f"--mode {mode} needs --query-tower")
    if (query is None) == (queries is None):
        raise ScalingNoteError("give --queries FILE/DIR with --out RUN, or one --query TEXT")
    if queries is not None and out is None:
        raise ScalingNoteError("--queries needs --out (the TREC run to write)")
    if query is not None and not query.strip():
        raise ScalingNoteError("--query: empty query")
    return checked


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
