"""Milvus as a serving back end: export an index / embeddings into a Milvus collection and
search it through :class:`MilvusSearcher`, which has the interface of
:class:`scalingnote.index.DenseIndex` (``search(queries, k, nprobe=, ef_search=, rerank=)``
-> :class:`~scalingnote.index.SearchResult` with document ids, scores and semantic IDs).

``pymilvus`` is imported lazily: the rest of the package works without it, and using
this module without it raises a :class:`~scalingnote.errors.ScalingNoteError` saying
what to install. A URI ending in ``.db`` (a local path) runs **Milvus Lite** in-process
(package ``milvus-lite``); any other URI (``http://host:19530``, Zilliz Cloud) is a
Milvus server.

Collection layout
-----------------
``row`` INT64 primary key (= the FAISS row / corpus order), ``doc_id`` VARCHAR,
``semantic_id`` ARRAY<INT32> (the residual-K-means semantic ID, ScalingNote §3.5; left
out when there are none), ``embedding`` FLOAT_VECTOR(dim) (L2-normalised, metric IP =
cosine, as the FAISS indexes). The scalingnote manifest -- document-tower identity
(name, fingerprint, compat id, dim), index type and parameters actually built,
search defaults, source -- is stored as JSON in the collection property
``scalingnote.manifest``; the collection description repeats the tower identity in a
line of text (Milvus Lite 3.2.2 does not keep descriptions; the property is the
record). :meth:`MilvusSearcher.open` refuses a query tower whose compat id differs
(:func:`scalingnote.index.check_query_tower`, the FAISS rule).

Index types
-----------
``index_type="auto"`` builds **IVF_PQ** on a Milvus server (the compressed IVFPQ
serving index of ScalingNote §3.5), and **HNSW** on Milvus Lite: Milvus Lite 3.2.2
implements HNSW, HNSW_SQ, IVF_FLAT, IVF_SQ8 and FLAT / BRUTE_FORCE (AUTOINDEX = HNSW)
-- its IVF_PQ is "reserved for a future phase": it accepts the index definition, fails
to build it in the background and silently searches unindexed segments by brute
force. Asking explicitly for a type Milvus Lite lacks is therefore an error rather
than a silent fallback. The type and parameters actually built are in the manifest
(``index_type``, ``index_params``, ``requested_index_type``, ``fallback_reason``).

Export is atomic per collection: rows go into a temporary collection that is renamed
onto the final name only when complete and indexed (with ``overwrite=True`` the old
collection is dropped just before the rename).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.dense import DEFAULT_EF_SEARCH, DEFAULT_NPROBE, DenseIndex, SearchResult, check_query_tower
from scalingnote.index.embeddings import Embeddings, l2_normalize

FORMAT = "scalingnote-milvus/1"
PROPERTY = "scalingnote.manifest"
PK, DOC_ID, SEM_ID, VECTOR = "row", "doc_id", "semantic_id", "embedding"
DEFAULT_COLLECTION = "scalingnote"

INSTALL_HINT = "the Milvus back end needs pymilvus (and milvus-lite for local .db files): pip install 'pymilvus==3.0.2' 'milvus-lite==3.2.2'"

SERVER_INDEX_TYPES = ("IVF_PQ", "HNSW", "HNSW_SQ", "HNSW_PQ", "IVF_FLAT", "IVF_SQ8", "SCANN", "FLAT", "AUTOINDEX")
LITE_INDEX_TYPES = ("HNSW", "HNSW_SQ", "IVF_FLAT", "IVF_SQ8", "FLAT", "BRUTE_FORCE", "AUTOINDEX")
IVF_TYPES = ("IVF_PQ", "IVF_FLAT", "IVF_SQ8", "SCANN")  # SCANN: IVF + 4-bit fast-scan PQ (server only)
HNSW_TYPES = ("HNSW", "HNSW_SQ", "HNSW_PQ", "AUTOINDEX")
MAX_TOPK = 16384  # Milvus' limit on limit (topk) per search


class MilvusSearchError(RuntimeError):
    """A search the Milvus server failed (unreachable, collection dropped...): an operational
    failure, not bad input (the service answers 500, not 422)."""
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")

log = logging.getLogger("scalingnote.index.milvus")


# --------------------------------------------------------------------------- connection


def _pymilvus():
    try:
        import pymilvus
    except ImportError as e:
        raise ScalingNoteError(f"{INSTALL_HINT} ({e})") from None
    return pymilvus


def is_lite_uri(uri: str) -> bool:
    """A local ``.db`` path (Milvus Lite) rather than a server URL."""
    return "://" not in str(uri) and str(uri).endswith(".db")


def connect(uri: str | Path, token: str | None = None, db_name: str | None = None):
    """A ``pymilvus.MilvusClient`` for ``uri`` with clear errors (missing package, unreachable server)."""
    pm = _pymilvus()
    uri = str(uri)
    if is_lite_uri(uri):
        import importlib.util

        if importlib.util.find_spec("milvus_lite") is None:
            raise ScalingNoteError(f"{uri}: a local .db URI runs Milvus Lite, which is not installed: {INSTALL_HINT}")
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
    plog = logging.getLogger("pymilvus")
    if plog.level in (logging.NOTSET, logging.WARNING):  # WARNING: pymilvus' own default
        # pymilvus logs every failed RPC with a traceback at ERROR (and iterator set-up
        # notes at WARNING); the ScalingNoteError raised here says it once
        plog.setLevel(logging.CRITICAL)
    kw: dict[str, Any] = {"uri": uri}
    if token:
        kw["token"] = token
    if db_name:
        kw["db_name"] = db_name
    try:
        return pm.MilvusClient(**kw)
    except Exception as e:  # noqa: BLE001 - MilvusException / gRPC errors
        raise ScalingNoteError(f"cannot connect to Milvus at {uri}: {_milvus_message(e)}") from None


def _milvus_message(e: BaseException) -> str:
    msg = getattr(e, "message", None) or str(e)
    return str(msg).strip().splitlines()[0] if str(msg).strip() else type(e).__name__


def server_version(client) -> str:
    try:
        return str(client.get_server_version())
    except Exception:  # noqa: BLE001
        return "unknown"


def is_lite(client) -> bool:
    return server_version(client).startswith("milvus_lite")


def _check_name(name: str) -> str:
    if not _NAME_RE.match(name or ""):
        raise ScalingNoteError(
            f"collection name {name!r}: Milvus names start with a letter or '_' and contain only letters, digits and '_' (at most 255)"
        )
    return name


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- source


def _load_source(source: str | Path | Embeddings, dim: int | None, semantic_ids_layers: int, codebook_size: int, train_size: int, seed: int):
    """``(vectors (n, d) array-like, doc_ids, semantic_ids or None, tower, info)`` from a FAISS
    index directory (its indexed vectors, ids and semantic IDs) or an embeddings
    directory (semantic IDs fitted as :func:`~scalingnote.index.build_index` does)."""
    from scalingnote.index.dense import FORMAT as INDEX_FORMAT
    from scalingnote.index.embeddings import load_embeddings

    if isinstance(source, Embeddings):
        emb, path = source, str(source.root)
    else:
        path = str(Path(source))
        mpath = Path(source) / "manifest.json"
        if not mpath.is_file():
            raise ScalingNoteError(f"{source}: no manifest.json: give a FAISS index directory (`index build`) or an embeddings directory (`index encode`)")
        try:
            fmt = json.loads(mpath.read_text(encoding="utf-8")).get("format", "")
        except json.JSONDecodeError as e:
            raise ScalingNoteError(f"{mpath}: line {e.lineno}: invalid JSON ({e.msg})") from None
        if fmt == INDEX_FORMAT:
            if dim is not None:
                raise ScalingNoteError(f"{source}: --dim applies to an embeddings directory; an index directory is exported at its own dim")
            index = DenseIndex.open(source)
            m = index.manifest
            info = {
                "kind": "faiss-index", "path": str(Path(source).resolve()), "factory": m.get("factory"), "nlist": m.get("nlist"),
                "embeddings_dir": m.get("embeddings_dir"),
            }
            sem_info = m.get("semantic_ids")
            return index.vectors, list(index.doc_ids), index.semantic_ids, dict(m.get("tower") or {}), int(m.get("source_dim", m["dim"])), sem_info, info
        emb = load_embeddings(source)
    src_dim = emb.dim
    d = src_dim if dim is None else int(dim)
    if not 1 <= d <= src_dim:
        raise ScalingNoteError(f"dim: {d} is not a valid Matryoshka prefix of {src_dim}-d embeddings (1..{src_dim})")
    vecs = emb.vectors
    if d < src_dim or not emb.manifest.get("normalized", True):
        vecs = l2_normalize(np.asarray(vecs[:, :d]))
    sem, sem_info = None, None
    if semantic_ids_layers and semantic_ids_layers > 0:
        # same seeded sample and residual K-means as build_index (ScalingNote §3.5)
        from scalingnote.index.semantic_ids import ResidualKMeans

        n = len(emb)
        rng = np.random.default_rng(seed)
        n_train = min(int(train_size), n)
        rows = np.sort(rng.choice(n, size=n_train, replace=False)) if n_train < n else np.arange(n)
        train_x = np.ascontiguousarray(np.asarray(vecs)[rows], dtype=np.float32)
        rkm = ResidualKMeans(n_layers=semantic_ids_layers, codebook_size=codebook_size, seed=seed).fit(train_x)
        sem = rkm.assign(np.asarray(vecs, dtype=np.float32))
        sem_info = {"source": "fitted at export", "seed": int(seed), "n_train": int(n_train), **rkm.describe()}
    p = str(Path(path).resolve())
    info = {"kind": "embeddings", "path": p, "embeddings_dir": p}
    return vecs, list(emb.ids), sem, dict(emb.tower), src_dim, sem_info, info


def _default_nlist(n: int) -> int:
    # FAISS / Milvus guidance: ~4*sqrt(n) lists, and >= 39 training points per list
    return int(max(1, min(65536, round(4 * math.sqrt(n)), n // 39)))


def _default_pq_m(dim: int) -> int:
    """Sub-quantisers: the largest divisor of dim giving >= 8 dimensions each (dim 384 -> 48, 128 -> 16)."""
    for m in range(max(1, dim // 8), 0, -1):
        if dim % m == 0:
            return m
    return 1


def default_index_params(index_type: str, n: int, dim: int, source_info: dict[str, Any] | None = None) -> dict[str, Any]:
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
        if index_type == "HNSW_SQ":
            params["sq_type"] = "SQ8"
        if index_type == "HNSW_PQ":
            params.update({"m": _default_pq_m(dim), "nbits": 8})
        return params
    return {}


def resolve_index_type(requested: str, lite: bool) -> tuple[str, str | None]:
    """``(index_type, fallback_reason)`` for ``requested`` ("auto" or a Milvus index type)."""
    req = (requested or "auto").strip().upper()
    supported = LITE_INDEX_TYPES if lite else SERVER_INDEX_TYPES
    if req == "AUTO":
        if lite:
            return "HNSW", "Milvus Lite does not implement IVF_PQ (supported: " + ", ".join(LITE_INDEX_TYPES) + "); built HNSW instead"
        return "IVF_PQ", None
    if req not in supported:
        where = "Milvus Lite" if lite else "this back end"
        raise ScalingNoteError(f"index type {requested!r}: not supported by {where}; choose one of: {', '.join(supported)} (or auto)")
    return req, None


# --------------------------------------------------------------------------- export


def export_to_milvus(
    source: str | Path | Embeddings,
    uri: str | Path,
    collection: str = DEFAULT_COLLECTION,
    *,
    index_type: str = "auto",
    index_params: dict[str, Any] | None = None,
    dim: int | None = None,
    semantic_ids_layers: int = 6,
    codebook_size: int = 256,
    train_size: int = 100_000,
    seed: int = 0,
    batch_size: int = 2048,
    overwrite: bool = False,
    token: str | None = None,
    index_timeout_s: float = 3600.0,
    progress: bool = True,
) -> dict[str, Any]:
    """Load embeddings, document ids and semantic IDs into the Milvus collection ``collection``.

    ``source``: a FAISS index directory (exports its indexed vectors, ids and semantic IDs,
    and reuses its nlist / PQ / HNSW sizes) or an embeddings directory (``dim`` picks a
    Matryoshka prefix; semantic IDs are fitted like ``build_index`` with
    ``semantic_ids_layers`` / ``codebook_size`` / ``train_size`` / ``seed``; 0 layers = none).
    ``index_type``: "auto" (IVF_PQ on a server, HNSW on Milvus Lite) or a Milvus index
    type; ``index_params`` override the defaults. Returns the manifest stored in the
    collection property ``scalingnote.manifest``.
    """
    t_start = time.perf_counter()
    _check_name(collection)
    if batch_size < 1:
        raise ScalingNoteError(f"batch_size must be >= 1, got {batch_size}")
    vecs, ids, sem, tower, src_dim, sem_info, info = _load_source(source, dim, semantic_ids_layers, codebook_size, train_size, seed)
    n = len(ids)
    if n == 0:
        raise ScalingNoteError(f"{source}: no documents to export")
    d = int(vecs.shape[1])
    if len(set(ids)) != n:
        raise ScalingNoteError(f"{source}: duplicate document ids")
    max_len = max(len(i.encode("utf-8")) for i in ids)
    if max_len > 65535:
        raise ScalingNoteError(f"{source}: a document id is {max_len} bytes long; Milvus VARCHAR holds at most 65535")

    pm = _pymilvus()
    client = connect(uri, token=token)
    try:
        lite = is_lite(client)
        version = server_version(client)
        itype, fallback = resolve_index_type(index_type, lite)
        params = default_index_params(itype, n, d, info)
        params.update(index_params or {})
        if itype == "IVF_PQ" and d % int(params["m"]) != 0:
            raise ScalingNoteError(f"index params: m={params['m']} must divide the dimension {d}")
        if client.has_collection(collection) and not overwrite:
            raise ScalingNoteError(f"{uri}: collection {collection!r} already exists (pass overwrite=True / --overwrite to replace it)")
        search_defaults: dict[str, int] = {}
        if itype in IVF_TYPES:
            search_defaults["nprobe"] = int(min(DEFAULT_NPROBE, params["nlist"]))
        if itype in HNSW_TYPES:
            search_defaults["ef_search"] = DEFAULT_EF_SEARCH
        L = int(sem.shape[1]) if sem is not None else 0
        manifest = {
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
            "requested_index_type": index_type,
            "fallback_reason": fallback,
            "nlist": int(params["nlist"]) if "nlist" in params else None,
            "search_defaults": search_defaults,
            "semantic_ids": ({"n_layers": L, **(sem_info or {})} if sem is not None else None),
            "fields": {"pk": PK, "doc_id": DOC_ID, "semantic_id": SEM_ID if sem is not None else None, "vector": VECTOR},
            "tower": tower,
            "source": info,
            "embeddings_dir": info.get("embeddings_dir"),  # where the service finds the corpus (titles), as in FAISS manifests
            "server_version": version,
            "pymilvus_version": pm.__version__,
            "created": _now(),
        }
        tmp = f"{collection}__tmp_{os.getpid()}"
        if client.has_collection(tmp):
            client.drop_collection(tmp)
        DataType = pm.DataType
        description = "scalingnote: document tower {name} (compat_id {compat}, fingerprint {fp})".format(
            name=tower.get("name", "?"), compat=tower.get("compat_id", "?"), fp=tower.get("fingerprint", "?")
        )
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False, description=description)
        schema.add_field(PK, DataType.INT64, is_primary=True)
        schema.add_field(DOC_ID, DataType.VARCHAR, max_length=max(1, max_len))
        if sem is not None:
            schema.add_field(SEM_ID, DataType.ARRAY, element_type=DataType.INT32, max_capacity=max(1, L))
        schema.add_field(VECTOR, DataType.FLOAT_VECTOR, dim=d)
        try:
            client.create_collection(tmp, schema=schema, properties={PROPERTY: json.dumps(manifest, ensure_ascii=False)})
            from tqdm.auto import tqdm

            t0 = time.perf_counter()
            with tqdm(total=n, unit="vec", desc=f"milvus insert {collection}", disable=not progress, dynamic_ncols=True) as bar:
                for s in range(0, n, batch_size):
                    block = np.ascontiguousarray(np.asarray(vecs[s : s + batch_size], dtype=np.float32))
                    if not np.all(np.isfinite(block)):
                        bad = s + int(np.argwhere(~np.isfinite(block))[0, 0])
                        raise ScalingNoteError(f"{source}: row {bad} (document {ids[bad]!r}) contains non-finite values")
                    rows = []
                    for j in range(len(block)):
                        r: dict[str, Any] = {PK: s + j, DOC_ID: ids[s + j], VECTOR: block[j]}
                        if sem is not None:
                            r[SEM_ID] = [int(c) for c in sem[s + j]]
                        rows.append(r)
                    client.insert(tmp, rows)
                    bar.update(len(rows))
            client.flush(tmp)
            insert_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            ip = client.prepare_index_params()
            ip.add_index(field_name=VECTOR, index_type=itype, metric_type="IP", params=params, index_name=VECTOR)
            client.create_index(tmp, ip, sync=False)  # waited for below (pymilvus' own wait needs AllocTimestamp, absent from Milvus Lite)
            _wait_indexed(client, tmp, n, index_timeout_s)
            index_s = time.perf_counter() - t0
            manifest.update({"insert_seconds": round(insert_s, 3), "index_seconds": round(index_s, 3)})
            client.alter_collection_properties(tmp, properties={PROPERTY: json.dumps(manifest, ensure_ascii=False)})
            if client.has_collection(collection):  # overwrite (checked above)
                client.drop_collection(collection)
            client.rename_collection(tmp, collection)
        except ScalingNoteError:
            _drop_quietly(client, tmp)
            raise
        except Exception as e:  # noqa: BLE001 - MilvusException etc.
            _drop_quietly(client, tmp)
            raise ScalingNoteError(f"{uri}: exporting to collection {collection!r} failed: {_milvus_message(e)}") from None
        client.load_collection(collection)
        manifest["export_seconds"] = round(time.perf_counter() - t_start, 3)
        return manifest
    finally:
        client.close()


def _drop_quietly(client, name: str) -> None:
    try:
        if client.has_collection(name):
            client.drop_collection(name)
    except Exception:  # noqa: BLE001 - best effort clean-up
        pass


def _wait_indexed(client, name: str, n: int, timeout_s: float) -> None:
    """Wait until the index covers all ``n`` rows (a server builds indexes asynchronously)."""
    t0 = time.perf_counter()
    while True:
        desc = client.describe_index(name, VECTOR) or {}
        state = str(desc.get("state", "Finished"))
        if state.lower() == "failed":
            raise ScalingNoteError(f"Milvus failed to build the index on {name!r}: {desc.get('index_state_fail_reason') or desc}")
        indexed = desc.get("indexed_rows")
        pending = desc.get("pending_index_rows", 0)
        if (indexed is None or int(indexed) >= n) and not pending and state.lower() in ("finished", "3"):
            return
        if time.perf_counter() - t0 > timeout_s:
            raise ScalingNoteError(f"index on {name!r} not built after {timeout_s:.0f}s (state {state}, {indexed}/{n} rows indexed)")
        time.sleep(0.5)


# --------------------------------------------------------------------------- search


def read_collection_manifest(client, collection: str, where: str = "") -> dict[str, Any]:
    """The scalingnote manifest stored in ``collection``'s properties."""
    where = where or collection
    if not client.has_collection(collection):
        raise ScalingNoteError(f"{where}: no such collection (export one with `scalingnote index export --to milvus`)")
    desc = client.describe_collection(collection)
    props = desc.get("properties") or {}
    raw = props.get(PROPERTY)
    if raw is None:
        raise ScalingNoteError(f"{where}: the collection has no {PROPERTY!r} property: not exported by scalingnote")
    try:
        man = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ScalingNoteError(f"{where}: property {PROPERTY!r} is not valid JSON ({e.msg})") from None
    if man.get("format") != FORMAT:
        raise ScalingNoteError(f"{where}: property {PROPERTY!r} field 'format' is {man.get('format')!r}, expected {FORMAT!r}")
    return man


