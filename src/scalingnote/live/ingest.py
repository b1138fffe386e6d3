"""Encoding the documents of a live-index batch, shared by the FAISS and the Milvus live index:
the chunked, paced document-tower call and the per-stage timing bookkeeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from scalingnote.data.types import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index.embeddings import _encode_call, l2_normalize
from scalingnote.live.wal import WriteAheadLog

ENCODE_CHUNK = 16  # documents encoded per call: the service's ingest pacing acts between chunks


class Encoding(Protocol):
    """What encoding reads of a live index: its document tower, the indexed dimension, the
    semantic-ID codebooks and the service's pacing hook."""

    @property
    def document_tower(self) -> Any: ...

    @property
    def dim(self) -> int: ...

    @property
    def rkm(self) -> Any: ...

    @property
    def pace(self) -> Callable[[float], float] | None: ...


def encode_paced(live: Encoding, docs: list[Document]) -> tuple[np.ndarray, np.ndarray | None, float]:
    """Vectors (the indexed Matryoshka prefix, unit norm) and semantic IDs of ``docs``, encoded in
    chunks of ``ENCODE_CHUNK`` documents with ``live.pace`` called after each; also returns the
    seconds paused."""
    parts, paused = [], 0.0
    for s in range(0, len(docs), ENCODE_CHUNK):
        t0 = time.perf_counter()
        parts.append(
            np.asarray(_encode_call(live.document_tower, docs[s : s + ENCODE_CHUNK], ENCODE_CHUNK), dtype=np.float32)
        )
        if live.pace is not None and s + ENCODE_CHUNK < len(docs):
            paused += live.pace(time.perf_counter() - t0)
    x = np.concatenate(parts) if parts else np.zeros((0, live.dim), dtype=np.float32)
    x = l2_normalize(np.ascontiguousarray(x[:, : live.dim]))
    if not np.all(np.isfinite(x)):
        raise ScalingNoteError("document tower produced non-finite vectors")
    return x, (live.rkm.assign(x) if live.rkm is not None else None), paused


def batch_vectors(
    live: Encoding, docs: list[Document], vectors: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None, float]:
    """(vectors, semantic IDs, seconds paused) of ``docs``: encoded (paced), or ``vectors`` given,
    cut and normalised."""
    if vectors is None:
        return encode_paced(live, docs)
    x = l2_normalize(np.asarray(vectors, dtype=np.float32)[:, : live.dim])
    return x, (live.rkm.assign(x) if live.rkm is not None else None), 0.0


def writer_log(wal: WriteAheadLog | None) -> WriteAheadLog:
    """The write-ahead log of a live index opened for writing (a reader has none: its writes are
    refused before they reach the log)."""
    assert wal is not None, "opened read-only: no write-ahead log"
    return wal


def add_timings(total: dict[str, float], timings: dict[str, float]) -> dict[str, float]:
    """Add one batch's seconds per stage to ``total``; returns them in milliseconds."""
    for key, sec in timings.items():
        total[key] = total.get(key, 0.0) + sec
    return {key: round(1000 * sec, 3) for key, sec in timings.items()}
