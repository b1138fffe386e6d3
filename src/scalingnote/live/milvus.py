"""The live index on Milvus (a Milvus server, or Milvus Lite): add, replace and delete documents
in a collection exported by ``scalingnote index export --to milvus`` while it serves, with the
write-ahead log and BM25 side of the FAISS live index (:mod:`scalingnote.live.index`) kept in a
local directory.

Where things live
-----------------
* the vectors, document ids and semantic IDs: in the collection (pymilvus);
* the write-ahead log (:class:`~scalingnote.live.wal.WriteAheadLog`), the checkpoint and the
  writer lock: ``<local>/live/milvus-<collection>/`` where ``<local>`` is the index directory
  the collection was exported from (its manifest's ``source.path``), or the directory given as
  ``live_dir`` (``scalingnote serve --backend milvus --index DIR``);
* the BM25 side: the base BM25 index of ``<local>`` (``<local>/bm25``) plus the in-memory delta
  segment of :class:`~scalingnote.live.lexical.LiveBM25` (rebuilt from the checkpoint and the log).

Primary keys. An exported document's key is its FAISS row; every *version* of a live-added
document gets a new key ``LIVE_KEY_BIT + n`` (``n`` counts the versions written; the log
records each batch's first ``n``, so a replay writes the same keys again and Milvus's upsert
by key never duplicates a row).

A batch, all or nothing as seen by search (why this design): Milvus applies an upsert request
per segment and has no multi-row transaction, so a search may see part of a request. Here the
service decides what is visible: ``row_of`` maps each document id to the key of its one visible
version, and every hit whose key is not that version is dropped (candidates are over-fetched by
the rows so hidden). A batch is (1) appended to the log and fsync-ed, (2) written to Milvus
under new keys -- invisible, (3) made visible by swapping ``row_of`` entries under the lock
searches hold (one step: a search sees every document of the batch in its new version or every
one in its old), (4) the old versions are deleted from Milvus. Searches use Milvus's ``Session``
consistency (read-your-writes for this client), so an acknowledged batch is searchable at once.
Writing new keys then flipping, rather than deleting then upserting, also means a replaced
document is never briefly absent.

Restart: the checkpoint (``state.json``: visible keys, live documents, next key) and the log
after it give ``row_of``; Milvus is asked (``Strong`` consistency) which visible live keys it
lacks -- a kill between (1) and (2) -- and those rows are written from the logged vectors; the
stale versions the replayed records name are deleted (a kill between (3) and (4)). Compaction
(:meth:`MilvusLive.compact`) flushes the collection, writes a new checkpoint and drops the log
it covers.

Failed writes. A key is taken only by a record the log holds (a failed append takes neither its
seq nor its keys), so a refused batch never shares a key with an acknowledged one. A logged batch
Milvus refuses waits in :attr:`MilvusLive.pending`; each later write and compaction first applies
the waiting batches in log order and is refused while Milvus refuses them (a checkpoint never
leaves a logged batch out). A failed delete of hidden stale versions is retried later.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from scalingnote.data.corpus import find_corpus
from scalingnote.data.types import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index.docstore import index_corpus, read_document_store
from scalingnote.index.hybrid import FusionConfig
from scalingnote.index.layout import DOCS_FILE, read_manifest
from scalingnote.index.milvus.milvus import (
    DEFAULT_COLLECTION,
    DOC_ID,
    PK,
    MilvusSearcher,
)
from scalingnote.index.searcher import SearchResult
from scalingnote.index.semantic_ids import ResidualKMeans
from scalingnote.live.errors import BackendUnavailable, LoggedNotApplied
from scalingnote.live.generation import live_dir as live_root
from scalingnote.live.index import (
    LiveIndex,
    LiveSearcher,
    attach_titles,
    check_document_tower,
    load_document_tower,
    title_and_snippet,
)
from scalingnote.live.ingest import add_timings, batch_vectors, encode_paced, writer_log
from scalingnote.live.lexical import open_live_bm25
from scalingnote.live.milvus_rows import LIVE_KEY_BIT, MilvusRows, _doc, _keep_visible
from scalingnote.live.wal import WriteAheadLog, pack_array, unpack_array, write_json_durably
from scalingnote.live.writer_lock import acquire_writer_lock

log = logging.getLogger("scalingnote.live")
STATE_FILE = "state.json"
STATE_FORMAT = "scalingnote-milvus-live/1"


def live_state_dir(local: str | Path, collection: str) -> Path:
    """Where the log, checkpoint and writer lock of ``collection`` live, beside the index directory ``local``."""
    return live_root(local) / f"milvus-{collection}"


class MilvusLive(MilvusRows):
    """A Milvus collection opened for search *and* writing (use :meth:`open`): the searcher
    interface of :class:`~scalingnote.index.milvus.milvus.MilvusSearcher` over the visible versions,
    ``upsert`` / ``delete`` / ``compact`` / ``stats`` / ``searcher`` as
    :class:`~scalingnote.live.LiveIndex` (what ``POST /documents`` needs)."""

    supports_upsert = supports_delete = True
    consistency = "Session"  # read-your-writes: an acknowledged batch is searchable at once

    def __init__(self, base: MilvusSearcher, local: Path, *, document_tower=None, writer: bool = True, corpus=None):
        super().__init__(base.client, base.uri, base.collection, base.manifest, base.query_tower)
        self.local, self.writer, self.corpus = Path(local), writer, corpus
        self.state_dir = live_state_dir(self.local, self.collection)
        self._doc_tower_spec, self._doc_tower = document_tower, None
        self.lock = threading.RLock()  # searches and the visibility swap
        self._write_lock = threading.Lock()  # one writer at a time: log order == apply order
        self._lock_fh: IO | None = None
        self.pace: Callable[[float], float] | None = None  # the service's ingest pacing (encode_paced calls it)
        self.after_log = None  # test hook: called between the log write and the Milvus write
        self.after_write = None  # test hook: called between the Milvus write and the visibility swap
        self.timings: dict[str, float] = {}
        self.version, self.hidden, self.replayed = 0, 0, 0
        self.pending: list[
            tuple[int, list[Document], int, np.ndarray, np.ndarray | None]
        ] = []  # logged, not yet in Milvus
        self._undropped: list[int] = []  # hidden stale keys whose delete from Milvus failed (retried)
        self.max_id_bytes = self._max_id_bytes()
        self._load_base()
        sem = self.manifest.get("semantic_ids")
        self.rkm = ResidualKMeans.load(self.local / sem.get("codebooks", "semantic_ids.npz")) if sem else None
        if writer:  # a reader (`scalingnote search`) writes nothing, not even the directory
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self._acquire_writer_lock()
        self.wal: WriteAheadLog | None = WriteAheadLog(self.state_dir / "wal") if writer else None
        self._load_state()
        self._replay(self.wal or WriteAheadLog(self.state_dir / "wal", create=False))

    @property
    def local_dir(self) -> Path:
        """The index directory beside the collection (its BM25 side; :class:`SearcherBase`)."""
        return self.local

    # ------------------------------------------------------------------ open
    @classmethod
    def open(  # type: ignore[override]  # the back-end table's live opener: (location, query_tower, ...) as LiveIndex.open
        cls,
        location: str | Path,
        query_tower=None,
        *,
        document_tower=None,
        writer: bool = True,
        corpus: str | Path | None = None,
        collection: str = DEFAULT_COLLECTION,
        token: str | None = None,
        live_dir: str | Path | None = None,
    ) -> MilvusLive:
        """The back-end table's ``live`` opener of ``milvus`` (``location``: the URI). ``live_dir``:
        the local index directory (default: the one the collection was exported from)."""
        base = MilvusSearcher.open(location, collection or DEFAULT_COLLECTION, query_tower, token=token)
        try:
            local = Path(live_dir) if live_dir else Path(str((base.manifest.get("source") or {}).get("path") or ""))
            if not live_dir and not (base.manifest.get("source") or {}).get("path"):
                raise ScalingNoteError(
                    f"{base.root}: the collection names no source index directory; pass its index directory (--index "
                    "DIR)"
                )
            return cls(base, local, document_tower=document_tower, writer=writer, corpus=corpus)
        except BaseException:
            base.close()
            raise

    def _acquire_writer_lock(self) -> None:
        self._lock_fh = acquire_writer_lock(
            self.state_dir / "writer.lock",
            f"{self.state_dir}: another process (a running service) is writing collection {self.collection!r}; "
            "send the documents to it (POST /documents) or stop it first",
        )

    def _max_id_bytes(self) -> int:
        try:
            fields = self.client.describe_collection(self.collection).get("fields") or []
            return int(next(f for f in fields if f.get("name") == DOC_ID)["params"]["max_length"])
        except (StopIteration, KeyError, TypeError, ValueError):
            return 65535

    def _load_base(self) -> None:
        """The exported documents (ids in key order, titles, snippets) and the BM25 base of the local directory."""
        where = self.local / "manifest.json"
        if not where.exists():
            raise ScalingNoteError(
                f"{where}: not an index directory; the Milvus live index keeps its log and BM25 side in the index "
                f"directory the collection was exported from (--index DIR)"
            )
        local = read_manifest(self.local)
        fp_local, fp = (
            (local.get("tower") or {}).get("fingerprint"),
            (self.manifest.get("tower") or {}).get("fingerprint"),
        )
        if fp_local != fp or int(local.get("n_vectors", -1)) != int(self.manifest.get("n_vectors", -2)):
            raise ScalingNoteError(
                f"{where}: not the index collection {self.collection!r} was exported from (tower fingerprint "
                f"{fp_local!r} "
                f"vs {fp!r}, {local.get('n_vectors')} vs {self.manifest.get('n_vectors')} vectors)"
            )
        self.base_ids: list[str] = json.loads(
            (self.local / (local.get("files") or {}).get("doc_ids", "doc_ids.json")).read_text()
        )
        docs_file = self.local / DOCS_FILE
        self.base_titles: list[str] | None
        self.base_snippets: list[str] | None
        self.base_titles, self.base_snippets = (
            read_document_store(docs_file, self.base_ids) if docs_file.exists() else (None, None)
        )
        self.row_of: dict[str, int] = {d: i for i, d in enumerate(self.base_ids)}
        self.docs: dict[int, Document] = {}  # live key -> the document version written under it
        src = find_corpus(self.corpus).path if self.corpus is not None else index_corpus(local)
        # the FAISS live index's BM25 opener (saved <local>/bm25, else built from the corpus), over the exported ids
        self.lexical = open_live_bm25(self.local, self.base_ids, self.row_of, src)

    # ------------------------------------------------------------------ checkpoint + log
    def _load_state(self) -> None:
        path = self.state_dir / STATE_FILE
        self.wal_seq, self.next_row = 0, 0
        if not path.exists():
            return
        st = json.loads(path.read_text())
        if st.get("format") != STATE_FORMAT:
            raise ScalingNoteError(f"{path}: field 'format' is {st.get('format')!r}, expected {STATE_FORMAT!r}")
        self.wal_seq, self.next_row = int(st["wal_seq"]), int(st["next_row"])
        for d in st["deleted_base"]:
            self.row_of.pop(d, None)
        docs = [(int(pk), _doc(rec)) for pk, rec in st["live"]]
        for pk, doc in docs:
            self.row_of[doc.id] = pk
            self.docs[pk] = doc
        self._lex_add(docs)

    def _replay(self, wal: WriteAheadLog) -> None:
        """Apply the log after the checkpoint to ``row_of``; a writer then gives Milvus what it lacks."""
        t0, stale, rows, n = time.perf_counter(), [], {}, 0
        if wal.dir.is_dir():
            for rec in wal.replay(after_seq=self.wal_seq, truncate=self.writer):
                if rec["op"] == "upsert":
                    docs = [_doc(d) for d in rec["docs"]]
                    vecs, sem = unpack_array(rec["vectors"]), unpack_array(rec.get("sem"))
                    assert vecs is not None  # an upsert record always carries its vectors
                    first = int(rec["first_row"])
                    for j, d in enumerate(docs):
                        rows[LIVE_KEY_BIT + first + j] = (d, vecs[j], None if sem is None else sem[j])
                    stale += self._swap(docs, first)[1]
                else:
                    stale += self._unmap(rec["ids"])
                n += 1
            wal.last_seq = max(wal.last_seq, self.wal_seq)
        self.replayed = n
        if self.writer and n:
            want = [pk for pk in rows if self.docs.get(pk) is not None and self.row_of.get(self.docs[pk].id) == pk]
            have = self._present(want)
            missing = [pk for pk in want if pk not in have]
            for s in range(0, len(missing), 256):
                part = missing[s : s + 256]
                sems = [rows[p][2] for p in part]
                sem_part = None
                if sems[0] is not None:
                    present = [s for s in sems if s is not None]
                    assert len(present) == len(sems)  # the index's batches all carry semantic IDs, or none does
                    sem_part = np.stack(present)
                self._write_rows(part, [rows[p][0] for p in part], np.stack([rows[p][1] for p in part]), sem_part)
            self._drop(stale)
            log.info(
                "milvus live index %s: replayed %d log records (%d rows rewritten, %d stale removed) in %.2fs",
                self.state_dir,
                n,
                len(missing),
                len(stale),
                time.perf_counter() - t0,
            )
        if self.writer:  # a no-op write: this client's session timestamp covers every earlier write
            self._milvus(self.client.delete, self.collection, filter=f"{PK} in [-1]")

    def compact(self, retrain: bool = False, progress: bool = False) -> dict[str, Any]:
        """Flush the collection, write a checkpoint of the visible state, drop the log it covers
        (``retrain`` is not supported: the collection's index is Milvus's to rebuild)."""
        self._check_writer()
        if retrain:
            raise ScalingNoteError(
                "the Milvus live index cannot retrain codebooks: re-export the rebuilt FAISS index (`scalingnote "
                "index export --to milvus`)"
            )
        t0 = time.perf_counter()
        with self._write_lock:
            self._settle()  # a logged batch is in Milvus before any checkpoint (else: refused, the log kept)
            seq = writer_log(self.wal).rotate()
            self._milvus(self.client.flush, self.collection)
            with self.lock:
                live = [
                    [pk, self.docs[pk].to_beir()]
                    for pk in sorted(pk for pk in self.row_of.values() if pk >= LIVE_KEY_BIT)
                ]
                state = {
                    "format": STATE_FORMAT,
                    "wal_seq": seq,
                    "next_row": self.next_row,
                    "created": time.time(),
                    "deleted_base": sorted(
                        set(self.base_ids) - {d for d, pk in self.row_of.items() if pk < LIVE_KEY_BIT}
                    ),
                    "live": live,
                }
            write_json_durably(
                self.state_dir / STATE_FILE, state, "checkpoint"
            )  # on failure: the old one and the whole log stay
            self.wal_seq = seq
            try:
                writer_log(self.wal).drop_through(seq)
            except OSError as e:  # covered by the checkpoint: never replayed; the next compaction drops them
                log.warning(
                    "milvus live index %s: the log segments up to seq %d stay until the next compaction (%s)",
                    self.state_dir,
                    seq,
                    e,
                )
        return {
            "generation": f"checkpoint-{seq}",
            "documents": len(self.row_of),
            "retrained": False,
            "seconds": round(time.perf_counter() - t0, 3),
        }

    def compaction_pending(self) -> int:
        """Log records since the last checkpoint (the service compacts past ``live_compact_docs``)."""
        return self.wal.records if self.wal is not None else 0

    # ------------------------------------------------------------------ ingest
    @property
    def document_tower(self):
        if self._doc_tower is None:
            t = load_document_tower(self.manifest, self._doc_tower_spec)
            check_document_tower(self.manifest, t, self.root)
            self._doc_tower = t
        return self._doc_tower

    def encode(self, docs: Sequence[Document]) -> tuple[np.ndarray, np.ndarray | None]:
        x, sem, _ = encode_paced(self, list(docs))
        return x, sem

    def upsert(self, docs: Sequence[Document], vectors: np.ndarray | None = None) -> dict[str, Any]:
        """Add or replace ``docs``; returns once the batch is in the fsync-ed log and visible
        (acknowledged), with ``seq``, ``upserted``, ``replaced``, ``status`` and ``timings_ms``."""
        self._check_writer()
        docs = list(docs)
        long = [d.id for d in docs if len(d.id.encode("utf-8")) > self.max_id_bytes]
        if long:
            raise ScalingNoteError(
                f"{self.root}: document id {long[0]!r} is longer than the collection's doc_id field "
                f"({self.max_id_bytes} "
                "bytes; re-export the collection with this version of scalingnote for longer ids)"
            )
        t0 = time.perf_counter()
        x, sem, paused = batch_vectors(self, docs, vectors)
        t1 = time.perf_counter()
        with self._write_lock:
            self._settle()
            t2 = time.perf_counter()
            status = ["replaced" if d.id in self.row_of else "added" for d in docs]
            first = self.next_row
            seq = writer_log(self.wal).append(
                {
                    "op": "upsert",
                    "first_row": first,
                    "docs": [d.to_beir() for d in docs],
                    "vectors": pack_array(x),
                    "sem": pack_array(sem),
                }
            )
            self.next_row = first + len(docs)
            if self.after_log is not None:
                self.after_log(seq)
            t3 = time.perf_counter()
            with self.lock:  # after any search in flight: every later one over-fetches the rows about to be written
                self.hidden += len(docs)  # written, not yet visible
            try:
                self._write_rows([LIVE_KEY_BIT + first + j for j in range(len(docs))], docs, x, sem)
            except BackendUnavailable as e:
                self.pending.append((seq, docs, first, x, sem))
                raise LoggedNotApplied(
                    f"{e}; the batch is in the write-ahead log ({self.state_dir}, seq {seq}) and is applied before the "
                    "next write or compaction goes ahead, or when the service restarts"
                ) from None
            if self.after_write is not None:
                self.after_write(seq)
            t4 = time.perf_counter()
            replaced = self._show(docs, first)
        timings = {
            "encode": t1 - t0 - paused,
            "pace": paused,
            "writer_wait": t2 - t1,
            "log": t3 - t2,
            "milvus_write": t4 - t3,
            "apply": time.perf_counter() - t4,
        }
        return {
            "seq": seq,
            "upserted": len(docs),
            "replaced": replaced,
            "status": status,
            "timings_ms": add_timings(self.timings, timings),
        }

    delete = LiveIndex.delete  # the FAISS live index's: log the ids present, then _apply_delete

    def _apply_delete(self, ids: list[str]) -> None:
        with self.lock:  # one step for searches: hidden, and counted as such
            stale = self._unmap(ids)
            self.hidden += len(stale)  # deleted from Milvus after they are hidden
        self._drop_later(stale)

    def _check_writer(self) -> None:
        if not self.writer:
            raise ScalingNoteError(f"{self.state_dir}: opened read-only")

    # ------------------------------------------------------------------ search
    @property
    def doc_ids(self) -> list[str]:
        return list(self.row_of)

    @property
    def semantic_ids(self):
        return None  # by key in Milvus (dense hits carry them); bm25 / hybrid hits have none

    def __len__(self) -> int:
        return len(self.row_of)

    def prepare_search(self, queries, k: int, rerank: int | None) -> tuple[np.ndarray, int]:
        q, _ = super().prepare_search(queries, k, rerank)
        return q, max(
            k, rerank
        ) if rerank else k  # k already counts the over-fetch (search); Milvus caps at what it holds

    def search(self, queries: Any, k: int = 10, **kw: Any) -> SearchResult:
        """Top-``k`` visible documents: Milvus's candidates over-fetched by the hidden rows, each
        kept only if its key is its document's visible version (held under the lock: whole batches)."""
        with self.lock:
            over = self.hidden
            res = super().search(queries, k + over, **kw)
            return self.attach_documents(_keep_visible(res, self.row_of, k))

    def attach_documents(self, res: SearchResult) -> SearchResult:
        def title(pk: int) -> tuple[str, str]:
            d = self.docs.get(pk)
            if d is not None:
                return title_and_snippet(d)
            return (
                (self.base_titles[pk], self.base_snippets[pk])
                if self.base_titles is not None and self.base_snippets is not None and 0 <= pk < len(self.base_titles)
                else ("", "")
            )

        return attach_titles(res, title)

    def searcher(self, fusion: FusionConfig | None = None) -> LiveSearcher:
        return LiveSearcher(self, fusion)

    # ------------------------------------------------------------------ stats / close
    def stats(self) -> dict[str, Any]:
        with self.lock:
            n0 = max(1, len(self.base_ids))
            added = sum(1 for pk in self.row_of.values() if pk >= LIVE_KEY_BIT)
            return {
                "generation": f"milvus:{self.collection}",
                "documents": len(self.row_of),
                "rows": len(self.row_of) + self.hidden,
                "tombstones": 0,
                "n_trained": n0,
                "added_since_training": added,
                "added_share": round(added / n0, 6),
                "log_records": self.compaction_pending(),
                "bm25_delta_documents": self.lexical.n_delta if self.lexical is not None else 0,
                "upsert_seconds": {key: round(sec, 3) for key, sec in self.timings.items()},
            }

    def recall_estimate(self, sample: int = 64, k: int = 10, seed: int = 0) -> float | None:
        return None  # the vectors live in Milvus: no local exact search to compare with

    def close(self) -> None:
        if self.wal is not None:  # the log and the writer lock
            self.wal.close()
        if self._lock_fh is not None:
            self._lock_fh.close()
            self._lock_fh = None
        super().close()  # the Milvus client


__all__ = ["LIVE_KEY_BIT", "MilvusLive", "live_state_dir"]
