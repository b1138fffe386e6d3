"""``scalingnote index encode|build|tune|export|milvus-server|info|bm25`` and ``scalingnote search``: thin
wrappers over :mod:`scalingnote.index`. The options of ``index build`` are generated from
:class:`~scalingnote.index.build.IndexConfig`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from scalingnote.cli._options import with_config_options
from scalingnote.index.build import IndexConfig


def register(app: typer.Typer) -> None:
    index_app = typer.Typer(help="Corpus encoding, FAISS indexes, semantic IDs.", no_args_is_help=True)
    for add in (_encode, _build, _tune, _export, _milvus_server, _info, _bm25):
        add(index_app)
    from scalingnote.cli.index_live import register_live

    register_live(index_app)  # add | delete | rebuild (the live index)
    app.add_typer(index_app, name="index")
    _search(app)


def _encode(index_app: typer.Typer) -> None:
    @index_app.command("encode")
    def encode(
        tower: str = typer.Option(..., "--tower", help="Document tower: packaged name (minilm-l6, smollm2-135m), HF dir, .gguf or saved tower dir."),
        data: Path = typer.Option(..., "--data", help="BEIR directory or corpus.jsonl."),
        out: Path = typer.Option(..., "--out", help="Embeddings directory (resumed if it exists)."),
        shard_size: int = typer.Option(10_000, "--shard-size", min=1, help="Documents per shard file."),
        batch_size: int = typer.Option(64, "--batch-size", min=1),
        num_layers: int | None = typer.Option(None, "--num-layers", min=1, help="Keep the first N transformer layers of a base model."),
        engine: str = typer.Option("local", "--engine", help="local (in-process) or ray (Ray Data actor pool; reads BEIR JSONL or Parquet)."),
        address: str | None = typer.Option(None, "--address", help="(ray) Ray cluster address (default: start a local one on 127.0.0.1)."),
        num_actors: int = typer.Option(2, "--num-actors", min=1, help="(ray) Actors in the pool (one tower load each)."),
        cpus_per_actor: float = typer.Option(0.5, "--cpus-per-actor", min=0.0, help="(ray) CPUs reserved per actor (< 1 on small machines)."),
        gpus_per_actor: float = typer.Option(0.0, "--gpus-per-actor", min=0.0, help="(ray) GPUs reserved per actor."),
        feature_cache: Path | None = typer.Option(None, "--feature-cache", help="(local) Feature-cache root of a training run: reuse the cached pooled states of the tower's backbone."),
    ) -> None:
        """Encode a corpus into sharded embeddings; an interrupted run resumes where it stopped."""
        from scalingnote.errors import ScalingNoteError
        from scalingnote.index.pipeline import encode_with_tower

        if engine == "ray":
            from scalingnote.index.ray_encode import encode_corpus_ray

            res = encode_corpus_ray(
                tower, data, out, shard_size=shard_size, batch_size=batch_size, num_layers=num_layers, address=address,
                num_actors=num_actors, cpus_per_actor=cpus_per_actor, gpus_per_actor=gpus_per_actor,
            )
        elif engine == "local":
            res = encode_with_tower(tower, data, out, shard_size=shard_size, batch_size=batch_size, num_layers=num_layers,
                                    feature_cache=feature_cache)
        else:
            raise ScalingNoteError(f"--engine {engine!r}: choose local or ray")
        typer.echo(
            f"{out}: {res.n_docs} documents in {res.n_shards} shards "
            f"({res.shards_written} written, {res.shards_skipped} resumed), {res.docs_per_s:.1f} docs/s",
            err=True,
        )


def _build(index_app: typer.Typer) -> None:
    @index_app.command("build")
    @with_config_options(IndexConfig)
    def build(
        out: Path = typer.Option(..., "--out", help="Index directory to create."),
        embeddings: Path | None = typer.Option(None, "--embeddings", help="Embeddings directory from `index encode`."),
        tower: str | None = typer.Option(None, "--tower", help="Encode first with this document tower (with --data)."),
        data: Path | None = typer.Option(None, "--data", help="BEIR directory or corpus.jsonl to encode (with --tower)."),
        embeddings_out: Path | None = typer.Option(None, "--embeddings-out", help="Where --tower/--data writes embeddings (default <out>.embeddings)."),
        shard_size: int = typer.Option(10_000, "--shard-size", min=1),
        batch_size: int = typer.Option(64, "--batch-size", min=1),
        num_layers: int | None = typer.Option(None, "--num-layers", min=1),
        cfg: IndexConfig = None,  # type: ignore[assignment]  # one option per IndexConfig field
    ) -> None:
        """Build a FAISS index (+ semantic IDs) from embeddings, or encode and build in one go."""
        from scalingnote.errors import ScalingNoteError
        from scalingnote.index import build_index
        from scalingnote.index.pipeline import encode_with_tower

        if embeddings is None:
            if tower is None or data is None:
                raise ScalingNoteError("index build: give --embeddings DIR, or --tower NAME and --data DIR to encode first")
            embeddings = embeddings_out or out.with_name(out.name + ".embeddings")
            encode_with_tower(tower, data, embeddings, shard_size=shard_size, batch_size=batch_size, num_layers=num_layers)
        elif tower is not None or data is not None:
            raise ScalingNoteError("index build: --embeddings and --tower/--data are alternatives; give one")
        path = build_index(embeddings, out, **cfg.kwargs())
        m = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
        typer.echo(
            f"{path}: {m['factory']} over {m['n_vectors']} x {m['dim']}-d vectors, "
            f"{m['code_bytes_per_vector']} code bytes/vector, built in {m['build_seconds']:.1f}s",
            err=True,
        )


def _export(index_app: typer.Typer) -> None:
    @index_app.command("export")
    def export(
        to: str = typer.Option("milvus", "--to", help="Target back end (scalingnote.index.backends; one with an export: milvus), or a dotted path 'package.module:attribute'."),
        uri: str = typer.Option(..., "--uri", help="Where to: for milvus ./file.db (Milvus Lite, embedded, no PQ) or http://127.0.0.1:19530 (`scalingnote index milvus-server`, or any Milvus server)."),
        index: Path = typer.Option(..., "--index", help="FAISS index directory or embeddings directory to export."),
        collection: str = typer.Option("scalingnote", "--collection", help="Collection name."),
        index_type: str = typer.Option("auto", "--index-type", help="auto (IVF_PQ on a server, HNSW on Milvus Lite), IVF_PQ, HNSW, SCANN (server), IVF_FLAT, FLAT, ..."),
        dim: int | None = typer.Option(None, "--dim", min=1, help="(embeddings dir) Matryoshka prefix to export."),
        semantic_ids_layers: int = typer.Option(6, "--semantic-ids-layers", min=0, help="(embeddings dir) residual K-means layers (0 = none)."),
        codebook_size: int = typer.Option(256, "--codebook-size", min=1),
        seed: int = typer.Option(0, "--seed"),
        token: str | None = typer.Option(None, "--token", envvar="MILVUS_TOKEN", help="Milvus token (user:password or API key)."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing collection."),
    ) -> None:
        """Export an index (vectors, document ids, semantic IDs, tower identity) to a serving back end."""
        from scalingnote.errors import ScalingNoteError
        from scalingnote.index.backends import backend_names, get_backend

        entry = get_backend(to, "--to")
        if entry.export is None:
            have = [n for n in backend_names() if get_backend(n).export is not None]
            raise ScalingNoteError(f"--to {to!r}: back end {entry.name} has no export (back ends with one: {', '.join(have) or 'none'})")
        m = entry.export(
            index, uri, collection=collection, index_type=index_type, dim=dim, semantic_ids_layers=semantic_ids_layers,
            codebook_size=codebook_size, seed=seed, token=token, overwrite=overwrite,
        )
        note = f" ({m['fallback_reason']})" if m.get("fallback_reason") else ""
        typer.echo(
            f"{uri} collection {collection!r}: {m.get('n_vectors')} x {m.get('dim')}-d vectors, {m.get('index_type', entry.name)} "
            f"{m.get('index_params', '')}{note}, exported in {float(m.get('export_seconds', 0.0)):.1f}s",
            err=True,
        )


def _milvus_server(index_app: typer.Typer) -> None:
    @index_app.command("milvus-server")
    def milvus_server(
        data: Path = typer.Option(Path("milvus-data"), "--data", help="Data directory (config, logs, etcd, segments; kept across restarts)."),
        port: int | None = typer.Option(None, "--port", help="gRPC port on 127.0.0.1 (default: the first free from 19530)."),
    ) -> None:
        """Run an embedded Milvus 2.3.5 standalone server (package `milvus`) on 127.0.0.1 until Ctrl-C / SIGTERM;
        use its URI with `index export --to milvus`, `search --backend milvus` and `serve --backend milvus`."""
        import signal
        import threading

        from scalingnote.index.milvus_server import EmbeddedMilvus

        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        with EmbeddedMilvus(data, port) as srv:
            typer.echo(f"Milvus server ready at {srv.uri} (pid {srv.pid}, data {srv.data_dir}, started in {srv.startup_seconds:.1f}s); Ctrl-C stops it", err=True)
            while not stop.wait(0.5):
                if not srv.running:
                    raise typer.Exit(1)
            typer.echo("stopping the Milvus server...", err=True)


def _tune(index_app: typer.Typer) -> None:
    @index_app.command("tune")
    def tune(
        index: Path = typer.Option(..., "--index", help="Index directory (its search defaults are rewritten)."),
        query_tower: str = typer.Option(..., "--query-tower", help="The query tower the index will be served with."),
        queries: Path = typer.Option(..., "--queries", help="queries.jsonl, or a BEIR directory (with --split): validation or training queries, never test."),
        split: str | None = typer.Option("train", "--split", help="With a BEIR directory: the queries judged in qrels/<split>.tsv."),
        target: float = typer.Option(0.99, "--target", min=0.0, max=1.0, help="Recall@k against exact search to reach."),
        k: int = typer.Option(10, "--k", min=1),
        limit: int = typer.Option(2000, "--limit", min=1, help="Tune on at most this many queries (a seeded sample)."),
        seed: int = typer.Option(0, "--seed"),
    ) -> None:
        """Choose the cheapest nprobe / ef_search and re-rank depth whose top-k keeps `target` of exact
        search's top-k on the given queries; write them as the index's search defaults."""
        import numpy as np

        from scalingnote.index import DenseIndex
        from scalingnote.index.pipeline import load_tower_for, read_search_queries
        from scalingnote.index.tune import save_search_defaults, tune_search

        qs = read_search_queries(queries, split)
        if len(qs) > limit:
            qs = [qs[i] for i in sorted(np.random.default_rng(seed).choice(len(qs), size=limit, replace=False).tolist())]
        idx = DenseIndex.open(index, query_tower=load_tower_for(query_tower, "query"))
        rep = tune_search(idx, idx.query_vectors([q.text for q in qs]), k=k, target=target)
        defaults = save_search_defaults(index, rep)
        typer.echo(f"{rep['reason']}\n{index}: search defaults {json.dumps(defaults)}")


def _info(index_app: typer.Typer) -> None:
    @index_app.command("info")
    def info(path: Path = typer.Argument(..., help="Index or embeddings directory.")) -> None:
        """Print an index's (or an embeddings directory's) manifest as JSON."""
        from scalingnote.errors import ScalingNoteError

        mpath = path / "manifest.json"
        if not mpath.is_file():
            raise ScalingNoteError(f"{path}: no manifest.json (not an index or embeddings directory)")
        try:
            man = json.loads(mpath.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ScalingNoteError(f"{mpath}: line {e.lineno}: invalid JSON ({e.msg})") from None
        if man.get("format", "").startswith("scalingnote-index"):
            from scalingnote.index import read_manifest

            man = read_manifest(path)
        elif man.get("format", "").startswith("scalingnote-embeddings"):
            man = dict(man)
            shards = man.pop("shards", [])
            man["n_shards"] = len(shards)
        else:
            raise ScalingNoteError(f"{mpath}: field 'format' is {man.get('format')!r}: not a scalingnote index or embeddings manifest")
        typer.echo(json.dumps(man, indent=2, ensure_ascii=False))


def _bm25(index_app: typer.Typer) -> None:
    @index_app.command("bm25")
    def index_bm25(
        index: Path = typer.Option(..., "--index", help="Dense index directory: the BM25 index is saved in <index>/bm25."),
        data: Path | None = typer.Option(None, "--data", help="BEIR directory or corpus.jsonl (default: the corpus the index records)."),
        language: str = typer.Option("auto", help="auto | en | zh (as `scalingnote bm25`)."),
        k1: float = typer.Option(1.5),
        b: float = typer.Option(0.75),
    ) -> None:
        """Build (or reuse, when its fingerprint matches) the BM25 index beside a dense index, for hybrid search."""
        from scalingnote.errors import ScalingNoteError
        from scalingnote.sparse.bm25 import BM25Config
        from scalingnote.index.hybrid import open_hybrid

        if language not in ("auto", "en", "zh"):
            raise ScalingNoteError(f"--language must be auto, en or zh, got {language!r}")
        h = open_hybrid(index, None, corpus=data, bm25_config=BM25Config(language=language, k1=k1, b=b))  # type: ignore[arg-type]
        if h.bm25 is None:
            raise ScalingNoteError(f"{index}: the index records no corpus; give --data")
        typer.echo(f"{index / 'bm25'}: BM25 over {len(h.bm25.doc_ids)} documents (language={h.bm25.language}, fingerprint {h.bm25.fingerprint[:12]})", err=True)


def _search(app: typer.Typer) -> None:
    @app.command("search")
    def search(
        index: Path | None = typer.Option(None, "--index", help="Index directory (required with --backend faiss)."),
        query_tower: str | None = typer.Option(None, "--query-tower", help="Query tower: packaged name, HF dir or saved tower dir (modes dense and hybrid)."),
        queries: Path | None = typer.Option(None, "--queries", help="queries.jsonl, or a BEIR directory (with --split)."),
        out: Path | None = typer.Option(None, "--out", help="TREC run file to write (+ <out>.meta.json); with --queries."),
        query: str | None = typer.Option(None, "--query", help="One query: print its hits (title, snippet, score, semantic ID) as JSON lines instead of writing a run."),
        split: str | None = typer.Option("test", "--split", help="With a BEIR directory: search the queries judged in qrels/<split>.tsv."),
        k: int = typer.Option(100, "--k", min=1),
        mode: str | None = typer.Option(None, "--mode", help="dense | bm25 | hybrid (BM25 fused with dense); default: the index's served default (fusion.json, as `scalingnote serve`), else dense."),
        corpus: Path | None = typer.Option(None, "--corpus", help="(bm25/hybrid) corpus for the BM25 index beside the dense index (built once; default: the saved one or the corpus the index records)."),
        fusion: str | None = typer.Option(None, "--fusion", help="(hybrid) rrf or weighted; default: the index's fusion.json (what `scalingnote serve` uses), else rrf."),
        rrf_k: int | None = typer.Option(None, "--rrf-k", min=0, help="(hybrid rrf) RRF constant (default 60)."),
        weight: float | None = typer.Option(None, "--weight", min=0.0, max=1.0, help="(hybrid weighted) weight of the dense side; choose it on validation queries (default: fusion.json's, else 0.5)."),
        norm: str | None = typer.Option(None, "--norm", help="(hybrid weighted) minmax or zscore (default: fusion.json's, else minmax)."),
        depth: int | None = typer.Option(None, "--depth", min=1, help="(hybrid) candidates from each side before fusion (default 100)."),
        nprobe: int | None = typer.Option(None, "--nprobe", min=1),
        ef_search: int | None = typer.Option(None, "--ef-search", min=1),
        rerank: int | None = typer.Option(None, "--rerank", min=1, help="Re-rank the top N candidates with full-precision vectors."),
        batch_size: int = typer.Option(256, "--batch-size", min=1),
        backend: str = typer.Option("faiss", "--backend", help="A back end of scalingnote.index.backends: faiss (--index DIR), milvus (--uri, --collection), or a dotted path 'package.module:attribute'."),
        uri: str | None = typer.Option(None, "--uri", help="(a back end located by URI; milvus) ./file.db (Milvus Lite) or http://127.0.0.1:19530 (a Milvus server)."),
        collection: str = typer.Option("scalingnote", "--collection", help="(milvus) Collection name."),
        milvus_token: str | None = typer.Option(None, "--milvus-token", envvar="MILVUS_TOKEN", help="(milvus) Token."),
    ) -> None:
        """Search an index (dense on any back end; BM25 or hybrid beside an index directory) and write a
        TREC run, or print one query's hits."""
        from scalingnote.errors import ScalingNoteError
        from scalingnote.index.backends import backend_location, get_backend, open_searcher
        from scalingnote.index.hybrid import MODES, hybrid_queries_to_run, open_hybrid, served_fusion
        from scalingnote.index.pipeline import load_tower_for, read_search_queries, search_queries_to_run

        # one default with `scalingnote serve`: the index's fusion.json, each flag given overriding it
        fusion_cfg, served_mode = served_fusion(index, method=fusion, rrf_k=rrf_k, weight=weight, norm=norm, depth=depth)
        mode = mode or served_mode
        if mode not in MODES:
            raise ScalingNoteError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode != "bm25" and query_tower is None:
            raise ScalingNoteError(f"--mode {mode} needs --query-tower")
        if (query is None) == (queries is None):
            raise ScalingNoteError("give --queries FILE/DIR with --out RUN, or one --query TEXT")
        if queries is not None and out is None:
            raise ScalingNoteError("--queries needs --out (the TREC run to write)")
        dense_kw = {"nprobe": nprobe, "ef_search": ef_search, "rerank": rerank}
        entry = get_backend(backend, "--backend")
        location = backend_location(entry, index, uri, "search")
        tower = load_tower_for(query_tower, "query") if mode != "bm25" else None
        dense = open_searcher(entry, index_dir=index, uri=uri, collection=collection, query_tower=tower, token=milvus_token)
        try:
            if query is None and mode == "dense":
                qs = read_search_queries(queries, split if queries.is_dir() else None)
                meta = search_queries_to_run(
                    getattr(dense, "root", location), qs, out, k=k, nprobe=nprobe, ef_search=ef_search, rerank=rerank,
                    batch_size=batch_size, searcher=dense,
                    config={"queries": str(queries), "split": split, "query_tower": query_tower, "backend": backend},
                )
                t = meta["timings"]
                typer.echo(f"wrote {out} ({len(qs)} queries; search {t['search_qps']} q/s)", err=True)
                return
            if getattr(dense, "local_dir", None) is None:
                raise ScalingNoteError(f"--backend {entry.name} searches dense only, with --queries/--out: --mode bm25/hybrid and --query "
                                       "need an index directory beside the searcher (e.g. --backend faiss)")
            searcher = open_hybrid(dense.local_dir, corpus=corpus, fusion=fusion_cfg, bm25=mode != "dense", dense=dense)
            if query is not None:
                _print_hits(searcher, query, k, mode, dense_kw)
                return
            qs = read_search_queries(queries, split if queries.is_dir() else None)
            meta = hybrid_queries_to_run(
                searcher, qs, out, mode=mode, k=k, batch_size=batch_size,  # type: ignore[arg-type]
                config={"queries": str(queries), "split": split, "query_tower": query_tower}, **dense_kw,
            )
            typer.echo(f"wrote {out} ({len(qs)} queries, mode {mode}; search {meta['timings']['search_qps']} q/s)", err=True)
        finally:
            if hasattr(dense, "close"):
                dense.close()


def _print_hits(searcher, query: str, k: int, mode: str, dense_kw: dict) -> None:
    """``scalingnote search --query``: one JSON line per hit (rank, id, score, title, snippet, semantic ID)."""
    from scalingnote.errors import ScalingNoteError

    if not query.strip():
        raise ScalingNoteError("--query: empty query")
    res = searcher.search([query], k, mode=mode, **dense_kw)  # type: ignore[arg-type]
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
