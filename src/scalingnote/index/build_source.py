"""The vectors an index is built from: the source (an embeddings directory, loaded embeddings or an
array with ids) resolved and checked, the build's recorded inputs, and the full-precision vectors
written into the index directory (see :mod:`scalingnote.index.build`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.embeddings import Embeddings, l2_normalize, load_embeddings
from scalingnote.index.shards import content_digest
from scalingnote.utils.steps import canonical, content_fingerprint


@dataclass
class BuildSource:
    """The vectors to index with their ids, dimension, tower identity and embeddings directory."""

    data: Embeddings | np.ndarray
    ids: list[str]
    dim: int
    tower: dict[str, Any]
    embeddings_dir: str | None


def resolve_source(source, doc_ids: Sequence[str] | None, tower_info: dict[str, Any] | None) -> BuildSource:
    embeddings_dir: str | None = None
    if isinstance(source, (str, Path)):
        embeddings_dir = str(Path(source).resolve())
        source = load_embeddings(source)
    if isinstance(source, Embeddings):
        if doc_ids is not None:
            raise ScalingNoteError("doc_ids must not be given with an embeddings directory (it has its own ids)")
        tinfo = dict(source.tower) if tower_info is None else dict(tower_info)
        if embeddings_dir is None:
            embeddings_dir = str(source.root.resolve())
        src = BuildSource(source, list(source.ids), source.dim, tinfo, embeddings_dir)
    else:
        arr = np.asarray(source)
        if arr.ndim != 2:
            raise ScalingNoteError(f"embeddings: expected a 2-D array (n, dim), got shape {arr.shape}")
        if doc_ids is None:
            raise ScalingNoteError("doc_ids are required when building from an array")
        ids = [str(i) for i in doc_ids]
        if len(ids) != arr.shape[0]:
            raise ScalingNoteError(f"doc_ids: {len(ids)} ids for {arr.shape[0]} vectors")
        src = BuildSource(arr, ids, int(arr.shape[1]), dict(tower_info or {}), None)
    n = len(src.ids)
    if n == 0:
        raise ScalingNoteError("cannot build an index over 0 documents")
    if len(set(src.ids)) != n:
        seen: set[str] = set()
        dup = next(i for i in src.ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise ScalingNoteError(f"doc_ids: duplicate document id {dup!r}")
    return src


def iter_source(src: Embeddings | np.ndarray, chunk: int) -> Iterator[tuple[int, np.ndarray]]:
    if isinstance(src, Embeddings):
        yield from src.iter_chunks(chunk)
    else:
        for s in range(0, src.shape[0], chunk):
            yield s, src[s : s + chunk]


def write_vectors(path: Path, src: BuildSource, dim: int, chunk: int) -> np.ndarray:
    """The Matryoshka prefix of every vector, L2-normalised, into a memory-mapped ``.npy``."""
    ids = src.ids
    vectors = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(len(ids), dim))
    for s, block in iter_source(src.data, chunk):
        block = np.asarray(block[:, :dim], dtype=np.float32)
        if not np.all(np.isfinite(block)):
            bad = s + int(np.argwhere(~np.isfinite(block))[0, 0])
            raise ScalingNoteError(f"embeddings: row {bad} (document {ids[bad]!r}) contains non-finite values")
        vectors[s : s + len(block)] = l2_normalize(block)
    vectors.flush()
    return vectors


def build_inputs(src: BuildSource, settings: dict[str, Any], documents: Any, *, prebuilt: bool) -> dict[str, Any]:
    """What an index is built from (canonical, see :mod:`scalingnote.utils.steps`): the vectors
    (an embeddings directory by its shards' content digests and tower; an array by the SHA-256
    of its bytes and ids), the settings and the document store's corpus. A prebuilt FAISS index
    (``index=``) has no digest: such a build is never reused."""
    if isinstance(src.data, Embeddings):
        m = src.data.manifest
        vectors: Any = {
            "embeddings": [s.get("content_sha256") for s in m.get("shards", [])],
            "normalized": m.get("normalized"),
        }
    else:
        h = hashlib.sha256(np.ascontiguousarray(src.data, dtype=np.float32).tobytes())
        h.update(json.dumps(src.ids, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        vectors = {"array_sha256": h.hexdigest()}
    if documents is None or isinstance(documents, (str, Path)):
        # what the corpus holds, not where: an index moved or copied with its corpus is still the same build
        docs: Any = content_fingerprint(documents) if documents is not None else None
    elif isinstance(documents, (Mapping, list, tuple)):
        docs = {
            "content_sha256": content_digest(list(documents.values() if isinstance(documents, Mapping) else documents))
        }
    else:
        docs = "<iterable>"  # a one-shot iterable cannot be read twice: never reused
    tower = {k: src.tower.get(k) for k in ("fingerprint", "compat_id") if k in src.tower}
    return canonical(
        {
            "vectors": {**vectors, "n": len(src.ids), "dim": src.dim, "tower": tower},
            **settings,
            "documents": docs,
            "prebuilt_index": prebuilt,
        }
    )