class MilvusSearcher:
    """A Milvus collection opened for search; same interface as :class:`~scalingnote.index.DenseIndex`
    (``search``, ``search_run``, ``query_vectors``, ``manifest``, ``dim``, ``factory``,
    ``len()``, ``doc_ids``). Use :meth:`open`."""

    def __init__(self, client, uri: str, collection: str, manifest: dict[str, Any], query_tower=None):
        self.client = client
        self.uri = uri
        self.collection = collection
        self.manifest = manifest
        self.query_tower = query_tower
        self.root = f"{uri}#{collection}"  # for messages, like DenseIndex.root
        self._doc_ids: list[str] | None = None

    @classmethod
    def open(cls, uri: str | Path, collection: str = DEFAULT_COLLECTION, query_tower=None, *, token: str | None = None) -> MilvusSearcher:
        """Connect, read the manifest, check ``query_tower`` against the document tower
        (compat id + dim, as :meth:`DenseIndex.open`), load the collection."""
        uri = str(uri)
        if is_lite_uri(uri) and not Path(uri).exists():
            raise ScalingNoteError(f"{uri}: no Milvus Lite database here (export one with `scalingnote index export --to milvus --uri {uri}`)")
        client = connect(uri, token=token)
        where = f"{uri} collection {collection!r}"
        try:
            man = read_collection_manifest(client, collection, where)
            if query_tower is not None:
                check_query_tower(man, query_tower, where)
            client.load_collection(collection)
        except ScalingNoteError:
            client.close()
            raise
        except Exception as e:  # noqa: BLE001
            client.close()
            raise ScalingNoteError(f"{where}: {_milvus_message(e)}") from None
        return cls(client, uri, collection, man, query_tower)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> MilvusSearcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ props
    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def factory(self) -> str:
        return str(self.manifest["factory"])

    @property
    def index_type(self) -> str:
        return str(self.manifest["index_type"])

    @property
    def has_ivf(self) -> bool:
        return self.index_type in IVF_TYPES

    @property
    def has_hnsw(self) -> bool:
        return self.index_type in HNSW_TYPES

    def __len__(self) -> int:
        return int(self.manifest["n_vectors"])

    @property
    def doc_ids(self) -> list[str]:
        """All document ids in row order (read from the collection once, O(n))."""
        if self._doc_ids is None:
            n, step = len(self), 16384  # Milvus: at most 16384 rows per query
            ids: list[str | None] = [None] * n
            for s in range(0, n, step):  # primary-key ranges (no query iterator: Milvus Lite lacks AllocTimestamp)
                try:
                    rows = self.client.query(self.collection, filter=f"{PK} >= {s} and {PK} < {s + step}", output_fields=[PK, DOC_ID], limit=step)
                except Exception as e:  # noqa: BLE001
                    raise ScalingNoteError(f"{self.root}: reading document ids failed: {_milvus_message(e)}") from None
                for r in rows:
                    ids[int(r[PK])] = r[DOC_ID]
            if any(i is None for i in ids):
                raise ScalingNoteError(f"{self.root}: the collection holds fewer rows than its manifest's n_vectors ({len(self)})")
            self._doc_ids = ids  # type: ignore[assignment]
        return self._doc_ids  # type: ignore[return-value]

    def info(self) -> dict[str, Any]:
        return dict(self.manifest)

    # ------------------------------------------------------------------ search
    def query_vectors(self, queries: np.ndarray | str | Sequence[str]) -> np.ndarray:
        """Texts (via the query tower) or vectors -> (nq, dim) unit vectors; the rules of
        :meth:`DenseIndex.query_vectors` (shared implementation: it only reads ``dim``,
        ``manifest`` and ``query_tower``)."""
        return DenseIndex.query_vectors(self, queries)  # type: ignore[arg-type]

    def _search_params(self, nprobe: int | None, ef_search: int | None, n_cand: int) -> dict[str, Any]:
        defaults = self.manifest.get("search_defaults") or {}
        params: dict[str, Any] = {}
        if nprobe is not None:
            if not self.has_ivf:
                raise ScalingNoteError(f"nprobe={nprobe} given, but collection index {self.index_type} has no IVF layer")
            if nprobe < 1:
                raise ScalingNoteError(f"nprobe must be >= 1, got {nprobe}")
        if ef_search is not None:
            if not self.has_hnsw:
                raise ScalingNoteError(f"ef_search={ef_search} given, but collection index {self.index_type} has no HNSW graph")
            if ef_search < 1:
                raise ScalingNoteError(f"ef_search must be >= 1, got {ef_search}")
        if self.has_ivf:
            nlist = int(self.manifest.get("nlist") or 1)
            params["nprobe"] = int(min(nlist, nprobe if nprobe is not None else defaults.get("nprobe", DEFAULT_NPROBE)))
            if self.index_type == "SCANN":  # candidates re-ranked exactly after the 4-bit fast-scan PQ pass
                params["reorder_k"] = int(max(n_cand, defaults.get("reorder_k", 100)))
        if self.has_hnsw:
            ef = ef_search if ef_search is not None else defaults.get("ef_search", DEFAULT_EF_SEARCH)
            params["ef"] = int(max(ef, n_cand))  # a beam of width ef returns at most ~ef results
        return params

    def search(
        self,
        queries: np.ndarray | str | Sequence[str],
        k: int = 10,
        *,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rerank: int | None = None,
        chunk: int = 1024,
    ) -> SearchResult:
        """Top-``k`` documents per query (see :meth:`DenseIndex.search`). ``rerank=N`` fetches
        ``max(N, k)`` candidates with their stored vectors and re-scores them exactly."""
        if k < 1:
            raise ScalingNoteError(f"k must be >= 1, got {k}")
        if rerank is not None and rerank < 1:
            raise ScalingNoteError(f"rerank must be >= 1 (number of candidates), got {rerank}")
        q = self.query_vectors(queries)
        n_cand = min(max(k, rerank) if rerank else k, len(self))
        if n_cand > MAX_TOPK:
            raise ScalingNoteError(f"Milvus returns at most {MAX_TOPK} results per query; asked for {n_cand} (k / rerank)")
        sp = {"metric_type": "IP", "params": self._search_params(nprobe, ef_search, n_cand)}
        sem_field = (self.manifest.get("fields") or {}).get("semantic_id")
        fields = [PK, DOC_ID] + ([sem_field] if sem_field else []) + ([VECTOR] if rerank else [])
        L = int((self.manifest.get("semantic_ids") or {}).get("n_layers") or 0) if sem_field else 0
        nq = q.shape[0]
        D = np.full((nq, k), -np.inf, dtype=np.float32)
        I = np.full((nq, k), -1, dtype=np.int64)
        sem = np.full((nq, k, L), -1, dtype=np.int32) if sem_field else None
        doc_ids: list[list[str]] = []
        for s in range(0, nq, chunk):
            block = q[s : s + chunk]
            try:
                res = self.client.search(self.collection, data=[v for v in block], limit=n_cand, anns_field=VECTOR, search_params=sp, output_fields=fields)
            except Exception as e:  # noqa: BLE001
                raise MilvusSearchError(f"{self.root}: search failed: {_milvus_message(e)}") from None
            for j, hits in enumerate(res):
                row = s + j
                ents = [h["entity"] for h in hits]
                scores = np.array([float(h["distance"]) for h in hits], dtype=np.float32)
                if rerank and ents:
                    vv = np.asarray([e[VECTOR] for e in ents], dtype=np.float32)
                    scores = vv @ block[j]  # exact inner products (TMJ §6 re-rank)
                    order = np.argsort(-scores, kind="stable")
                    scores, ents = scores[order], [ents[o] for o in order]
                ents, scores = ents[:k], scores[:k]
                m = len(ents)
                D[row, :m] = scores
                I[row, :m] = [int(e[PK]) for e in ents]
                doc_ids.append([e[DOC_ID] for e in ents])
                if sem is not None:
                    for r, e in enumerate(ents):
                        sem[row, r, : len(e[sem_field])] = e[sem_field]
        return SearchResult(D, doc_ids, sem, I)

    def search_run(self, query_ids: Sequence[str], queries, k: int = 100, batch_size: int = 256, progress: bool = False, **kw):
        """Search in batches and return a TREC-style run ``{qid: {doc_id: score}}``."""
        return DenseIndex.search_run(self, query_ids, queries, k=k, batch_size=batch_size, progress=progress, **kw)  # type: ignore[arg-type]


