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
import importlib.util
import json
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.layout import DEFAULT_EF_SEARCH, DEFAULT_NPROBE, check_query_tower
from scalingnote.index.searcher import Queries, SearchResult, VectorSearcher

FORMAT = "scalingnote-milvus/1"
PROPERTY = "scalingnote.manifest"
PK, DOC_ID, SEM_ID, VECTOR = "row", "doc_id", "semantic_id", "embedding"
DEFAULT_COLLECTION = "scalingnote"

INSTALL_HINT = (
    "the Milvus back end needs pymilvus (and milvus-lite for local .db files): "
    "pip install 'pymilvus==3.0.2' 'milvus-lite==3.2.2'"
)

SERVER_INDEX_TYPES = ("IVF_PQ", "HNSW", "HNSW_SQ", "HNSW_PQ", "IVF_FLAT", "IVF_SQ8", "SCANN", "FLAT", "AUTOINDEX")
LITE_INDEX_TYPES = ("HNSW", "HNSW_SQ", "IVF_FLAT", "IVF_SQ8", "FLAT", "BRUTE_FORCE", "AUTOINDEX")
IVF_TYPES = ("IVF_PQ", "IVF_FLAT", "IVF_SQ8", "SCANN")  # SCANN: IVF + 4-bit fast-scan PQ (server only)
HNSW_TYPES = ("HNSW", "HNSW_SQ", "HNSW_PQ", "AUTOINDEX")
MAX_TOPK = 16384  # Milvus' limit on limit (topk) per search


class MilvusSearchError(RuntimeError):
    """A search the Milvus server failed (unreachable, collection dropped...): an operational
    failure, not bad input (the service answers 500, not 422)."""


_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")

log = logging.getLogger("scalingnote.index.milvus.milvus")


# --------------------------------------------------------------------------- connection


def _pymilvus():
    try:
        import pymilvus  # why: pymilvus is an optional extra (the Milvus back end only)
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
            f"collection name {name!r}: Milvus names start with a letter or '_' and contain only letters, digits "
            "and '_' (at most 255)"
        )
    return name


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


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
        raise ScalingNoteError(
            f"{where}: property {PROPERTY!r} field 'format' is {man.get('format')!r}, expected {FORMAT!r}"
        )
    return man


