"""Export a FAISS index or an embeddings directory to a Milvus collection (vectors, document ids,
semantic IDs, the document tower's identity in the collection's ``scalingnote.manifest``
property), written under a temporary name and renamed when indexed. Searched by
:class:`~scalingnote.index.milvus.milvus.MilvusSearcher`."""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.embeddings import Embeddings, l2_normalize, load_embeddings
from scalingnote.index.faiss.dense import DenseIndex
from scalingnote.index.layout import DEFAULT_EF_SEARCH, DEFAULT_NPROBE
from scalingnote.index.layout import FORMAT as INDEX_FORMAT
from scalingnote.index.milvus.milvus import (
    DEFAULT_COLLECTION,
    DOC_ID,
    FORMAT,
    HNSW_TYPES,
    IVF_TYPES,
    LITE_INDEX_TYPES,
    PK,
    PROPERTY,
    SEM_ID,
    SERVER_INDEX_TYPES,
    VECTOR,
    _check_name,
    _milvus_message,
    _now,
    _pymilvus,
    connect,
    is_lite,
    server_version,
)
from scalingnote.index.milvus.milvus_collection import collection_schema, drop_quietly, insert_rows, wait_indexed
from scalingnote.index.settings import IndexBuildSettings

# --------------------------------------------------------------------------- source


def _load_source(source: str | Path | Embeddings, settings: IndexBuildSettings):
    """``(vectors (n, d) array-like, doc_ids, semantic_ids or None, tower, source_dim, semantic-ID info, info)``
    from a FAISS index directory (its indexed vectors, ids and semantic IDs) or an embeddings
    directory (semantic IDs fitted as :func:`~scalingnote.index.build_index` does)."""
    if isinstance(source, Embeddings):
        emb, path = source, str(source.root)
    else:
        path = str(Path(source))
        if _source_format(source) == INDEX_FORMAT:
            if settings.dim is not None:
                raise ScalingNoteError(
                    f"{source}: --dim applies to an embeddings directory; an index directory is exported at its own dim"
                )
            return _index_source(source)
        emb = load_embeddings(source)
    src_dim = emb.dim
    d = settings.prefix_dim(src_dim)
    vecs = emb.vectors
    if d < src_dim or not emb.manifest.get("normalized", True):
        vecs = l2_normalize(np.asarray(vecs[:, :d]))
    sem, sem_info = _fit_semantic_ids(vecs, settings)
    p = str(Path(path).resolve())
    info = {"kind": "embeddings", "path": p, "embeddings_dir": p}
    return vecs, list(emb.ids), sem, dict(emb.tower), src_dim, sem_info, info


def _source_format(source: str | Path) -> str:
    """The ``format`` its ``manifest.json`` gives a FAISS index or embeddings directory."""
    mpath = Path(source) / "manifest.json"
    if not mpath.is_file():
        raise ScalingNoteError(
            f"{source}: no manifest.json: give a FAISS index directory (`index build`) or an embeddings directory "
            "(`index encode`)"
        )
    try:
        return json.loads(mpath.read_text(encoding="utf-8")).get("format", "")
    except json.JSONDecodeError as e:
        raise ScalingNoteError(f"{mpath}: line {e.lineno}: invalid JSON ({e.msg})") from None


def _index_source(source: str | Path):
    """:func:`_load_source` of a FAISS index directory: its indexed vectors, ids and semantic IDs."""
    index = DenseIndex.open(source)
    m = index.manifest
    info = {
        "kind": "faiss-index",
        "path": str(Path(source).resolve()),
        "factory": m.get("factory"),
        "nlist": m.get("nlist"),
        "embeddings_dir": m.get("embeddings_dir"),
        "method": (m.get("routing") or {}).get("method"),
    }
    sem_info = m.get("semantic_ids")
    return (
        index.vectors,
        list(index.doc_ids),
        index.semantic_ids,
        dict(m.get("tower") or {}),
        int(m.get("source_dim", m["dim"])),
        sem_info,
        info,
    )


