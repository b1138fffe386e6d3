"""The fault-injection harness of ``benchmarks/faults.py`` and ``tests/live/test_fault_history.py``:
a small synthetic live index (FAISS, or its Milvus Lite export), a seeded history of add / replace
/ delete batches with one write point failing once, and a history checker run after a restart.

Write points (each fails in-process, through the log's ``io`` seam or a patched function):

* ``log_write``          the record's write fails (ENOSPC) before any byte reaches the file
* ``log_flush_partial``  half of the record reaches the file, then ENOSPC (what a failed flush leaves)
* ``log_fsync``          the record is in the file, its fsync fails (EIO)
* ``log_fsync_and_cut``  the fsync fails and cutting the record off fails too (the log closes until a
  later write cuts it)
* ``log_rotate``         compaction cannot open the new log segment (ENOSPC)
* ``compaction_write``   compaction runs out of space writing the new generation / Milvus refuses its flush
* ``manifest_write``     the generation's manifest (FAISS) / the checkpoint ``state.json`` (Milvus) cannot be written
* ``generation_swap``    the generation pointer cannot be written (before the rename; FAISS)
* ``generation_swap_fsync`` the pointer is renamed, the directory fsync fails (FAISS)
* ``milvus_upsert``      Milvus refuses two upserts: the first batch is logged (409), the second refused (503)
* ``milvus_delete``      Milvus refuses a delete (of a deleted document's row / a replaced version)

History checker: every acknowledged add / replace / delete holds (the latest acknowledged version
of each document, found by its own vector and by its words), nothing refused is present, no
document is found twice, and the index reopens.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from scalingnote.data.types import Document
from scalingnote.live.errors import BackendUnavailable, LoggedNotApplied, StorageError

DIM, N_BASE = 16, 48
POINTS = (
    "log_write",
    "log_flush_partial",
    "log_fsync",
    "log_fsync_and_cut",
    "log_rotate",
    "compaction_write",
    "manifest_write",
    "generation_swap",
    "generation_swap_fsync",
    "milvus_upsert",
    "milvus_delete",
)
FAISS_ONLY, MILVUS_ONLY = {"generation_swap", "generation_swap_fsync"}, {"milvus_upsert", "milvus_delete"}


def points_of(backend: str) -> list[str]:
    skip = MILVUS_ONLY if backend == "faiss" else FAISS_ONLY
    return [p for p in POINTS if p not in skip]


class FaultyOS:
    """The log's OS calls (``WriteAheadLog.io``): ``os``, except that an armed call fails."""

    def __init__(self) -> None:
        self.armed: dict[str, list] = {}  # name -> [times left, errno, partial]
        self.fired = 0

    def arm(self, name: str, err: int = errno.ENOSPC, times: int = 1, partial: bool = False) -> None:
        self.armed[name] = [times, err, partial]

    def _hit(self, name: str, *args):
        a = self.armed.get(name)
        if not a or a[0] <= 0:
            return False
        a[0] -= 1
        self.fired += 1
        if a[2] and name == "pwrite":  # a full disk takes part of the bytes
            os.pwrite(args[0], args[1][: len(args[1]) // 2], args[2])
        raise OSError(a[1], os.strerror(a[1]))

    def pwrite(self, fd, data, offset):
        self._hit("pwrite", fd, data, offset)
        return os.pwrite(fd, data, offset)

    def fsync(self, fd):
        self._hit("fsync", fd)
        return os.fsync(fd)

    def ftruncate(self, fd, size):
        self._hit("ftruncate", fd, size)
        return os.ftruncate(fd, size)

    def open(self, path, flags, mode=0o777):
        self._hit("open", path)
        return os.open(path, flags, mode)


def _text(doc_id: str, version: int) -> str:
    return f"zz{doc_id}v{version} note {doc_id}"


def build_synthetic_index(root: Path, seed: int = 0) -> Path:
    """A 48-document IVF-PQ index with semantic IDs and a corpus (BM25 side) over seeded random vectors."""
    from scalingnote.index import build_index

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    ids = [f"b{i}" for i in range(N_BASE)]
    corpus = root / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"_id": i, "title": f"{i} v0", "text": _text(i, 0)}) + "\n" for i in ids), encoding="utf-8"
    )
    x = rng.standard_normal((N_BASE, DIM)).astype(np.float32)
    x /= np.linalg.norm(
        x, axis=1, keepdims=True
    )  # a tower's unit vectors (new versions are normalised by the live index)
    return build_index(
        x,
        root / "idx",
        "IVF4,PQ8x4",
        doc_ids=ids,
        documents=corpus,
        semantic_ids_layers=2,
        codebook_size=4,
        seed=seed,
        progress=False,
        tower_info={"name": "synthetic", "fingerprint": "synthetic-random-vectors"},
    )


