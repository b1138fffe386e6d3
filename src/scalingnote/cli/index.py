"""``scalingnote index encode|build|tune|export|milvus-server|info|bm25|add|delete|rebuild`` (and
``scalingnote search``, :mod:`scalingnote.cli.search`): thin wrappers over :mod:`scalingnote.index`.
The options of ``index build`` are generated from :class:`~scalingnote.index.build.IndexConfig`."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import numpy as np
import typer

from scalingnote.cli import search as search_cli
from scalingnote.cli._options import corpus_format_option, use_corpus_format, with_config_options
from scalingnote.cli.index_live import register_live
from scalingnote.cli.search import TOKEN_ENVVARS, backend_token
from scalingnote.errors import ScalingNoteError
from scalingnote.index import DenseIndex, build_index, read_manifest
from scalingnote.index.backends import BACKENDS, declared_options, export_to_backend, get_backend
from scalingnote.index.build import IndexConfig
from scalingnote.index.hybrid import open_hybrid
from scalingnote.index.milvus.milvus_server import EmbeddedMilvus
from scalingnote.index.pipeline import encode_with_tower, load_tower_for, read_search_queries
from scalingnote.index.tune import save_search_defaults, tune_search
from scalingnote.sparse.bm25 import BM25Config


def _status(text: str) -> None:
    """A command's closing status line, on stderr (stdout stays for data)."""
    typer.echo(text, err=True)


def exporting_backends() -> list[str]:
    """The registered back ends that have an export (``index export --to``)."""
    return [name for name in BACKENDS.names() if BACKENDS.get(name).export is not None]


def register(app: typer.Typer) -> None:
    index_app = typer.Typer(help="Corpus encoding, FAISS indexes, semantic IDs.", no_args_is_help=True)
    for name, command in (("encode", encode), ("build", build), ("tune", tune)):
        index_app.command(name)(command)
    _export(index_app)  # its --to help reads the back-end table when registered
    for name, command in (("milvus-server", milvus_server), ("info", info), ("bm25", index_bm25)):
        index_app.command(name)(command)
    register_live(index_app)  # add | delete | rebuild (the live index)
    app.add_typer(index_app, name="index")
    search_cli.register(app)


def encode(
    tower: str = typer.Option(
        ...,
        "--tower",
        help="Document tower: packaged name (minilm-l6, smollm2-135m), HF dir, .gguf or saved tower dir.",
    ),
    data: Path = typer.Option(..., "--data", help="BEIR directory or a corpus file (any registered corpus format)."),
    corpus_format: str | None = corpus_format_option(),
    out: Path = typer.Option(..., "--out", help="Embeddings directory (resumed if it exists)."),
    shard_size: int = typer.Option(10_000, "--shard-size", min=1, help="Documents per shard file."),
    batch_size: int = typer.Option(64, "--batch-size", min=1),
    num_layers: int | None = typer.Option(
        None, "--num-layers", min=1, help="Keep the first N transformer layers of a base model."
    ),
    engine: str = typer.Option(
        "local", "--engine", help="local (in-process) or ray (Ray Data actor pool; reads BEIR JSONL or Parquet)."
    ),
    address: str | None = typer.Option(
        None, "--address", help="(ray) Ray cluster address (default: start a local one on 127.0.0.1)."
    ),
    num_actors: int = typer.Option(2, "--num-actors", min=1, help="(ray) Actors in the pool (one tower load each)."),
    cpus_per_actor: float = typer.Option(
        0.5, "--cpus-per-actor", min=0.0, help="(ray) CPUs reserved per actor (< 1 on small machines)."
    ),
    gpus_per_actor: float = typer.Option(0.0, "--gpus-per-actor", min=0.0, help="(ray) GPUs reserved per actor."),
    feature_cache: Path | None = typer.Option(
        None,
        "--feature-cache",
        help="(local) Feature-cache root of a training run: reuse the cached pooled states of the tower's backbone.",
    ),
) -> None:
    """Encode a corpus into sharded embeddings; an interrupted run resumes where it stopped."""
    use_corpus_format(corpus_format, data)
    if engine == "ray":
        # why: loads torch (the towers) and Ray; `index --help` and the other verbs need neither
        from scalingnote.index.ray.ray_encode import encode_corpus_ray

        res = encode_corpus_ray(
            tower,
            data,
            out,
            shard_size=shard_size,
            batch_size=batch_size,
            num_layers=num_layers,
            address=address,
            num_actors=num_actors,
            cpus_per_actor=cpus_per_actor,
            gpus_per_actor=gpus_per_actor,
        )
    elif engine == "local":
        res = encode_with_tower(
            tower,
            data,
            out,
            shard_size=shard_size,
            batch_size=batch_size,
            num_layers=num_layers,
            feature_cache=feature_cache,
        )
    else:
        raise ScalingNoteError(f"--engine {engine!r}: choose local or ray")
    _status(
        f"{out}: {res.n_docs} documents in {res.n_shards} shards "
        f"({res.shards_written} written, {res.shards_skipped} resumed), {res.docs_per_s:.1f} docs/s",
    )


