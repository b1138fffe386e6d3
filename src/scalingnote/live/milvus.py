"""Add, replace and delete documents in a Milvus collection exported by ``scalingnote index
export --to milvus`` (a Milvus server or Milvus Lite), through pymilvus.

The collection's primary key is the FAISS row of the exported documents; a document added
live gets a key derived from its id (a 62-bit BLAKE2b hash with bit 62 set, so it never
collides with a row number) and is written with ``upsert``; any earlier version of the id
(exported row or live key) is deleted first by a ``doc_id in [...]`` filter. The documents
are encoded by the collection's document tower (its fingerprint is checked against the
collection's manifest, as for a FAISS index) and get their semantic IDs from the residual-
K-means codebooks of the index the collection was exported from (``source.path``).
Durability is Milvus's own (its write-ahead log): a call returns after Milvus acknowledged it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.data.types import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index.embeddings import _encode_call, l2_normalize
from scalingnote.index.milvus import DOC_ID, PK, SEM_ID, VECTOR, connect, read_collection_manifest
from scalingnote.index.semantic_ids import ResidualKMeans
from scalingnote.live.index import check_document_tower, load_document_tower

LIVE_KEY_BIT = 1 << 62


def live_key(doc_id: str) -> int:
    """The primary key of a live-added document: stable per id, disjoint from row numbers."""
    h = int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "big")
    return LIVE_KEY_BIT | (h & (LIVE_KEY_BIT - 1))


class MilvusLive:
    """Writer of a scalingnote Milvus collection; ``document_tower``: a tower or name/path
    (default: the one the manifest names)."""

    def __init__(self, uri: str | Path, collection: str, *, token: str | None = None, document_tower=None, codebooks: str | Path | None = None):
        self.client = connect(uri, token)
        self.collection = collection
        self.manifest = read_collection_manifest(self.client, collection, f"{uri} collection {collection!r}")
        self.where = f"{uri} collection {collection!r}"
        self._tower_spec = document_tower
        self._tower = None
        self.rkm = self._codebooks(codebooks)

    def _codebooks(self, codebooks) -> ResidualKMeans | None:
        sem = self.manifest.get("semantic_ids")
        if not sem:
            return None
        if codebooks is None:
            src = (self.manifest.get("source") or {}).get("path")
            codebooks = Path(src) / sem.get("codebooks", "semantic_ids.npz") if src else None
        if codebooks is None or not Path(codebooks).exists():
            raise ScalingNoteError(f"{self.where}: has semantic IDs, but their codebooks are not found ({codebooks}); pass codebooks=")
        return ResidualKMeans.load(codebooks)

    @property
    def document_tower(self):
        if self._tower is None:
            t = load_document_tower(self.manifest, self._tower_spec)
            check_document_tower(self.manifest, t, self.where)
            self._tower = t
        return self._tower

    def upsert(self, docs: Sequence[Document], vectors: np.ndarray | None = None) -> dict[str, Any]:
        docs = list(docs)
        dim = int(self.manifest["dim"])
        if vectors is None:
            vectors = np.asarray(_encode_call(self.document_tower, docs, 64), dtype=np.float32)
        x = l2_normalize(np.ascontiguousarray(np.asarray(vectors, dtype=np.float32)[:, :dim]))
        sem = self.rkm.assign(x) if self.rkm is not None else None
        ids = [d.id for d in docs]
        self.client.delete(self.collection, filter=f"{DOC_ID} in {json.dumps(ids, ensure_ascii=False)}")
        rows = []
        for i, d in enumerate(docs):
            row = {PK: live_key(d.id), DOC_ID: d.id, VECTOR: x[i].tolist()}
            if sem is not None:
                row[SEM_ID] = sem[i].astype(int).tolist()
            rows.append(row)
        self.client.upsert(self.collection, rows)
        return {"upserted": len(rows)}

    def delete(self, ids: Sequence[str]) -> dict[str, Any]:
        res = self.client.delete(self.collection, filter=f"{DOC_ID} in {json.dumps(list(ids), ensure_ascii=False)}")
        n = res.get("delete_count") if isinstance(res, dict) else None
        return {"deleted": n}

    def close(self) -> None:
        self.client.close()
