"""The live index on a tiny IVF-PQ index (real FAISS, bm25s and tower code; tiny random BERT)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scalingnote.data import Document
from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.live import LiveIndex, WriteAheadLog, read_documents

REPO = Path(__file__).resolve().parents[2]


def _open(idx, tiny_bert_dir, **kw):
    from scalingnote.models import load_tower

    return LiveIndex.open(idx, load_tower(tiny_bert_dir, role="query"), document_tower=str(tiny_bert_dir), **kw)


def _bm25(live, text, k=10):
    return live.searcher().search([text], k, mode="bm25").doc_ids[0]


def _dense_self(live, doc_id, k=5):
    """Dense search with the stored vector of ``doc_id`` (exact re-rank: its own top hit)."""
    v = live.store.vectors.view[live.row_of[doc_id]][None]
    return live.search(v, k, rerank=len(live)).doc_ids[0]


def test_upsert_replaces_the_old_text(live_index, tiny_bert_dir):
    live = _open(live_index, tiny_bert_dir)
    live.upsert([Document("new1", "zebra stripes", "", "the zebra grazes")])
    assert _bm25(live, "zebra") == ["new1"] and _dense_self(live, "new1")[0] == "new1"
    r = live.upsert([Document("new1", "okapi", "", "the okapi hides")])
    assert r["replaced"] == 1
    assert "new1" not in _bm25(live, "zebra")  # the old text is no longer found
    assert _bm25(live, "okapi") == ["new1"]
    hits = live.searcher().search(["okapi"], 10, mode="hybrid")
    assert hits.doc_ids[0].count("new1") == 1 and hits.titles[0][hits.doc_ids[0].index("new1")] == "okapi"
    assert len(live) == 49  # 48 + 1, not 50
    # replacing a document of the original corpus hides its old text too
    old_title = live.store.titles[live.row_of["d0"]]
    live.upsert([Document("d0", "kangaroo", "", "kangaroo pouch")])
    assert _bm25(live, "kangaroo") == ["d0"] and live.store.titles[live.row_of["d0"]] == "kangaroo" != old_title
    live.close()


def test_delete_removes_from_dense_bm25_and_store(live_index, tiny_bert_dir):
    live = _open(live_index, tiny_bert_dir)
    live.upsert([Document("gone", "wombat burrow", "", "a wombat digs")])
    assert _dense_self(live, "gone")[0] == "gone"
    vec = live.store.vectors.view[live.row_of["gone"]][None].copy()
    assert live.delete(["gone", "never-there"])["deleted"] == 1
    assert "gone" not in live.search(vec, len(live), rerank=len(live)).doc_ids[0]
    assert "gone" not in _bm25(live, "wombat") and "gone" not in live.row_of and "gone" not in live.doc_ids
    # a base document too, also after compaction and reopen
    live.delete(["d5"])
    assert "d5" not in live.searcher().search(["fox quick brown jumps dog"], 48, mode="hybrid").doc_ids[0]
    live.compact()
    live.close()
    again = _open(live_index, tiny_bert_dir)
    assert "d5" not in again.doc_ids and "gone" not in again.doc_ids and len(again) == 47
    stored = [json.loads(x)["id"] for x in (again.gen / "docs.jsonl").read_text().splitlines()]
    assert "d5" not in stored and len(stored) == 47
    again.close()


def test_mismatched_document_tower_is_refused(live_index, tiny_bert_dir, other_bert_dir):
    from scalingnote.models import load_tower

    live = LiveIndex.open(live_index, load_tower(tiny_bert_dir, role="query"), document_tower=str(other_bert_dir))
    with pytest.raises(ScalingNoteError, match="fingerprint"):
        live.upsert([Document("x", "t", "", "text")])
    assert live.wal.records == 0 and "x" not in live.row_of  # nothing logged, nothing applied
    live.close()


def test_a_batch_with_one_bad_line_changes_nothing(live_index, tiny_bert_dir, tmp_path):
    good = {"_id": "ok1", "title": "fine", "text": "a fine document"}
    cases = {
        "malformed": "{not json",
        "missing": json.dumps({"_id": "m", "title": "no text"}),
        "wrong_id_type": json.dumps({"_id": 7, "text": "an int id"}),
        "oversized": json.dumps({"_id": "big", "text": "x" * 100_001}),
    }
    for name, bad in cases.items():
        p = tmp_path / f"{name}.jsonl"
        p.write_text(json.dumps(good) + "\n" + bad + "\n" + json.dumps({**good, "_id": "ok2"}) + "\n")
        with pytest.raises(DataError) as e:
            read_documents(p)
        assert str(p) in str(e.value) and e.value.line == 2, str(e.value)
    assert "field '_id'" in str(pytest.raises(DataError, read_documents, tmp_path / "wrong_id_type.jsonl").value)
    assert "field 'text'" in str(pytest.raises(DataError, read_documents, tmp_path / "oversized.jsonl").value)
    # through the CLI: exit 2 with the file / line / field, and the index is untouched
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    before = sorted(p.name for p in live_index.rglob("*"))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalingnote",
            "index",
            "add",
            "--index",
            str(live_index),
            "--docs",
            str(tmp_path / "missing.jsonl"),
            "--tower",
            str(tiny_bert_dir),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 2 and "line 2" in r.stderr and "field 'text'" in r.stderr, r.stderr
    assert sorted(p.name for p in live_index.rglob("*")) == before
    live = _open(live_index, tiny_bert_dir)
    assert "ok1" not in live.row_of and len(live) == 48
    live.close()


_KILLER = """
import os, signal, sys
from scalingnote.data import Document
from scalingnote.live import LiveIndex
live = LiveIndex.open(sys.argv[1], document_tower=sys.argv[2])
live.upsert([Document("before", "armadillo", "", "armadillo shell")])
live.after_log = lambda seq: os.kill(os.getpid(), signal.SIGKILL)  # dies between the log write and the apply
live.upsert([Document("logged", "pangolin", "", "pangolin scales")])
"""


def test_kill_between_log_write_and_apply_is_recovered(live_index, tiny_bert_dir):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    r = subprocess.run(
        [sys.executable, "-c", _KILLER, str(live_index), str(tiny_bert_dir)], env=env, capture_output=True, text=True
    )
    assert r.returncode == -signal.SIGKILL, r.stderr
    live = _open(live_index, tiny_bert_dir)
    assert live.replayed == 2
    for doc_id, word in (("before", "armadillo"), ("logged", "pangolin")):
        assert _bm25(live, word) == [doc_id]
        assert _dense_self(live, doc_id)[0] == doc_id
        assert live.store.titles[live.row_of[doc_id]] == word
    assert len(live) == 50
    live.close()


def test_torn_log_tail_is_cut_and_mid_log_corruption_refused(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal")
    for i in range(3):
        wal.append({"op": "delete", "ids": [f"x{i}"]})
    wal.close()
    seg = wal.segments()[0]
    with open(seg, "ab") as fh:
        fh.write(b'0badc0de {"seq": 4, "op": "del')  # a write torn by a crash: never acknowledged
    recs = list(WriteAheadLog(tmp_path / "wal").replay())
    assert [r["seq"] for r in recs] == [1, 2, 3] and seg.read_bytes().endswith(b"\n")
    lines = seg.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b"x1", b"y1")  # checksum no longer matches
    seg.write_bytes(b"\n".join(lines))
    with pytest.raises(ScalingNoteError, match="line 2"):
        list(WriteAheadLog(tmp_path / "wal").replay())


def test_one_writer_at_a_time_and_readers_replay(live_index, tiny_bert_dir):
    live = _open(live_index, tiny_bert_dir)
    live.upsert([Document("w1", "ibis", "", "ibis wading")])
    with pytest.raises(ScalingNoteError, match="another process"):
        _open(live_index, tiny_bert_dir)
    reader = _open(live_index, tiny_bert_dir, writer=False)
    assert "w1" in reader.row_of
    with pytest.raises(ScalingNoteError, match="read-only"):
        reader.upsert([Document("w2", "t", "", "x")])
    live.close()


def test_rebuild_retrains_and_drift_counts(live_index, tiny_bert_dir):
    live = _open(live_index, tiny_bert_dir)
    rng = np.random.default_rng(0)
    docs = [
        Document(f"n{i}", f"new {i}", "", " ".join(rng.choice(["vitamin", "fox", "dense", "scaling"], 5)))
        for i in range(24)
    ]
    live.upsert(docs)
    st = live.stats()
    assert st["added_since_training"] == 24 and st["added_share"] == pytest.approx(0.5)
    r = live.recall_estimate()
    # with every live document as a query, the estimate is recall@10 of the ANN search against
    # exact search, recomputed here through the public search (a tie may swap a hit)
    ids = sorted(live.row_of, key=live.row_of.get)
    v = live.store.vectors.view[[live.row_of[i] for i in ids]]
    exact = [[ids[j] for j in np.argsort(-s, kind="stable")[:10]] for s in v @ v.T]
    want = np.mean([len(set(a) & set(e)) for a, e in zip(live.search(v, 10).doc_ids, exact, strict=True)]) / 10
    assert r is not None and live.recall_estimate(sample=len(ids)) == pytest.approx(want, abs=0.005)
    info = live.rebuild()
    assert info["retrained"] and live.stats()["added_share"] == 0 and live.stats()["n_trained"] == 72
    assert live.meta["trained_generation"] == int(info["generation"].split("-")[1])
    assert _bm25(live, "new") and len(live) == 72 and live.wal.records == 0
    live.close()


def test_crash_during_compaction_keeps_the_old_generation(live_index, tiny_bert_dir, monkeypatch):
    import scalingnote.live.index as live_mod

    live = _open(live_index, tiny_bert_dir)
    live.upsert([Document("c1", "heron", "", "heron fishing")])
    live.delete(["d1"])

    def crash(root, gen):
        raise KeyboardInterrupt("killed before the swap")

    monkeypatch.setattr(live_mod, "swap_current", crash)
    with pytest.raises(KeyboardInterrupt):
        live.compact()
    assert _bm25(live, "heron") == ["c1"]  # searches go on over the old state
    live.close()
    monkeypatch.undo()
    again = _open(live_index, tiny_bert_dir)
    assert again.gen == live_index and "c1" in again.row_of and "d1" not in again.row_of and len(again) == 48
    info = again.compact()  # the half-written generation is replaced, not reused
    assert again.gen.name == info["generation"] and _bm25(again, "heron") == ["c1"]
    again.close()


def test_hnsw_deletes_by_tombstone_filtered_at_search(tmp_path, _built_index, tiny_bert_dir):
    """HNSW cannot remove: replaced / deleted rows stay in the graph as tombstones, never returned."""
    from scalingnote.index import build_index

    _beir, ivf = _built_index
    base = LiveIndex.open(ivf, writer=False)
    vecs, ids = base.store.vectors.view.copy(), list(base.store.doc_ids)
    idx = build_index(
        vecs,
        tmp_path / "hnsw",
        "HNSW8",
        doc_ids=ids,
        tower_info=base.manifest["tower"],
        semantic_ids_layers=0,
        progress=False,
    )
    live = _open(idx, tiny_bert_dir)
    assert not live.store.can_remove
    live.delete(ids[:10])
    live.upsert([Document(ids[10], "tapir", "", "tapir snout")])
    assert live.store.tombstones == 11 and live.index.ntotal == 49
    res = live.search(vecs, 10)
    got = {d for row in res.doc_ids for d in row}
    assert not got & set(ids[:10]) and all(len(row) == 10 for row in res.doc_ids)
    assert sum(row.count(ids[10]) for row in res.doc_ids) <= len(res.doc_ids)  # never twice in one row
    assert all(len(set(row)) == len(row) for row in res.doc_ids)
    live.compact()  # the new generation holds live rows only
    assert live.store.tombstones == 0 and live.index.ntotal == 38 == len(live)
    live.close()


def test_searches_never_fail_during_ingest_and_compaction(live_index, tiny_bert_dir):
    import threading

    live = _open(live_index, tiny_bert_dir)
    searcher = live.searcher()
    errors, counts, stop = [], [], threading.Event()

    def search_loop():
        while not stop.is_set():
            try:
                res = searcher.search(["fox quick dense vitamin"], 10, mode="hybrid")
                counts.append(len(res.doc_ids[0]))
            except Exception as e:  # noqa: BLE001 - the test collects them
                errors.append(repr(e))

    th = threading.Thread(target=search_loop)
    th.start()
    try:
        for i in range(3):
            live.upsert([Document(f"s{i}-{j}", f"fox {i}", "", "fox quick vitamin") for j in range(4)])
            live.delete([f"d{i}"])
            live.compact(retrain=i == 2)
    finally:
        stop.set()
        th.join()
    assert not errors and counts and min(counts) == 10
    assert len(live) == 48 + 12 - 3
    live.close()


def test_tuned_search_settings_survive_a_compaction(live_index, tiny_bert_dir):
    from scalingnote.index import DenseIndex, read_manifest
    from scalingnote.index.tune import save_search_defaults, tune_search

    idx = DenseIndex.open(live_index)
    save_search_defaults(live_index, tune_search(idx, np.asarray(idx.vectors[:20]), k=5, target=0.99, reranks=(50,)))
    want = read_manifest(live_index)["search_defaults"]
    assert want["rerank"] == 50
    live = _open(live_index, tiny_bert_dir)
    for retrain in (False, True):  # a compaction into the trained structure, and a retraining rebuild
        live.upsert([Document(f"t{retrain}", "tapir", "", "a tapir swims")])
        live.compact(retrain=retrain)
        man = live.store.dense.manifest
        assert man["search_defaults"] == want and man["search_tuning"]["chosen"]["rerank"] == 50
    live.close()