@with_config_options(IndexConfig)
def build(
    out: Path = typer.Option(..., "--out", help="Index directory to create."),
    embeddings: Path | None = typer.Option(None, "--embeddings", help="Embeddings directory from `index encode`."),
    tower: str | None = typer.Option(None, "--tower", help="Encode first with this document tower (with --data)."),
    data: Path | None = typer.Option(None, "--data", help="BEIR directory or a corpus file to encode (with --tower)."),
    corpus_format: str | None = corpus_format_option(),
    embeddings_out: Path | None = typer.Option(
        None, "--embeddings-out", help="Where --tower/--data writes embeddings (default <out>.embeddings)."
    ),
    shard_size: int = typer.Option(10_000, "--shard-size", min=1),
    batch_size: int = typer.Option(64, "--batch-size", min=1),
    num_layers: int | None = typer.Option(None, "--num-layers", min=1),
    cfg: IndexConfig = None,  # type: ignore[assignment]  # one option per IndexConfig field
) -> None:
    """Build a FAISS index (+ semantic IDs) from embeddings, or encode and build in one go."""
    if embeddings is None:
        if tower is None or data is None:
            raise ScalingNoteError("index build: give --embeddings DIR, or --tower NAME and --data DIR to encode first")
        use_corpus_format(corpus_format, data)
        embeddings = embeddings_out or out.with_name(out.name + ".embeddings")
        encode_with_tower(tower, data, embeddings, shard_size=shard_size, batch_size=batch_size, num_layers=num_layers)
    elif tower is not None or data is not None:
        raise ScalingNoteError("index build: --embeddings and --tower/--data are alternatives; give one")
    path = build_index(embeddings, out, **cfg.kwargs())
    m = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    _status(
        f"{path}: {m['factory']} over {m['n_vectors']} x {m['dim']}-d vectors, "
        f"{m['code_bytes_per_vector']} code bytes/vector, built in {m['build_seconds']:.1f}s",
    )