def export_lite(idx: Path, db: Path) -> None:
    from scalingnote.index.milvus.milvus_export import export_to_milvus

    export_to_milvus(idx, str(db), "docs", index_type="FLAT", progress=False)


def open_live(backend: str, idx: Path, db: Path | None, io: Any = None):
    if backend == "faiss":
        from scalingnote.live import LiveIndex

        live = LiveIndex.open(idx)
    else:
        from scalingnote.live.milvus import MilvusLive

        live = MilvusLive.open(str(db), None, collection="docs", live_dir=idx)
    if io is not None and live.wal is not None:
        live.wal.io = io
    return live


@dataclass
class History:
    """Every operation with its outcome: ``ok`` (acknowledged), ``logged`` (409: in the log, to be
    applied), ``refused`` (nothing kept); the vectors of each version written."""

    seed: int = 0
    ops: list[dict[str, Any]] = field(default_factory=list)
    vectors: dict[str, np.ndarray] = field(default_factory=dict)  # title (one per version) -> vector
    version: int = 0
    batch: tuple[int, int] = (1, 5)  # documents per added batch: [low, high)
    pad: int = 0  # filler words per document (a real document's size)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng([self.seed, 70])  # a stream apart from the base index's vectors

    def next_op(self, present: list[str]) -> dict[str, Any]:
        """A seeded batch: add 1-4 new documents, replace 1-3 present ones, or delete one."""
        kind = self.rng.choice(["add", "add", "replace", "delete"]) if present else "add"
        if kind == "delete":
            return {"op": "delete", "ids": [str(self.rng.choice(present))]}
        ids = (
            [f"n{len(self.ops)}x{j}" for j in range(int(self.rng.integers(*self.batch)))]
            if kind == "add"
            else sorted({str(i) for i in self.rng.choice(present, size=int(self.rng.integers(1, 4)))})
        )
        docs = []
        for i in ids:
            self.version += 1
            title = f"{i} v{self.version}"
            self.vectors[title] = self.rng.standard_normal(DIM).astype(np.float32)
            docs.append({"_id": i, "title": title, "text": _text(i, self.version) + " filler" * self.pad})
        return {"op": "upsert", "docs": docs}

    def run(self, live, op: dict[str, Any]) -> str:
        """Apply ``op`` to ``live``; record and return its outcome."""
        try:
            if op["op"] == "delete":
                live.delete(op["ids"])
            else:
                docs = [Document(d["_id"], d["title"], "", d["text"]) for d in op["docs"]]
                live.upsert(docs, vectors=np.stack([self.vectors[d["title"]] for d in op["docs"]]))
            out = "ok"
        except LoggedNotApplied:
            out = "logged"
        except (StorageError, BackendUnavailable, OSError):
            out = "refused"
        self.ops.append({**op, "outcome": out})
        return out

    def expected(self) -> dict[str, str | None]:
        """Document id -> the title of its latest acknowledged version (None: deleted)."""
        want: dict[str, str | None] = {f"b{i}": f"b{i} v0" for i in range(N_BASE)}
        for op in self.ops:
            if op["outcome"] == "refused":
                continue
            if op["op"] == "delete":
                for i in op["ids"]:
                    want[i] = None
            else:
                for d in op["docs"]:
                    want[d["_id"]] = d["title"]
        return want

    def present(self) -> list[str]:
        return [i for i, t in self.expected().items() if t is not None]


def _title_of(live, doc_id: str) -> str | None:
    """The title of ``doc_id``'s visible version (None: absent)."""
    if doc_id not in live.row_of:
        return None
    row = live.row_of[doc_id]
    if hasattr(live, "store"):  # FAISS
        return live.store.titles[row]
    d = live.docs.get(row)
    return d.title if d is not None else live.base_titles[row]