class MilvusSearcher(VectorSearcher):
    """A Milvus collection opened for search; the :class:`~scalingnote.index.searcher.Searcher`
    interface of :class:`~scalingnote.index.DenseIndex` (``search``, ``search_run``,
    ``query_vectors``, ``manifest``, ``dim``, ``factory``, ``len()``, ``doc_ids``). Use :meth:`open`."""

    def __init__(self, client, uri: str, collection: str, manifest: dict[str, Any], query_tower=None):
        self.client = client
        self.uri = uri
        self.collection = collection
        self.manifest = manifest
        self.query_tower = query_tower
        self.root = f"{uri}#{collection}"  # for messages, like DenseIndex.root
        self._doc_ids: list[str] | None = None

    @classmethod
    def open(
        cls, uri: str | Path, collection: str = DEFAULT_COLLECTION, query_tower=None, *, token: str | None = None
    ) -> MilvusSearcher:
        """Connect, read the manifest, check ``query_tower`` against the document tower
        (compat id + dim, as :meth:`DenseIndex.open`), load the collection."""
        uri = str(uri)
        if is_lite_uri(uri) and not Path(uri).exists():
            raise ScalingNoteError(
                f"{uri}: no Milvus Lite database here (export one with `scalingnote index export --to milvus "
                f"--uri {uri}`)"
            )
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
    def index_type(self) -> str:
        return str(self.manifest["index_type"])

    supports_rerank = True  # capability flags (SearcherBase); no upsert / delete here: scalingnote.live.milvus writes
    #: Milvus consistency level of searches (None: the collection's, Bounded on a server);
    #: the live form (scalingnote.live.milvus) reads its own writes with "Session"
    consistency: str | None = None

    @property
    def has_ivf(self) -> bool:
        return self.index_type in IVF_TYPES

    @property
    def has_hnsw(self) -> bool:
        return self.index_type in HNSW_TYPES

    @property
    def doc_ids(self) -> list[str]:
        """All document ids in row order (read from the collection once, O(n))."""
        if self._doc_ids is None:
            n, step = len(self), 16384  # Milvus: at most 16384 rows per query
            ids: list[str | None] = [None] * n
            for s in range(0, n, step):  # primary-key ranges (no query iterator: Milvus Lite lacks AllocTimestamp)
                try:
                    rows = self.client.query(
                        self.collection,
                        filter=f"{PK} >= {s} and {PK} < {s + step}",
                        output_fields=[PK, DOC_ID],
                        limit=step,
                    )
                except Exception as e:  # noqa: BLE001
                    raise ScalingNoteError(f"{self.root}: reading document ids failed: {_milvus_message(e)}") from None
                for r in rows:
                    ids[int(r[PK])] = r[DOC_ID]
            if any(i is None for i in ids):
                raise ScalingNoteError(
                    f"{self.root}: the collection holds fewer rows than its manifest's n_vectors ({len(self)})"
                )
            self._doc_ids = ids  # type: ignore[assignment]
        return self._doc_ids  # type: ignore[return-value]

    # ------------------------------------------------------------------ search
    def _search_params(self, nprobe: int | None, ef_search: int | None, n_cand: int) -> dict[str, Any]:
        defaults = self.manifest.get("search_defaults") or {}
        params: dict[str, Any] = {}
        if nprobe is not None:
            if not self.has_ivf:
                raise ScalingNoteError(
                    f"nprobe={nprobe} given, but collection index {self.index_type} has no IVF layer"
                )
            if nprobe < 1:
                raise ScalingNoteError(f"nprobe must be >= 1, got {nprobe}")
        if ef_search is not None:
            if not self.has_hnsw:
                raise ScalingNoteError(
                    f"ef_search={ef_search} given, but collection index {self.index_type} has no HNSW graph"
                )
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
        queries: Queries,
        k: int = 10,
        *,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rerank: int | None = None,
        chunk: int = 1024,
    ) -> SearchResult:
        """Top-``k`` documents per query (see :meth:`DenseIndex.search`). ``rerank=N`` fetches
        ``max(N, k)`` candidates with their stored vectors and re-scores them exactly."""
        q, n_cand = self.prepare_search(queries, k, rerank)
        if n_cand > MAX_TOPK:
            raise ScalingNoteError(
                f"Milvus returns at most {MAX_TOPK} results per query; asked for {n_cand} (k / rerank)"
            )
        sp = {"metric_type": "IP", "params": self._search_params(nprobe, ef_search, n_cand)}
        sem_field = (self.manifest.get("fields") or {}).get("semantic_id")
        fields = [PK, DOC_ID] + ([sem_field] if sem_field else []) + ([VECTOR] if rerank else [])
        L = int((self.manifest.get("semantic_ids") or {}).get("n_layers") or 0) if sem_field else 0
        nq = q.shape[0]
        top_scores = np.full((nq, k), -np.inf, dtype=np.float32)
        indices = np.full((nq, k), -1, dtype=np.int64)
        sem = np.full((nq, k, L), -1, dtype=np.int32) if sem_field else None
        doc_ids: list[list[str]] = []
        for s in range(0, nq, chunk):
            block = q[s : s + chunk]
            try:
                level = {"consistency_level": self.consistency} if self.consistency else {}
                res = self.client.search(
                    self.collection,
                    data=[v for v in block],
                    limit=n_cand,
                    anns_field=VECTOR,
                    search_params=sp,
                    output_fields=fields,
                    **level,
                )
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
                top_scores[row, :m] = scores
                indices[row, :m] = [int(e[PK]) for e in ents]
                doc_ids.append([e[DOC_ID] for e in ents])
                if sem is not None:
                    for r, ent in enumerate(ents):
                        sem[row, r, : len(ent[sem_field])] = ent[sem_field]
        return SearchResult(top_scores, doc_ids, sem, indices)


__all__ = [
    "FORMAT",
    "MilvusSearchError",
    "MilvusSearcher",
    "connect",
    "is_lite_uri",
    "read_collection_manifest",
]