def _export(index_app: typer.Typer) -> None:
    @index_app.command("export")
    def export(
        to: str = typer.Option(
            "milvus",
            "--to",
            help=f"Target back end: one with an export ({', '.join(exporting_backends()) or 'none'}), or a dotted "
            "path 'package.module:attribute'.",
        ),
        uri: str = typer.Option(
            ...,
            "--uri",
            help="Where to: for milvus ./file.db (Milvus Lite, embedded, no PQ) or http://127.0.0.1:19530 "
            "(`scalingnote index milvus-server`, or any Milvus server).",
        ),
        index: Path = typer.Option(..., "--index", help="FAISS index directory or embeddings directory to export."),
        collection: str = typer.Option(
            "scalingnote",
            "--collection",
            help="Collection (or namespace) name, for a back end located by URI that has them.",
        ),
        index_type: str = typer.Option(
            "auto",
            "--index-type",
            help="(milvus) auto (IVF_PQ on a server, HNSW on Milvus Lite), IVF_PQ, HNSW, SCANN (server), IVF_FLAT, "
            "FLAT, ...",
        ),
        dim: int | None = typer.Option(None, "--dim", min=1, help="(embeddings dir) Matryoshka prefix to export."),
        semantic_ids_layers: int = typer.Option(
            6, "--semantic-ids-layers", min=0, help="(embeddings dir) residual K-means layers (0 = none)."
        ),
        codebook_size: int = typer.Option(256, "--codebook-size", min=1),
        seed: int = typer.Option(0, "--seed"),
        token: str | None = typer.Option(
            None, "--token", envvar=TOKEN_ENVVARS, help="Token of the back end service (user:password or API key)."
        ),
        milvus_token: str | None = typer.Option(None, "--milvus-token", hidden=True, help="Deprecated: --token."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing collection."),
    ) -> None:
        """Export an index (vectors, document ids, semantic IDs, tower identity) to a serving back end."""
        entry = get_backend(to, "--to")
        if entry.export is None:
            raise ScalingNoteError(
                f"--to {to!r}: back end {entry.name} has no export (back ends with one: "
                f"{', '.join(exporting_backends()) or 'none'})"
            )
        options = {
            "collection": collection,
            "index_type": index_type,
            "dim": dim,
            "semantic_ids_layers": semantic_ids_layers,
            "codebook_size": codebook_size,
            "seed": seed,
            "token": backend_token(token, milvus_token),
            "overwrite": overwrite,
        }
        m = export_to_backend(entry, index, uri, **options)
        _status(export_status(entry, uri, declared_options(entry.export, options), m))


def export_status(entry, uri: str, passed: dict, m: dict) -> str:
    """``index export``'s closing line, from what the back end returned (any back end): where
    (with the collection when it takes one), how many vectors, its structure and the time."""
    where = f"{entry.name} {uri}" + (f" collection {passed['collection']!r}" if "collection" in passed else "")
    structure = " ".join(str(x) for x in (m.get("index_type") or m.get("factory"), m.get("index_params")) if x)
    note = f" ({m['fallback_reason']})" if m.get("fallback_reason") else ""
    took = f", exported in {float(m['export_seconds']):.1f}s" if m.get("export_seconds") is not None else ""
    return (
        f"{where}: {m.get('n_vectors', '?')} x {m.get('dim', '?')}-d vectors"
        + (f", {structure}" if structure else "")
        + f"{note}{took}"
    )


def milvus_server(
    data: Path = typer.Option(
        Path("milvus-data"), "--data", help="Data directory (config, logs, etcd, segments; kept across restarts)."
    ),
    port: int | None = typer.Option(
        None, "--port", help="gRPC port on 127.0.0.1 (default: the first free from 19530)."
    ),
) -> None:
    """Run an embedded Milvus 2.3.5 standalone server (package `milvus`) on 127.0.0.1 until Ctrl-C / SIGTERM;
    use its URI with `index export --to milvus`, `search --backend milvus` and `serve --backend milvus`."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with EmbeddedMilvus(data, port) as srv:
        typer.echo(
            f"Milvus server ready at {srv.uri} (pid {srv.pid}, data {srv.data_dir}, started in "
            f"{srv.startup_seconds:.1f}s); Ctrl-C stops it",
            err=True,
        )
        while not stop.wait(0.5):
            if not srv.running:
                raise typer.Exit(1)
        typer.echo("stopping the Milvus server...", err=True)


def tune(
    index: Path = typer.Option(..., "--index", help="Index directory (its search defaults are rewritten)."),
    query_tower: str = typer.Option(..., "--query-tower", help="The query tower the index will be served with."),
    queries: Path = typer.Option(
        ...,
        "--queries",
        help="queries.jsonl, or a BEIR directory (with --split): validation or training queries, never test.",
    ),
    split: str | None = typer.Option(
        "train", "--split", help="With a BEIR directory: the queries judged in qrels/<split>.tsv."
    ),
    target: float = typer.Option(0.99, "--target", min=0.0, max=1.0, help="Recall@k against exact search to reach."),
    k: int = typer.Option(10, "--k", min=1),
    limit: int = typer.Option(2000, "--limit", min=1, help="Tune on at most this many queries (a seeded sample)."),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Choose the cheapest nprobe / ef_search and re-rank depth whose top-k keeps `target` of exact
    search's top-k on the given queries; write them as the index's search defaults."""
    qs = read_search_queries(queries, split)
    if len(qs) > limit:
        qs = [qs[i] for i in sorted(np.random.default_rng(seed).choice(len(qs), size=limit, replace=False).tolist())]
    idx = DenseIndex.open(index, query_tower=load_tower_for(query_tower, "query"))
    rep = tune_search(idx, idx.query_vectors([q.text for q in qs]), k=k, target=target)
    defaults = save_search_defaults(index, rep)
    typer.echo(f"{rep['reason']}\n{index}: search defaults {json.dumps(defaults)}")


def info(path: Path = typer.Argument(..., help="Index or embeddings directory.")) -> None:
    """Print an index's (or an embeddings directory's) manifest as JSON."""
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise ScalingNoteError(f"{path}: no manifest.json (not an index or embeddings directory)")
    try:
        man = json.loads(mpath.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ScalingNoteError(f"{mpath}: line {e.lineno}: invalid JSON ({e.msg})") from None
    if man.get("format", "").startswith("scalingnote-index"):
        man = read_manifest(path)
    elif man.get("format", "").startswith("scalingnote-embeddings"):
        man = dict(man)
        shards = man.pop("shards", [])
        man["n_shards"] = len(shards)
    else:
        raise ScalingNoteError(
            f"{mpath}: field 'format' is {man.get('format')!r}: not a scalingnote index or embeddings manifest"
        )
    typer.echo(json.dumps(man, indent=2, ensure_ascii=False))


def index_bm25(
    index: Path = typer.Option(..., "--index", help="Dense index directory: the BM25 index is saved in <index>/bm25."),
    data: Path | None = typer.Option(
        None, "--data", help="BEIR directory or corpus.jsonl (default: the corpus the index records)."
    ),
    language: str = typer.Option("auto", help="auto | en | zh (as `scalingnote bm25`)."),
    k1: float = typer.Option(1.5),
    b: float = typer.Option(0.75),
) -> None:
    """Build (or reuse, when its fingerprint matches) the BM25 index beside a dense index, for hybrid search."""
    if language not in ("auto", "en", "zh"):
        raise ScalingNoteError(f"--language must be auto, en or zh, got {language!r}")
    h = open_hybrid(index, None, corpus=data, bm25_config=BM25Config(language=language, k1=k1, b=b))  # type: ignore[arg-type]
    if h.bm25 is None:
        raise ScalingNoteError(f"{index}: the index records no corpus; give --data")
    typer.echo(
        f"{index / 'bm25'}: BM25 over {len(h.bm25.doc_ids)} documents (language={h.bm25.language}, fingerprint "
        f"{h.bm25.fingerprint[:12]})",
        err=True,
    )
