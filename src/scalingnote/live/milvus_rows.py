"""The rows of the Milvus live index (:class:`~scalingnote.live.milvus.MilvusLive`): which version
of each document is visible (under the lock: whole batches for searches), and the writes that put
rows into Milvus and delete the versions they hide."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.data.types import Document
from scalingnote.index.milvus.milvus import DOC_ID, PK, SEM_ID, VECTOR, MilvusSearcher, _milvus_message
from scalingnote.index.searcher import SearchResult
from scalingnote.live.errors import BackendUnavailable
from scalingnote.live.lexical import LiveBM25

log = logging.getLogger("scalingnote.live")
LIVE_KEY_BIT = 1 << 62
QUERY_CHUNK = 4096  # keys per Milvus filter (`row in [...]`)


def _doc(rec: dict[str, Any]) -> Document:
    return Document(rec["_id"], rec.get("title", ""), rec.get("topic", ""), rec.get("text", ""))


class MilvusRows(MilvusSearcher):
    """The visible state and the Milvus writes of :class:`~scalingnote.live.milvus.MilvusLive`
    (which sets these attributes when it opens)."""

    state_dir: Path
    lock: threading.RLock
    lexical: LiveBM25 | None
    #: document id -> the key of its visible version; live key -> the document version written under it
    row_of: dict[str, int]
    docs: dict[int, Document]
    next_row: int
    version: int
    #: rows in Milvus that searches must skip (stale or not yet visible versions)
    hidden: int
    #: logged batches not yet in Milvus (seq, documents, first row, vectors, semantic IDs)
    pending: list[tuple[int, list[Document], int, np.ndarray, np.ndarray | None]]
    #: hidden stale keys whose delete from Milvus failed (retried)
    _undropped: list[int]

    def _lex_add(self, docs: list[tuple[int, Document]]) -> None:
        """BM25 delta: consecutive keys in one call (LiveBM25.add numbers rows from the first)."""
        if self.lexical is None:
            return
        pairs, run = sorted(docs, key=lambda p: p[0]), []
        for i, (pk, d) in enumerate(pairs):
            run.append(d)
            if i + 1 == len(pairs) or pairs[i + 1][0] != pk + 1:
                self.lexical.add(run, pk - len(run) + 1)
                run = []
        self.lexical.refresh()

    def _present(self, keys: list[int]) -> set[int]:
        out: set[int] = set()
        for s in range(0, len(keys), QUERY_CHUNK):
            part = keys[s : s + QUERY_CHUNK]
            rows = self._milvus(
                self.client.query,
                self.collection,
                filter=f"{PK} in {part}",
                output_fields=[PK],
                consistency_level="Strong",
            )
            out.update(int(r[PK]) for r in rows)
        return out

    def _swap(self, docs: list[Document], first: int) -> tuple[int, list[int]]:
        """Make the versions of ``docs`` written under keys ``first..`` the visible ones; returns
        (documents replaced, keys of the versions they hide)."""
        with self.lock:
            stale = [self.row_of[d.id] for d in docs if d.id in self.row_of]
            pairs = [(LIVE_KEY_BIT + first + j, d) for j, d in enumerate(docs)]
            for pk, d in pairs:
                self.row_of[d.id] = pk
                self.docs[pk] = d
            for pk in stale:
                self.docs.pop(pk, None)
            self._lex_add(pairs)
            self.next_row = max(self.next_row, first + len(docs))
            self.version += 1
        return len(stale), stale

    def _unmap(self, ids: Sequence[str]) -> list[int]:
        with self.lock:
            gone = [self.row_of.pop(i) for i in ids if i in self.row_of]
            for pk in gone:
                self.docs.pop(pk, None)
            if self.lexical is not None:
                self.lexical.refresh()
            self.version += 1
        return gone

    def _milvus(self, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except Exception as e:  # noqa: BLE001 - MilvusException / gRPC errors
            raise BackendUnavailable(
                f"{self.root}: Milvus {getattr(fn, '__name__', 'call')} failed: {_milvus_message(e)}"
            ) from None

    def _settle(self) -> None:
        """Before a write or a compaction: apply the logged batches Milvus refused before, in log
        order (a :class:`BackendUnavailable` while it still refuses: nothing new is logged), and
        retry deleting stale versions."""
        while self.pending:
            seq, docs, first, x, sem = self.pending[0]
            try:
                self._write_rows([LIVE_KEY_BIT + first + j for j in range(len(docs))], docs, x, sem)
            except BackendUnavailable as e:
                raise BackendUnavailable(
                    f"{e}; {len(self.pending)} logged batch(es) from seq {seq} wait to be written to Milvus first "
                    "(or at restart): nothing of this request was logged"
                ) from None
            self.pending.pop(0)
            self._show(docs, first)
            log.info("milvus live index %s: the logged batch seq %d is written and visible", self.state_dir, seq)
        if self._undropped:
            keys, self._undropped = self._undropped, []
            self._drop_later(keys)

    def _show(self, docs: list[Document], first: int) -> int:
        """Make a written batch visible (one step for searches) and delete the versions it hides;
        returns the replaced count."""
        with self.lock:  # one step for searches: the new versions visible, the old ones hidden (fewer or as many)
            replaced, stale = self._swap(docs, first)
            self.hidden += len(stale) - len(docs)
        self._drop_later(stale)
        return replaced

    def _drop_later(self, stale: list[int]) -> None:
        """Delete hidden stale versions from Milvus; a failure keeps them hidden and retries at the next write."""
        try:
            self._drop(stale)
        except BackendUnavailable as e:
            log.warning(
                "milvus live index %s: %d stale rows stay hidden until the next write (%s)",
                self.state_dir,
                len(stale),
                e,
            )
            self._undropped += stale
            return
        self.hidden -= len(stale)

    def _write_rows(self, keys: list[int], docs: list[Document], x: np.ndarray, sem: np.ndarray | None) -> None:
        rows = []
        for i, (pk, d) in enumerate(zip(keys, docs, strict=True)):
            row = {PK: int(pk), DOC_ID: d.id, VECTOR: x[i].tolist()}
            if sem is not None and SEM_ID in (self.manifest.get("fields") or {}).values():
                row[SEM_ID] = np.asarray(sem[i]).astype(int).tolist()
            rows.append(row)
        if rows:
            self._milvus(self.client.upsert, self.collection, rows)

    def _drop(self, keys: list[int]) -> None:
        for s in range(0, len(keys), QUERY_CHUNK):
            self._milvus(
                self.client.delete, self.collection, filter=f"{PK} in {[int(k) for k in keys[s : s + QUERY_CHUNK]]}"
            )


def _keep_visible(res: SearchResult, row_of: dict[str, int], k: int) -> SearchResult:
    """Per query, the first ``k`` hits whose key is the visible version of their document (once each)."""
    nq = res.indices.shape[0]
    scores = np.full((nq, k), -np.inf, dtype=np.float32)
    idx = np.full((nq, k), -1, dtype=np.int64)
    res_sem = res.semantic_ids
    sem = None if res_sem is None else np.full((nq, k, res_sem.shape[2]), -1, dtype=np.int32)
    doc_ids = []
    for q in range(nq):
        seen: set[str] = set()
        keep: list[int] = []
        for j, d in enumerate(res.doc_ids[q]):
            if len(keep) < k and d not in seen and row_of.get(d) == int(res.indices[q, j]):
                seen.add(d)
                keep.append(j)
        n = len(keep)
        scores[q, :n], idx[q, :n] = res.scores[q, keep], res.indices[q, keep]
        if sem is not None and res_sem is not None:
            sem[q, :n] = res_sem[q, keep]
        doc_ids.append([res.doc_ids[q][j] for j in keep])
    return SearchResult(scores, doc_ids, sem, idx)