def _found_by_vector(live, vec: np.ndarray, k: int) -> list[str]:
    q = vec[None].astype(np.float32)
    if hasattr(live, "store"):  # FAISS: exact re-rank over the live rows
        return live.search(q, k, rerank=len(live)).doc_ids[0]
    return live.search(q, k).doc_ids[0]  # Milvus FLAT: exact


def check(live, hist: History) -> dict[str, int]:
    """Lost / resurrected / duplicated counts of ``live`` against ``hist`` (all must be 0)."""
    want = hist.expected()
    refused_titles = {
        d["title"] for op in hist.ops if op["outcome"] == "refused" and op["op"] == "upsert" for d in op["docs"]
    }
    refused_deletes = {i for op in hist.ops if op["outcome"] == "refused" and op["op"] == "delete" for i in op["ids"]}
    lost = resurrected = duplicated = 0
    touched = {d["_id"] for op in hist.ops if op["op"] == "upsert" for d in op["docs"]} | refused_deletes
    touched |= {i for op in hist.ops if op["op"] == "delete" for i in op["ids"]}
    searcher = live.searcher()
    for doc_id in sorted(touched):
        title, got = want.get(doc_id), _title_of(live, doc_id)
        if got != title:
            if got in refused_titles or (got is None and doc_id in refused_deletes and title is not None):
                resurrected += 1
            else:
                lost += 1
            continue
        if title is None:  # deleted: its words find it no more
            lost += doc_id in searcher.search([doc_id], 10, mode="bm25").doc_ids[0]
            continue
        words = searcher.search([f"zz{doc_id}v{title.split(' v')[1]}"], 5, mode="bm25").doc_ids[0]
        hits = (
            _found_by_vector(live, hist.vectors.get(title, np.zeros(DIM, np.float32)), 5)
            if title in hist.vectors
            else [doc_id]
        )
        if words != [doc_id] or not hits or hits[0] != doc_id:
            lost += 1
    lost += sum(
        _title_of(live, i) != t for i, t in want.items() if i not in touched
    )  # the documents no operation touched
    resurrected += len(set(live.row_of) - set(want) - touched)  # ids no operation wrote
    everything = _found_by_vector(live, np.ones(DIM, np.float32), len(live))
    duplicated += len(everything) - len(set(everything))
    return {"lost": lost, "resurrected": resurrected, "duplicated": duplicated}


def _raise(err: int):
    def fail(*_a, **_k):
        raise OSError(err, os.strerror(err))

    return fail


@contextlib.contextmanager
def arm(point: str, live, fio: FaultyOS, fired: list[int]):
    """Inside: ``point`` fails once (``fired[0]`` counts the failures that happened)."""
    import scalingnote.live.generation as gen_mod
    import scalingnote.live.index as index_mod

    def count(fn):
        def wrapped(*a, **k):
            fired[0] += 1
            return fn(*a, **k)

        return wrapped

    if point.startswith("log_"):  # through the log's io seam
        name = {"log_write": "pwrite", "log_flush_partial": "pwrite", "log_rotate": "open"}.get(point, "fsync")
        fio.arm(
            name,
            errno.EIO if name == "fsync" else errno.ENOSPC,
            times=2 if point == "log_fsync_and_cut" else 1,
            partial=point == "log_flush_partial",
        )
        before = fio.fired
        yield
        fired[0] += fio.fired - before
        fio.armed.clear()
        return
    patches = []
    if point == "compaction_write":
        patches = (
            [mock.patch.object(gen_mod, "_fsync_tree", count(_raise(errno.ENOSPC)))]
            if hasattr(live, "store")
            else [mock.patch.object(live.client, "flush", count(_raise(errno.EIO)))]
        )
    elif point == "manifest_write":
        if hasattr(live, "store"):
            patches = [mock.patch.object(gen_mod, "write_json", count(_raise(errno.ENOSPC)))]
        else:
            import scalingnote.live.milvus as milvus_mod

            real = milvus_mod.write_json_durably

            def failing(path, obj, what):
                fired[0] += 1
                with mock.patch("os.replace", _raise(errno.ENOSPC)):
                    real(path, obj, what)

            patches = [mock.patch.object(milvus_mod, "write_json_durably", failing)]
    elif point in ("generation_swap", "generation_swap_fsync"):
        real_swap = gen_mod.swap_current
        target = "write_json" if point == "generation_swap" else "fsync_dir"

        def swap(root, gen):
            with mock.patch.object(
                gen_mod, target, count(_raise(errno.ENOSPC if target == "write_json" else errno.EIO))
            ):
                real_swap(root, gen)

        patches = [mock.patch.object(index_mod, "swap_current", swap)]
    elif point == "milvus_upsert":
        left = [2]
        real_up = live.client.upsert

        def upsert(*a, **k):
            if left[0] > 0:
                left[0] -= 1
                fired[0] += 1
                raise RuntimeError("injected: Milvus refuses the upsert")
            return real_up(*a, **k)

        patches = [mock.patch.object(live.client, "upsert", upsert)]
    elif point == "milvus_delete":
        left = [1]
        real_del = live.client.delete

        def delete(*a, **k):
            if left[0] > 0 and "-1" not in str(k.get("filter", "")):
                left[0] -= 1
                fired[0] += 1
                raise RuntimeError("injected: Milvus refuses the delete")
            return real_del(*a, **k)

        patches = [mock.patch.object(live.client, "delete", delete)]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        yield


