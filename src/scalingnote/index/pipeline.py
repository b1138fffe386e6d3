"""End-to-end helpers behind the ``scalingnote index`` / ``scalingnote search`` commands:
load a tower by name or path, encode a corpus, build an index, search a queries file
into a TREC run. Each is a thin composition of the library functions.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from scalingnote.data import write_run
from scalingnote.data.beir import load_qrels, load_queries
from scalingnote.data.types import Query
from scalingnote.errors import ScalingNoteError
from scalingnote.index.build import build_index
from scalingnote.index.embeddings import EncodeResult, encode_corpus, tower_identity
from scalingnote.index.faiss.dense import DenseIndex
from scalingnote.index.layout import check_query_tower, read_manifest
from scalingnote.utils import run_metadata, write_json


def load_tower_for(
    name_or_path: str | Path,
    role: str,
    *,
    num_layers: int | None = None,
    dim: int | None = None,
    pooling: str | None = None,
):
    """``scalingnote.models.load_tower`` for ``role`` ("query" / "document").

    A zero-shot base model (e.g. ``minilm-l6``) loads without a projection, so its query
    and document towers share a compat id and an index can be built before any training.
    """
    # why: scalingnote.models imports torch (~1.3 s); search / serve start-up must not pay it
    from scalingnote.models import load_tower

    return load_tower(str(name_or_path), role=role, num_layers=num_layers, dim=dim, pooling=pooling)


def encode_with_tower(
    tower_name: str | Path,
    data: str | Path,
    out_dir: str | Path,
    *,
    shard_size: int = 10_000,
    batch_size: int = 64,
    progress: bool = True,
    feature_cache: str | Path | None = None,
    **tower_options: Any,
) -> EncodeResult:
    """Load the document tower ``tower_name`` and encode ``data`` (BEIR dir or corpus.jsonl).

    ``tower_options``: the keywords of :func:`load_tower_for` (``num_layers``, ``dim``, ``pooling``).
    ``feature_cache``: a feature-cache root (``TrainConfig.feature_cache_dir``): the tower's pooled
    backbone states are read from it where cached (a head-only trained tower finds the states its
    training cached) and stored there otherwise; only the projection runs per document."""
    tower = load_tower_for(tower_name, "document", **tower_options)
    if feature_cache is not None:
        # why: scalingnote.models imports torch (~1.3 s), kept out of this module's import
        from scalingnote.models import PrefixTower

        ident = tower_identity(tower)
        enc = PrefixTower(tower, 0, feature_cache, batch_size=batch_size, show_progress=progress)
        return encode_corpus(
            enc, data, out_dir, shard_size=shard_size, batch_size=batch_size, progress=progress, tower_info=ident
        )
    return encode_corpus(tower, data, out_dir, shard_size=shard_size, batch_size=batch_size, progress=progress)


def read_search_queries(path: str | Path, split: str | None = None) -> list[Query]:
    """Queries to search: a ``queries.jsonl`` file (all queries), or a BEIR directory (the
    queries judged in ``qrels/<split>.tsv``, or all queries when ``split`` is None)."""
    p = Path(path)
    if p.is_dir():
        queries = load_queries(p / "queries.jsonl")
        if split is None:
            return list(queries.values())
        qrels_file = p / "qrels" / f"{split}.tsv"
        qrels = load_qrels(qrels_file, query_ids=queries.keys())
        return [queries[q] for q in qrels]
    if not p.exists():
        raise ScalingNoteError(f"{p}: queries file not found")
    return list(load_queries(p).values())


def open_dense(index_dir: str | Path, query_tower: Any = None) -> DenseIndex:
    """Open a dense index with ``query_tower`` (a tower, a name/path loaded as a query tower, or
    None for vector queries); a name/path is checked against the index before the index loads."""
    if isinstance(query_tower, (str, Path)):
        tower = load_tower_for(query_tower, "query")
        check_query_tower(read_manifest(index_dir), tower, Path(index_dir) / "manifest.json")
        query_tower = tower
    return DenseIndex.open(index_dir, query_tower=query_tower)


def search_queries_to_run(
    index_dir: str | Path,
    queries: list[Query],
    out: str | Path,
    *,
    query_tower: Any = None,
    k: int = 100,
    nprobe: int | None = None,
    ef_search: int | None = None,
    rerank: int | None = None,
    batch_size: int = 256,
    progress: bool = True,
    config: dict[str, Any] | None = None,
    searcher: Any = None,
) -> dict[str, Any]:
    """Encode ``queries`` with ``query_tower`` (a tower or a name/path), search the index,
    write the TREC run ``out`` and ``<out>.meta.json`` (config, versions, timings).
    ``searcher``: an already open searcher (e.g. a :class:`~scalingnote.index.milvus.milvus.MilvusSearcher`
    with its query tower) used instead of opening ``index_dir``. Returns the metadata written."""
    if not queries:
        raise ScalingNoteError("no queries to search")
    if searcher is not None:
        index = searcher
    else:
        index = open_dense(index_dir, query_tower)
    texts = [q.text for q in queries]
    t0 = time.perf_counter()
    qvecs = index.query_vectors(texts)
    encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run = index.search_run(
        [q.id for q in queries],
        qvecs,
        k=k,
        batch_size=batch_size,
        progress=progress,
        nprobe=nprobe,
        ef_search=ef_search,
        rerank=rerank,
    )
    search_s = time.perf_counter() - t0
    write_run(out, run, tag=f"scalingnote-{index.factory}", k=k)
    cfg = dict(config or {})
    cfg.update(
        {
            "index": str(index_dir),
            "k": k,
            "nprobe": nprobe,
            "ef_search": ef_search,
            "rerank": rerank,
            "n_queries": len(queries),
        }
    )
    return write_run_meta(out, cfg, index.manifest, len(queries), search_s, encode_seconds=encode_s)


def write_run_meta(
    out: str | Path,
    config: dict[str, Any],
    manifest: dict[str, Any],
    n_queries: int,
    search_seconds: float,
    *,
    encode_seconds: float | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``<out>.meta.json`` beside a TREC run: config + versions + machine, the index's identity
    (factory, dim, size, document tower, search defaults) and the timings. Returns it."""
    meta = run_metadata(config)
    meta["index_manifest"] = {
        key: manifest.get(key) for key in ("factory", "dim", "n_vectors", "tower", "search_defaults")
    }
    meta.update(extra or {})
    timings: dict[str, float | None] = {} if encode_seconds is None else {"encode_seconds": round(encode_seconds, 3)}
    timings.update(
        {
            "search_seconds": round(search_seconds, 3),
            "search_qps": round(n_queries / search_seconds, 1) if search_seconds > 0 else None,
        }
    )
    meta["timings"] = timings
    write_json(Path(str(out) + ".meta.json"), meta)
    return meta


__all__ = [
    "build_index",
    "encode_with_tower",
    "load_tower_for",
    "read_search_queries",
    "open_dense",
    "search_queries_to_run",
    "write_run_meta",
]