def open_searcher(backend: str, *, index_dir: str | Path | None = None, uri: str | Path | None = None, collection: str = DEFAULT_COLLECTION, query_tower=None, token: str | None = None):
    """A searcher for the serving back end ``backend``: ``"faiss"`` -> :class:`DenseIndex`
    over ``index_dir``; ``"milvus"`` -> :class:`MilvusSearcher` on ``uri`` / ``collection``.
    Both refuse a query tower incompatible with the document tower."""
    b = (backend or "faiss").lower()
    if b == "faiss":
        if index_dir is None:
            raise ScalingNoteError("backend faiss: an index directory is required (--index)")
        return DenseIndex.open(index_dir, query_tower=query_tower)
    if b == "milvus":
        if uri is None:
            raise ScalingNoteError("backend milvus: a Milvus URI is required (--uri, e.g. ./index.db for Milvus Lite or http://host:19530)")
        return MilvusSearcher.open(uri, collection, query_tower=query_tower, token=token)
    raise ScalingNoteError(f"backend {backend!r}: choose faiss or milvus")


__all__ = [
    "FORMAT",
    "MilvusSearchError",
    "MilvusSearcher",
    "connect",
    "default_index_params",
    "export_to_milvus",
    "is_lite_uri",
    "open_searcher",
    "read_collection_manifest",
    "resolve_index_type",
]
