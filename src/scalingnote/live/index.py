"""A live index (ScalingNote §3.5): documents are added, replaced and deleted while it is
searched, every acknowledged change survives a crash, and compaction / rebuild write new
generations that are swapped in atomically.

Ingest of a batch (all or nothing):

1. the batch is checked (:mod:`scalingnote.live.records`) — a bad record changes nothing;
2. the documents are encoded by the index's own document tower, whose fingerprint must be the
   one the index was built with (as :func:`scalingnote.index.check_query_tower` refuses a
   query tower of another space); the Matryoshka prefix the index holds is cut and
   re-normalised, and the stored residual-K-means codebooks give the semantic IDs (§3.5:
   "every time the system encodes a new document ... cluster it into specific clustering
   centers");
3. one write-ahead-log record (documents + vectors + semantic IDs) is appended and fsync-ed;
4. under the index lock the dense index, the document store and the BM25 delta are updated
   together (a search sees the batch entirely or not at all); the call returns = acknowledged.

Restart replays the log records after the generation's ``wal_seq`` from the stored vectors
(no re-encoding), so a kill between steps 3 and 4 loses nothing.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from scalingnote.data.corpus import find_corpus, iter_corpus
from scalingnote.data.types import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index.docstore import index_corpus
from scalingnote.index.faiss.dense import DenseIndex
from scalingnote.index.hybrid import FusionConfig
from scalingnote.index.tune import recall_vs_exact
from scalingnote.live.errors import StorageError, describe_os_error
from scalingnote.live.generation import (
    LIVE_DIR,
    LIVE_META,
    current_generation,
    live_dir,
    read_live_meta,
    swap_current,
    write_generation,
)
from scalingnote.live.ingest import ENCODE_CHUNK, add_timings, batch_vectors, encode_paced, writer_log
from scalingnote.live.lexical import open_live_bm25
from scalingnote.live.searcher import LiveSearcher, attach_titles, title_and_snippet
from scalingnote.live.store import RowStore
from scalingnote.live.towers import check_document_tower, load_document_tower
from scalingnote.live.wal import WriteAheadLog, pack_array, unpack_array
from scalingnote.live.writer_lock import acquire_writer_lock
from scalingnote.utils.io import write_json

log = logging.getLogger("scalingnote.live")


class LiveIndex:
    """Open with :meth:`open`. ``search`` / ``attach_documents`` / ``manifest`` / ``doc_ids`` make it
    a drop-in for :class:`~scalingnote.index.DenseIndex` in the service; writers call
    :meth:`upsert` / :meth:`delete` / :meth:`compact` / :meth:`rebuild`."""

    def __init__(
        self, root: Path, query_tower=None, document_tower=None, writer: bool = True, corpus: str | Path | None = None
    ):
        self.root = Path(root)
        self.corpus = corpus  # generation 0's corpus when the index records none (serve --corpus)
        self.query_tower = query_tower
        self._doc_tower_spec = document_tower
        self._doc_tower = None
        self.lock = threading.RLock()  # searches and the apply step
        self._write_lock = threading.Lock()  # one writer at a time: log order == apply order
        self._lock_fh: IO | None = None
        self.writer = writer
        self.after_log: Callable[[int], None] | None = None  # test hook: called between log write and apply
        self.timings: dict[
            str, float
        ] = {}  # seconds spent per upsert stage since open (encode, pace, log, lock_wait, apply)
        #: called after each encoded chunk of documents with its seconds; returns the seconds it paused
        #: (the service slows ingest while searches run: serve.documents)
        self.pace: Callable[[float], float] | None = None
        self.wal: WriteAheadLog | None = None
        wal_dir = live_dir(self.root) / "wal"
        if writer:
            self._acquire_writer_lock()  # before reading: no other writer may swap generations meanwhile
        self._load_generation()
        if writer:
            self.wal = WriteAheadLog(wal_dir)
            self._replay(self.wal, truncate=True)
        elif wal_dir.is_dir():  # a reader replays too (acknowledged documents), but never cuts the log
            self._replay(WriteAheadLog(wal_dir, create=False), truncate=False)

    # ------------------------------------------------------------------ open / replay
    @classmethod
    def open(
        cls,
        root: str | Path,
        query_tower=None,
        *,
        document_tower=None,
        writer: bool = True,
        corpus: str | Path | None = None,
    ) -> LiveIndex:
        """Open the generation in use and replay the log after it. ``writer=True`` takes the
        index's writer lock (one writing process at a time: a service or a CLI command)."""
        return cls(Path(root), query_tower, document_tower, writer, corpus)

    def _acquire_writer_lock(self) -> None:
        self._lock_fh = acquire_writer_lock(
            live_dir(self.root) / "writer.lock",
            f"{self.root}: another process (a running service or `scalingnote index add`) is writing this index; "
            "send the documents to it (POST /documents) or stop it first",
        )

    def _load_generation(self) -> None:
        gen = current_generation(self.root)
        dense = DenseIndex.open(gen, self.query_tower, mmap=False)
        meta = read_live_meta(gen)
        store = RowStore(dense)
        lexical = open_live_bm25(gen, dense.doc_ids, store.row_of, self._corpus_of(gen, dense))
        rkm = dense.semantic_id_model()
        with self.lock:
            self.gen, self.meta, self.store, self.lexical, self.rkm = gen, meta, store, lexical, rkm
            self.gen_rows = store.n_rows
            self.new_docs: dict[int, Document] = {}
            self.added = int(meta.get("added_since_training", 0))
            self.version = 0

    def _corpus_of(self, gen: Path, dense: DenseIndex) -> Path | None:
        """The full texts of a generation's documents: its corpus (generation 0: ``corpus`` if given)."""
        if gen == self.root and self.corpus is not None:
            return find_corpus(self.corpus).path
        return index_corpus(dense.manifest)

    def _replay(self, wal: WriteAheadLog, truncate: bool) -> None:
        t0, n = time.perf_counter(), 0
        for rec in wal.replay(after_seq=int(self.meta.get("wal_seq", 0)), truncate=truncate):
            if rec["op"] == "upsert":
                docs = [
                    Document(d["_id"], d.get("title", ""), d.get("topic", ""), d.get("text", "")) for d in rec["docs"]
                ]
                vectors = unpack_array(rec["vectors"])
                assert vectors is not None  # an upsert record always carries its vectors
                self._apply_upsert(docs, vectors, unpack_array(rec.get("sem")))
            else:
                self._apply_delete(rec["ids"])
            n += 1
        wal.last_seq = max(wal.last_seq, int(self.meta.get("wal_seq", 0)))
        if n:
            log.info("live index %s: replayed %d log records in %.2fs", self.root, n, time.perf_counter() - t0)
        self.replayed = n

    # ------------------------------------------------------------------ DenseIndex interface
    # capability flags (scalingnote.index.searcher.SearcherBase): the FAISS index of the current
    # generation says nprobe / ef_search; documents are added, replaced and deleted while it serves
    supports_rerank = supports_upsert = supports_delete = True

    @property
    def has_ivf(self) -> bool:
        return self.store.dense.has_ivf

    @property
    def has_hnsw(self) -> bool:
        return self.store.dense.has_hnsw

    @property
    def local_dir(self) -> Path:
        return self.root

    @property
    def manifest(self) -> dict[str, Any]:
        return self.store.dense.manifest

    @property
    def factory(self) -> str:
        return str(self.manifest["factory"])

    @property
    def index(self):
        return self.store.dense.index

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def doc_ids(self) -> list[str]:
        """Ids of the live documents."""
        return list(self.store.row_of)

    @property
    def row_of(self) -> dict[str, int]:
        return self.store.row_of

    @property
    def semantic_ids(self):
        return self.store.dense.semantic_ids

    def __len__(self) -> int:
        return self.store.n_alive

    def search(self, queries: Any, k: int = 10, **kw: Any):
        with self.lock:
            return self.store.search(queries, k, **kw)

    def attach_documents(self, res):
        """Titles and snippets of the hits: a document added since the generation from the log's
        copy, the generation's own from its document store."""
        dense = self.store.dense
        if dense.titles is None or dense.snippets is None:
            return res
        return attach_titles(
            res,
            lambda r: (
                title_and_snippet(self.new_docs[r]) if r in self.new_docs else (dense.titles[r], dense.snippets[r])
            ),
        )

    def searcher(self, fusion: FusionConfig | None = None) -> LiveSearcher:
        return LiveSearcher(self, fusion)

    # ------------------------------------------------------------------ ingest
    @property
    def document_tower(self):
        if self._doc_tower is None:
            t = load_document_tower(self.manifest, self._doc_tower_spec)
            check_document_tower(self.manifest, t, self.root / "manifest.json")
            self._doc_tower = t
        return self._doc_tower

    def encode(self, docs: Sequence[Document]) -> tuple[np.ndarray, np.ndarray | None]:
        """Vectors (the indexed Matryoshka prefix, unit norm) and semantic IDs of ``docs``."""
        x, sem, _ = encode_paced(self, list(docs))
        return x, sem

    def upsert(self, docs: Sequence[Document], vectors: np.ndarray | None = None) -> dict[str, Any]:
        """Add or replace ``docs`` (checked already, see :mod:`scalingnote.live.records`); returns
        once the batch is in the fsync-ed log and applied (acknowledged): ``seq``, ``upserted``,
        ``replaced`` and ``status`` (per document, in order: ``added`` or ``replaced``). By id,
        so sending the same batch again leaves the same documents (all ``replaced``)."""
        self._check_writer()
        docs = list(docs)
        t0 = time.perf_counter()
        vectors, sem, paused = batch_vectors(self, docs, vectors)
        t1 = time.perf_counter()
        with self._write_lock:
            t2 = time.perf_counter()
            status = ["replaced" if d.id in self.store.row_of else "added" for d in docs]
            rec = {
                "op": "upsert",
                "docs": [d.to_beir() for d in docs],
                "vectors": pack_array(vectors),
                "sem": pack_array(sem),
            }
            seq = writer_log(self.wal).append(rec)
            if self.after_log is not None:
                self.after_log(seq)
            t3 = time.perf_counter()
            replaced, lock_wait, applied = self._apply_upsert(docs, vectors, sem)
        timings = {
            "encode": t1 - t0 - paused,
            "pace": paused,
            "writer_wait": t2 - t1,
            "log": t3 - t2,
            "lock_wait": lock_wait,
            "apply": applied,
        }
        return {
            "seq": seq,
            "upserted": len(docs),
            "replaced": replaced,
            "status": status,
            "timings_ms": add_timings(self.timings, timings),
        }

    def delete(self, ids: Sequence[str]) -> dict[str, Any]:
        self._check_writer()
        ids = [str(i) for i in ids]
        with self._write_lock:
            self._settle()
            present = [i for i in ids if i in self.row_of]
            if not present:
                return {"seq": None, "deleted": 0, "missing": ids}
            seq = writer_log(self.wal).append({"op": "delete", "ids": present})
            if self.after_log is not None:
                self.after_log(seq)
            self._apply_delete(present)
        return {"seq": seq, "deleted": len(present), "missing": [i for i in ids if i not in set(present)]}

    def _check_writer(self) -> None:
        if not self.writer:
            raise ScalingNoteError(f"{self.root}: opened read-only")

    def _settle(self) -> None:
        """Before a write: nothing to finish (Milvus's live index writes the batches Milvus refused)."""

    def _apply_upsert(
        self, docs: list[Document], vectors: np.ndarray, sem: np.ndarray | None
    ) -> tuple[int, float, float]:
        """Apply under the index lock; returns (documents replaced, seconds waiting for the lock,
        seconds holding it: what a concurrent search waits at most)."""
        t0 = time.perf_counter()
        with self.lock:
            t1 = time.perf_counter()
            first, replaced = self.store.upsert(docs, vectors, sem)
            for j, d in enumerate(docs):
                self.new_docs[first + j] = d
            if self.lexical is not None:
                self.lexical.add(docs, first)
                self.lexical.refresh()
            self.added += len(docs) - replaced
            self.version += 1
            t2 = time.perf_counter()
        return replaced, t1 - t0, t2 - t1

    def _apply_delete(self, ids: list[str]) -> None:
        with self.lock:
            self.store.delete(ids)
            if self.lexical is not None:
                self.lexical.refresh()
            self.version += 1

    # ------------------------------------------------------------------ generations
    def _live_documents(self, rows: np.ndarray) -> list[Document]:
        """Full documents of ``rows``: added ones from memory, the generation's from its corpus
        (a document whose text is unknown keeps its title and snippet)."""
        need = {int(r) for r in rows if r < self.gen_rows}
        by_row: dict[int, Document] = {}
        src = self._corpus_of(self.gen, self.store.dense)
        if need and src is not None:
            for d in iter_corpus(src, on_invalid="skip"):
                r = self.store.row_of.get(d.id)
                if r in need:
                    by_row[r] = d
        s = self.store
        return [
            self.new_docs.get(int(r)) or by_row.get(int(r)) or Document(s.doc_ids[r], s.titles[r], "", s.snippets[r])
            for r in rows
        ]

    def compact(self, retrain: bool = False, progress: bool = False) -> dict[str, Any]:
        """Write a new generation of the live documents (``retrain``: train quantiser, PQ and
        semantic-ID codebooks again = ``scalingnote index rebuild``), swap it in, drop the log it
        covers. Ingest waits; searches go on (on the old state, then the new one)."""
        self._check_writer()
        t0 = time.perf_counter()
        try:
            gen = self._compact(retrain, progress)
        except OSError as e:  # a full disk / an I/O error: the generation in use and the whole log are kept
            raise StorageError(
                f"{self.root}: compaction failed: {describe_os_error(e)}; the log is kept (nothing acknowledged is "
                "lost)",
                e.errno,
            ) from None
        return {
            "generation": gen.name,
            "documents": len(self),
            "retrained": retrain,
            "seconds": round(time.perf_counter() - t0, 3),
        }

    def _compact(self, retrain: bool, progress: bool) -> Path:
        with self._write_lock:
            with self.lock:
                rows = self.store.alive_rows()
                vectors = self.store.vectors.view[rows].copy()
                sem = self.store.sem.view[rows].copy() if self.store.sem is not None else None
                ids = [self.store.doc_ids[r] for r in rows]
                manifest = dict(self.manifest)
                seq = writer_log(self.wal).rotate()
            docs = self._live_documents(rows)
            n_trained = len(rows) if retrain else int(self.meta.get("n_trained", len(rows)))
            meta = {
                "wal_seq": seq,
                "n_trained": n_trained,
                "added_since_training": 0 if retrain else self.added,
                "trained_generation": None if retrain else self.meta.get("trained_generation", 0),
                "bm25_language": self.lexical.language if self.lexical is not None else None,
                "created": time.time(),
            }
            gen = write_generation(
                self.root,
                vectors=vectors,
                doc_ids=ids,
                documents=docs,
                semantic_ids=sem,
                manifest=manifest,
                src_gen=self.gen,
                meta=meta,
                retrain=retrain,
                progress=progress,
            )  # removed again if it fails
            try:
                if retrain:
                    write_json(
                        gen / LIVE_META, {**read_live_meta(gen), "trained_generation": int(gen.name.split("-")[1])}
                    )
                swap_current(self.root, gen)
            except BaseException:
                self._unswapped(gen)
                raise
            self._load_generation()  # the new state, swapped in under the lock
            self._drop_log(seq)
        return gen

    def _unswapped(self, gen: Path) -> None:
        """After a failed swap: remove ``gen`` unless the pointer names it (renamed, maybe not
        durably: used, its log kept)."""
        try:
            named = current_generation(self.root) == gen
        except ScalingNoteError:
            named = False
        if not named:
            shutil.rmtree(gen, ignore_errors=True)  # frees the space it took (a full disk)
            return
        log.warning(
            "live index %s: %s is in use but its pointer may not be durable; the log it covers is kept",
            self.root,
            gen.name,
        )
        self._load_generation()

    def _drop_log(self, seq: int) -> None:
        """Delete the log segments a swapped-in generation covers; a failure only leaves them for
        the next compaction (their records are <= the generation's ``wal_seq``: never replayed)."""
        try:
            writer_log(self.wal).drop_through(seq)
        except OSError as e:
            log.warning(
                "live index %s: the log segments up to seq %d stay until the next compaction (%s)", self.root, seq, e
            )

    def rebuild(self, progress: bool = False) -> dict[str, Any]:
        return self.compact(retrain=True, progress=progress)

    def close(self) -> None:
        if self.wal is not None:
            self.wal.close()
        if self._lock_fh is not None:
            self._lock_fh.close()
            self._lock_fh = None

    # ------------------------------------------------------------------ drift
    def stats(self) -> dict[str, Any]:
        with self.lock:
            n_trained = int(self.meta.get("n_trained") or 1)
            return {
                "generation": self.gen.name if self.gen != self.root else "base",
                "documents": self.store.n_alive,
                "rows": self.store.n_rows,
                "tombstones": self.store.tombstones,
                "n_trained": n_trained,
                "added_since_training": self.added,
                "added_share": round(self.added / n_trained, 6),
                "log_records": self.wal.records if self.wal is not None else 0,
                "bm25_delta_documents": self.lexical.n_delta if self.lexical is not None else 0,
                "upsert_seconds": {key: round(sec, 3) for key, sec in self.timings.items()},
            }

    def recall_estimate(self, sample: int = 64, k: int = 10, seed: int = 0) -> float | None:
        """Recall@k of the ANN index against exact search over the live vectors, on a seeded
        sample of live document vectors used as queries (drift of the trained quantisers)."""
        with self.lock:
            rows = self.store.alive_rows()
            if len(rows) <= k:
                return None
            rng = np.random.default_rng(seed + self.version)
            q_rows = rng.choice(rows, size=min(sample, len(rows)), replace=False)
            q = self.store.vectors.view[q_rows].copy()
            live_vecs = self.store.vectors.view[rows]
            exact = rows[np.argsort(-(q @ live_vecs.T), axis=1)[:, :k]]
            ann = self.store.search(q, k).indices
        return recall_vs_exact(np.asarray(ann), exact)


__all__ = [
    "ENCODE_CHUNK",
    "LIVE_DIR",
    "LiveIndex",
    "LiveSearcher",
    "attach_titles",
    "check_document_tower",
    "load_document_tower",
    "title_and_snippet",
]