def _fit_semantic_ids(vecs, settings: IndexBuildSettings) -> tuple[np.ndarray | None, dict[str, Any] | None]:
    """Semantic IDs of every vector and their manifest entry, from the same seeded sample and
    residual K-means as :func:`~scalingnote.index.build_index` (ScalingNote §3.5); (None, None)
    with 0 layers."""
    if not settings.semantic_ids_layers or settings.semantic_ids_layers <= 0:
        return None, None
    rows = settings.training_rows(len(vecs))
    train_x = np.ascontiguousarray(np.asarray(vecs)[rows], dtype=np.float32)
    rkm = settings.fit_semantic_ids(train_x)
    assert rkm is not None  # fitted whenever semantic_ids_layers > 0
    sem = rkm.assign(np.asarray(vecs, dtype=np.float32))
    return sem, {"source": "fitted at export", "seed": int(settings.seed), "n_train": len(rows), **rkm.describe()}


def _default_nlist(n: int) -> int:
    # FAISS / Milvus guidance: ~4*sqrt(n) lists, and >= 39 training points per list
    return int(max(1, min(65536, round(4 * math.sqrt(n)), n // 39)))


def _default_pq_m(dim: int) -> int:
    """Sub-quantisers: the largest divisor of dim giving >= 8 dimensions each (dim 384 -> 48, 128 -> 16)."""
    for m in range(max(1, dim // 8), 0, -1):
        if dim % m == 0:
            return m
    return 1


def default_index_params(
    index_type: str, n: int, dim: int, source_info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Build parameters for ``index_type`` (from the FAISS index's settings where exported from one)."""
    info = source_info or {}
    factory = str(info.get("factory") or "")
    if index_type in IVF_TYPES:
        nlist = int(info["nlist"]) if info.get("nlist") else _default_nlist(n)
        params: dict[str, Any] = {"nlist": nlist}
        if index_type == "IVF_PQ":
            m = re.search(r"PQ(\d+)", factory)
            pq_m = int(m.group(1)) if m and dim % int(m.group(1)) == 0 else _default_pq_m(dim)
            params.update({"m": pq_m, "nbits": 8})
        return params  # SCANN keeps the raw vectors by default (with_raw_data) and re-ranks reorder_k candidates
    if index_type in ("HNSW", "HNSW_SQ", "HNSW_PQ"):
        m = re.search(r"HNSW(\d+)", factory)
        params = {"M": int(m.group(1)) if m else 32, "efConstruction": 200}
        if (
            index_type == "HNSW_SQ"
        ):  # Milvus's scalar quantisers: SQ6, SQ8, BF16, FP16 (no 4-bit: an SQ4 graph exports as SQ6)
            sq = re.search(r"SQ(\d+)", factory)
            params["sq_type"] = "SQ6" if sq and int(sq.group(1)) <= 6 else "SQ8"
        if index_type == "HNSW_PQ":
            pq = re.search(r"PQ(\d+)", factory)
            params.update(
                {"m": int(pq.group(1)) if pq and dim % int(pq.group(1)) == 0 else _default_pq_m(dim), "nbits": 8}
            )
        return params
    return {}


def _method_index_type(requested: str, method: str | None, lite: bool) -> str:
    """The Milvus index type ``auto`` means for an index built with a routed ``method``:
    ivf -> IVF_PQ (Lite: HNSW), hnsw_pq -> HNSW_PQ (Lite: HNSW), hnsw_sq / hnsw_sq_qg -> HNSW_SQ, hnsw_lean ->
    HNSW_SQ with SQ8 over the full vectors (Milvus has no projected graph), hnsw and
    svs_vamana (a graph over float vectors) -> HNSW, ivf_rabitq, ivf_pqfs and scann_soar -> SCANN (the same
    structure: document-trained partitions, 4-bit fast-scan codes, a re-rank; Milvus's SCANN has no SOAR
    spill; Lite: IVF_SQ8). ivf_qmetric is refused: Milvus trains its own IVF on the documents, so the
    query-metric lists, and the rule new documents follow, would be lost; an explicit ``--index-type``
    exports the vectors anyway."""
    if not method or (requested or "auto").strip().lower() != "auto":
        return requested
    if method == "ivf_qmetric":
        raise ScalingNoteError(
            "this index was built with method ivf_qmetric (inverted lists cut in the query tower's metric); "
            "Milvus trains its own IVF on the documents, so those lists and the rule new documents follow would "
            "be lost. Pass --index-type IVF_PQ (lists cut on documents: method ivf) or HNSW_PQ / HNSW to export "
            "the vectors with that index"
        )
    if method == "hnsw_pq":
        return "HNSW" if lite else "HNSW_PQ"  # Milvus Lite has no HNSW_PQ: its graph over the full vectors
    if method in ("hnsw_sq", "hnsw_sq_qg", "hnsw_lean"):
        return "HNSW_SQ"  # Lite implements it too
    if method in ("hnsw", "svs_vamana"):  # Milvus has no in-memory Vamana: HNSW is its graph over float vectors
        return "HNSW"
    if method in ("ivf_rabitq", "ivf_pqfs", "scann_soar"):
        return "IVF_SQ8" if lite else "SCANN"
    return requested


def resolve_index_type(requested: str, lite: bool) -> tuple[str, str | None]:
    """``(index_type, fallback_reason)`` for ``requested`` ("auto" or a Milvus index type)."""
    req = (requested or "auto").strip().upper()
    supported = LITE_INDEX_TYPES if lite else SERVER_INDEX_TYPES
    if req == "AUTO":
        if lite:
            return "HNSW", "Milvus Lite does not implement IVF_PQ (supported: " + ", ".join(
                LITE_INDEX_TYPES
            ) + "); built HNSW instead"
        return "IVF_PQ", None
    if req not in supported:
        where = "Milvus Lite" if lite else "this back end"
        raise ScalingNoteError(
            f"index type {requested!r}: not supported by {where}; choose one of: {', '.join(supported)} (or auto)"
        )
    return req, None


# --------------------------------------------------------------------------- export


def export_to_milvus(
    source: str | Path | Embeddings,
    uri: str | Path,
    collection: str = DEFAULT_COLLECTION,
    *,
    settings: IndexBuildSettings | None = None,
    index_type: str = "auto",
    index_params: dict[str, Any] | None = None,
    batch_size: int = 2048,
    overwrite: bool = False,
    token: str | None = None,
    index_timeout_s: float = 3600.0,
    progress: bool = True,
    **options: Any,
) -> dict[str, Any]:
    """Load embeddings, document ids and semantic IDs into the Milvus collection ``collection``.

    ``source``: a FAISS index directory (exports its indexed vectors, ids and semantic IDs,
    and reuses its nlist / PQ / HNSW sizes) or an embeddings directory: ``settings``
    (:class:`~scalingnote.index.settings.IndexBuildSettings`) or its fields as keywords
    (``options``) apply as in ``build_index``: ``dim`` picks a Matryoshka prefix, semantic IDs
    are fitted with ``semantic_ids_layers`` / ``codebook_size`` / ``train_size`` / ``seed``
    (0 layers = none).
    ``index_type``: "auto" (IVF_PQ on a server, HNSW on Milvus Lite) or a Milvus index
    type; ``index_params`` override the defaults. Returns the manifest stored in the
    collection property ``scalingnote.manifest``.
    """
    t_start = time.perf_counter()
    s = IndexBuildSettings.resolve(settings, options, "export_to_milvus")
    _check_name(collection)
    if batch_size < 1:
        raise ScalingNoteError(f"batch_size must be >= 1, got {batch_size}")
    vecs, ids, sem, tower, src_dim, sem_info, info = _load_source(source, s)
    max_len = _check_ids(source, ids)
    n, d = len(ids), int(vecs.shape[1])

    pm = _pymilvus()
    client = connect(uri, token=token)
    try:
        version = server_version(client)
        itype, fallback, params = _index_settings(client, index_type, index_params, n, d, info)
        if client.has_collection(collection) and not overwrite:
            raise ScalingNoteError(
                f"{uri}: collection {collection!r} already exists (pass overwrite=True / --overwrite to replace it)"
            )
        manifest = _collection_manifest(
            collection,
            itype,
            params,
            index_type,
            fallback,
            d,
            src_dim,
            n,
            sem,
            sem_info,
            tower,
            info,
            version,
            pm.__version__,
        )
        tmp = f"{collection}__tmp_{os.getpid()}"
        if client.has_collection(tmp):
            client.drop_collection(tmp)
        schema = collection_schema(client, pm, tower, max_len, None if sem is None else int(sem.shape[1]), d)
        try:
            client.create_collection(
                tmp, schema=schema, properties={PROPERTY: json.dumps(manifest, ensure_ascii=False)}
            )
            _fill_collection(
                client,
                tmp,
                vecs,
                ids,
                sem,
                manifest,
                batch_size=batch_size,
                progress=progress,
                source=f"{source}",
                timeout_s=index_timeout_s,
            )
            if client.has_collection(collection):  # overwrite (checked above)
                client.drop_collection(collection)
            client.rename_collection(tmp, collection)
        except ScalingNoteError:
            drop_quietly(client, tmp)
            raise
        except Exception as e:  # noqa: BLE001 - MilvusException etc.
            drop_quietly(client, tmp)
            raise ScalingNoteError(
                f"{uri}: exporting to collection {collection!r} failed: {_milvus_message(e)}"
            ) from None
        client.load_collection(collection)
        manifest["export_seconds"] = round(time.perf_counter() - t_start, 3)
        return manifest
    finally:
        client.close()


def _check_ids(source: Any, ids: list[str]) -> int:
    """Refuse no documents, duplicate ids and ids too long for Milvus; the longest id's UTF-8 bytes."""
    if not ids:
        raise ScalingNoteError(f"{source}: no documents to export")
    if len(set(ids)) != len(ids):
        raise ScalingNoteError(f"{source}: duplicate document ids")
    max_len = max(len(i.encode("utf-8")) for i in ids)
    if max_len > 65535:
        raise ScalingNoteError(f"{source}: a document id is {max_len} bytes long; Milvus VARCHAR holds at most 65535")
    return max_len


def _index_settings(
    client, requested: str, overrides: dict[str, Any] | None, n: int, d: int, info: dict[str, Any]
) -> tuple[str, str | None, dict[str, Any]]:
    """``(index type, fallback reason, build parameters)`` for this back end (Lite or server)."""
    lite = is_lite(client)
    itype, fallback = resolve_index_type(_method_index_type(requested, info.get("method"), lite), lite)
    if info.get("method") == "ivf_qmetric":  # only with an explicit --index-type (auto is refused)
        fallback = (
            f"ivf_qmetric's lists (cut in the query metric) are not exported: Milvus builds its own {itype} on the "
            "documents"
        )
    elif (
        info.get("method") == "hnsw_pq" and lite and itype == "HNSW" and (requested or "auto").strip().lower() == "auto"
    ):
        fallback = "Milvus Lite has no HNSW_PQ: HNSW over the full-precision vectors (the graph's M kept)"
    elif (
        info.get("method") in ("hnsw_sq", "hnsw_sq_qg")
        and itype == "HNSW_SQ"
        and ",SQ4" in str(info.get("factory") or "")
    ):
        fallback = "Milvus's HNSW_SQ has no 4-bit quantiser: SQ6 (the graph's M kept)"
        if info.get("method") == "hnsw_sq_qg":
            fallback += "; the query-guided edges are not exported (Milvus builds its own graph from the documents)"
    elif info.get("method") == "hnsw_lean" and itype == "HNSW_SQ":
        fallback = (
            "Milvus has no graph walked in a projection: HNSW_SQ (SQ8) over the full vectors (the graph's M kept); "
            "the projection and the query-guided edges are not exported"
        )
    params = default_index_params(itype, n, d, info)
    params.update(overrides or {})
    if itype == "IVF_PQ" and d % int(params["m"]) != 0:
        raise ScalingNoteError(f"index params: m={params['m']} must divide the dimension {d}")
    return itype, fallback, params


def _fill_collection(
    client,
    name: str,
    vecs,
    ids: list[str],
    sem,
    manifest: dict[str, Any],
    *,
    batch_size: int,
    progress: bool,
    source: str,
    timeout_s: float,
) -> None:
    """Insert every row into the new collection ``name``, build its vector index (``manifest``'s
    type and parameters) and store the timings in ``manifest`` and the collection property."""
    t0 = time.perf_counter()
    insert_rows(client, name, vecs, ids, sem, batch_size, progress, source, manifest["collection"])
    client.flush(name)
    insert_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ip = client.prepare_index_params()
    ip.add_index(
        field_name=VECTOR,
        index_type=manifest["index_type"],
        metric_type="IP",
        params=manifest["index_params"],
        index_name=VECTOR,
    )
    client.create_index(
        name, ip, sync=False
    )  # waited for below (pymilvus' own wait needs AllocTimestamp, absent from Milvus Lite)
    wait_indexed(client, name, len(ids), timeout_s)
    index_s = time.perf_counter() - t0
    manifest.update({"insert_seconds": round(insert_s, 3), "index_seconds": round(index_s, 3)})
    client.alter_collection_properties(name, properties={PROPERTY: json.dumps(manifest, ensure_ascii=False)})


def _collection_manifest(
    collection: str,
    itype: str,
    params: dict[str, Any],
    requested: str,
    fallback: str | None,
    d: int,
    src_dim: int,
    n: int,
    sem,
    sem_info,
    tower: dict[str, Any],
    info: dict[str, Any],
    version: str,
    pymilvus_version: str,
) -> dict[str, Any]:
    """The ``scalingnote.manifest`` property of an exported collection."""
    search_defaults: dict[str, int] = {}
    if itype in IVF_TYPES:
        search_defaults["nprobe"] = int(min(DEFAULT_NPROBE, params["nlist"]))
    if itype in HNSW_TYPES:
        search_defaults["ef_search"] = DEFAULT_EF_SEARCH
    L = int(sem.shape[1]) if sem is not None else 0
    return {
        "format": FORMAT,
        "collection": collection,
        "metric": "inner_product",
        "milvus_metric": "IP",
        "normalized": True,
        "dim": d,
        "source_dim": int(src_dim),
        "matryoshka_prefix": d < int(src_dim),
        "n_vectors": n,
        "factory": f"milvus:{itype}",
        "index_type": itype,
        "index_params": params,
        "requested_index_type": requested,
        "fallback_reason": fallback,
        "nlist": int(params["nlist"]) if "nlist" in params else None,
        "search_defaults": search_defaults,
        "semantic_ids": ({"n_layers": L, **(sem_info or {})} if sem is not None else None),
        "fields": {"pk": PK, "doc_id": DOC_ID, "semantic_id": SEM_ID if sem is not None else None, "vector": VECTOR},
        "tower": tower,
        "source": info,
        "embeddings_dir": info.get(
            "embeddings_dir"
        ),  # where the service finds the corpus (titles), as in FAISS manifests
        "server_version": version,
        "pymilvus_version": pymilvus_version,
        "created": _now(),
    }


__all__ = ["default_index_params", "export_to_milvus", "resolve_index_type"]