COMPACTION_POINTS = {"log_rotate", "compaction_write", "manifest_write", "generation_swap", "generation_swap_fsync"}


def run_point(backend: str, point: str, work: Path, base_idx: Path, seed: int = 0, n_ops: int = 14) -> dict[str, Any]:
    """One history on a fresh copy of ``base_idx`` with ``point`` failing once, a restart, the check."""
    if work.exists():
        shutil.rmtree(work)
    idx = Path(shutil.copytree(base_idx, work / "idx"))
    db = work / "live.db" if backend == "milvus" else None
    if db is not None:
        export_lite(idx, db)
    fio, fired, hist = FaultyOS(), [0], History(seed=seed)
    live = open_live(backend, idx, db, io=fio)
    compact_failed = False
    try:
        for step in range(n_ops):
            if step == n_ops // 2 and point in COMPACTION_POINTS:
                with arm(point, live, fio, fired):
                    try:
                        live.compact()
                    except (StorageError, BackendUnavailable, OSError):
                        compact_failed = True
                continue
            op = hist.next_op(hist.present())
            if step == n_ops // 3 and point not in COMPACTION_POINTS:
                with arm(point, live, fio, fired):
                    hist.run(live, op)
                    if point == "milvus_upsert":  # the second refusal: the next write, while the logged batch waits
                        hist.run(live, hist.next_op(hist.present()))
                continue
            hist.run(live, op)
        live.compact()  # a later compaction succeeds and keeps everything
        hist.run(live, hist.next_op(hist.present()))
    finally:
        live.close()
    row = {
        "backend": backend,
        "write_point": point,
        "faults_injected": fired[0],
        "ops": len(hist.ops),
        "acknowledged": sum(o["outcome"] in ("ok", "logged") for o in hist.ops),
        "logged_409": sum(o["outcome"] == "logged" for o in hist.ops),
        "refused": sum(o["outcome"] == "refused" for o in hist.ops),
        "compaction_failed": compact_failed,
    }
    return restart_and_check(backend, idx, db, hist, row)


def restart_and_check(
    backend: str, idx: Path, db: Path | None, hist: History, row: dict[str, Any], error_chars: int = 200
) -> dict[str, Any]:
    """``row`` completed by a restart of the live index and the history check (:func:`check`);
    a restart that fails is the result being measured (``restart_ok`` False, counts -1)."""
    try:
        again = open_live(backend, idx, db)
    except Exception as e:  # noqa: BLE001 - a restart that fails is the result being measured
        failed = {"restart_ok": False, "restart_error": str(e)[:error_chars], "lost": -1, "resurrected": -1}
        return {**row, **failed, "duplicated": -1}
    try:
        return {**row, "restart_ok": True, **check(again, hist)}
    finally:
        again.close()
