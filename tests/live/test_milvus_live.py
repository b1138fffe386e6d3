"""The Milvus live index (scalingnote.live.milvus) on Milvus Lite: upsert / replace / delete with
the write-ahead log beside the index directory, the BM25 side, all-or-nothing visibility of a
batch, and the replay of what Milvus lacks after a crash at each step of a batch. (The real
server and the service's SIGKILL chaos: tests/live/test_milvus_live_server.py, slow.)"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")

from scalingnote.data import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.live.milvus import LIVE_KEY_BIT, MilvusLive, live_state_dir
from tests.helpers.milvus_lite import open_live, row_counts


class Crash(Exception):
    pass


def _top(w, vec, k=60):
    return w.search(np.asarray(vec, dtype=np.float32)[None], k).doc_ids[0]


def test_upsert_replace_delete_bm25_and_a_restart(lite, tiny_bert_dir, other_bert_dir):
    db, idx = lite
    with pytest.raises(ScalingNoteError, match="fingerprint"):
        w = open_live(db, idx, other_bert_dir)
        try:
            _ = w.document_tower
        finally:
            w.close()
    w = open_live(db, idx, tiny_bert_dir)
    with pytest.raises(ScalingNoteError, match="another process"):
        open_live(db, idx, tiny_bert_dir)  # one writer per collection (the lock beside the log)
    n0 = len(w)
    res = w.upsert([Document("m1", "ocelot", "", "ocelot spots zzmarkone")])
    assert res["status"] == ["added"] and res["seq"] == 1
    vec = w.encode([Document("m1", "ocelot", "", "ocelot spots zzmarkone")])[0][0]
    hit = w.search(vec[None], 3)
    assert hit.doc_ids[0][0] == "m1" and hit.titles[0][0] == "ocelot" and hit.semantic_ids[0, 0].min() >= 0
    res = w.upsert(
        [Document("m1", "lynx", "", "lynx ears zzmarktwo"), Document("d0", "replaced", "", "kangaroo zzmarkthree")]
    )
    assert res["status"] == ["replaced", "replaced"]
    assert row_counts(db, ["m1", "d0"]) == {"m1": 1, "d0": 1}  # the old versions are gone from Milvus
    bm = w.searcher()
    assert bm.search(["zzmarktwo"], 5, mode="bm25").doc_ids[0] == ["m1"]
    assert bm.search(["zzmarkone"], 5, mode="bm25").doc_ids[0] == []  # the replaced version's text
    assert bm.search(["zzmarkthree"], 5, mode="hybrid", query_vectors=vec[None]).doc_ids[0][0] == "d0"
    assert w.delete(["d0", "nope"]) == {"seq": 3, "deleted": 1, "missing": ["nope"]}
    assert len(w) == n0 and "d0" not in _top(w, vec)  # + m1, - d0
    w.close()
    w = open_live(db, idx, tiny_bert_dir)  # restart: the log replayed, nothing rewritten twice
    assert w.replayed == 3 and len(w) == n0
    ids = _top(w, vec)
    assert ids.count("m1") == 1 and "d0" not in ids and row_counts(db, ["m1", "d0"]) == {"m1": 1, "d0": 0}
    assert w.searcher().search(["zzmarktwo"], 5, mode="bm25").doc_ids[0] == ["m1"]
    w.close()


@pytest.mark.parametrize("hook", ["after_log", "after_write"])
def test_a_crash_inside_a_batch_hides_it_whole_and_the_restart_applies_it(lite, tiny_bert_dir, hook):
    """A crash after the log write (nothing in Milvus yet) or after the Milvus write (rows there,
    not yet visible): search sees the old versions of the whole batch, never part of the new one;
    the restart makes the whole batch visible, once, and removes the old versions."""
    db, idx = lite
    w = open_live(db, idx, tiny_bert_dir)
    old = [Document("m1", "old one", "", "first"), Document("m2", "old two", "", "second")]
    w.upsert(old)
    x, _ = w.encode(old)
    new = [
        Document("m1", "new one", "", "first again zzmarknew"),
        Document("m2", "new two", "", "second again"),
        Document("m3", "three", "", "third"),
    ]

    def crash(seq):
        ids = _top(w, x[0]) + _top(w, x[1])
        assert {"m1", "m2"} <= set(ids) and "m3" not in ids  # mid-batch: the old versions, none of the new
        assert w.search(x[:1], 5).titles[0][ids.index("m1")] == "old one"
        raise Crash

    setattr(w, hook, crash)
    with pytest.raises(Crash):
        w.upsert(new, vectors=np.concatenate([x, x[:1]]))
    setattr(w, hook, None)
    assert w.searcher().search(["zzmarknew"], 5, mode="bm25").doc_ids[0] == []
    w.close()  # the process dies here: the batch is in the log, acknowledged or not
    w = open_live(db, idx, tiny_bert_dir)
    assert w.replayed == 2
    ids = _top(w, x[0])
    assert all(ids.count(i) == 1 for i in ("m1", "m2", "m3")) and len(ids) == len(set(ids))
    assert w.row_of["m1"] >= LIVE_KEY_BIT and row_counts(db, ["m1", "m2", "m3"]) == {"m1": 1, "m2": 1, "m3": 1}
    assert w.searcher().search(["zzmarknew"], 5, mode="bm25").doc_ids[0] == ["m1"]
    w.close()


def test_compaction_checkpoints_and_drops_the_log(lite, tiny_bert_dir):
    db, idx = lite
    w = open_live(db, idx, tiny_bert_dir)
    w.upsert([Document("m1", "ocelot", "", "ocelot zzmarkone"), Document("d1", "replaced", "", "zzmarkbase")])
    w.delete(["d2"])
    assert w.compaction_pending() == 2
    info = w.compact()
    assert info["documents"] == len(w) and w.compaction_pending() == 0
    state = json.loads((live_state_dir(idx, "docs") / "state.json").read_text())
    assert state["deleted_base"] == ["d1", "d2"] and [d["_id"] for _, d in state["live"]] == ["m1", "d1"]
    w.upsert([Document("m2", "tapir", "", "tapir zzmarktwo")])
    n = len(w)
    w.close()
    w = open_live(db, idx, tiny_bert_dir, writer=False)  # a reader: checkpoint + the log after it, no writes
    assert w.replayed == 1 and len(w) == n and "d2" not in w.row_of
    s = w.searcher()
    assert [s.search([m], 5, mode="bm25").doc_ids[0] for m in ("zzmarkone", "zzmarkbase", "zzmarktwo")] == [
        ["m1"],
        ["d1"],
        ["m2"],
    ]
    with pytest.raises(ScalingNoteError, match="read-only"):
        w.upsert([Document("m9", "x", "", "y")])
    w.close()


def test_the_local_directory_must_be_the_exported_index(lite, tiny_bert_dir, tmp_path):
    db, _idx = lite
    (tmp_path / "empty").mkdir()
    with pytest.raises(ScalingNoteError, match="not an index directory"):
        MilvusLive.open(db, None, collection="docs", live_dir=tmp_path / "empty")


def test_the_service_ingests_into_a_milvus_collection(lite, tiny_bert_dir):
    """`serve --backend milvus --index DIR` (here on Milvus Lite): the back-end table's live opener
    with the collection, token and the local directory; POST /documents, bm25 / dense find the new
    document with its title, DELETE removes it, /metrics shows the live gauges."""
    from fastapi.testclient import TestClient

    from scalingnote.serve import ServeSettings, create_app

    db, idx = lite
    token = "milvus-live-admin-token-0123"
    settings = ServeSettings(
        port=0, backend="milvus", uri=db, collection="docs", live_dir=str(idx), admin_token=token, max_wait_ms=2
    )
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(
        create_app(db, tiny_bert_dir, settings), client=("127.0.0.1", 50000)
    ) as c:  # a loopback peer (the admin rule)
        t0 = time.monotonic()
        while c.get("/healthz").status_code != 200 and time.monotonic() - t0 < 120:
            assert c.get("/healthz").json().get("status") != "failed", c.get("/healthz").json()
            time.sleep(0.05)
        assert sorted(c.get("/healthz").json()["modes"]) == ["bm25", "dense", "hybrid"]
        doc = {"_id": "api1", "title": "narwhal tusk", "text": "the narwhal swims zzmarkapi"}
        r = c.post("/documents", json={"documents": [doc]}, headers=auth)
        assert r.status_code == 200 and r.json()["documents"][0]["status"] == "added", r.text
        hits = c.post("/search", json={"query": "zzmarkapi", "k": 5, "mode": "bm25"}).json()["results"]
        assert [(h["doc_id"], h["title"]) for h in hits] == [("api1", "narwhal tusk")]
        dense = [
            h["doc_id"]
            for h in c.post("/search", json={"query": doc["text"], "k": 60, "mode": "dense"}).json()["results"]
        ]
        assert dense.count("api1") == 1 and len(dense) == len(set(dense)) == 49
        assert c.delete("/documents/api1", headers=auth).status_code == 200
        assert c.post("/search", json={"query": "zzmarkapi", "k": 5, "mode": "bm25"}).json()["results"] == []
        text = c.get(
            "/metrics"
        ).text  # the live gauges: the collection's visible documents, the log since the checkpoint
        assert "scalingnote_live_documents 48\n" in text and "scalingnote_live_log_records 2\n" in text
    assert (live_state_dir(idx, "docs") / "wal").is_dir()


def test_search_on_the_cli_replays_the_milvus_live_index(lite, tiny_bert_dir):
    """``scalingnote search --backend milvus`` sees what the live index wrote, as ``serve`` does:
    a batch added after the export is found by its words (BM25 and hybrid) with its title, a
    deleted exported document is gone from BM25, and the read-only replay cuts nothing."""
    from typer.testing import CliRunner

    from scalingnote.cli import app as cli

    db, idx = lite
    w = open_live(db, idx, tiny_bert_dir)
    d0_title = w.base_titles[w.base_ids.index("d0")]
    w.upsert([Document("m1", "ocelot", "", "ocelot spots zzmarkone")])
    w.delete(["d0"])
    w.close()  # logged, no checkpoint: only the write-ahead log knows
    wal_before = sorted((p.name, p.stat().st_size) for p in (live_state_dir(idx, "docs") / "wal").iterdir())

    def hits(query, mode):
        r = CliRunner().invoke(
            cli,
            [
                "search",
                "--backend",
                "milvus",
                "--uri",
                db,
                "--collection",
                "docs",
                "--index",
                str(idx),
                "--query-tower",
                str(tiny_bert_dir),
                "--query",
                query,
                "--k",
                "60",
                "--mode",
                mode,
            ],
        )
        assert r.exit_code == 0, r.output
        return [json.loads(x) for x in r.output.splitlines() if x.startswith("{")]

    top = hits("zzmarkone", "bm25")
    assert [h["doc_id"] for h in top] == ["m1"] and top[0]["title"] == "ocelot"
    assert "m1" in [h["doc_id"] for h in hits("ocelot spots zzmarkone", "hybrid")]
    assert "d0" not in [h["doc_id"] for h in hits(d0_title, "bm25")]
    assert "d0" not in [h["doc_id"] for h in hits(d0_title, "dense")]
    assert sorted((p.name, p.stat().st_size) for p in (live_state_dir(idx, "docs") / "wal").iterdir()) == wal_before


def test_search_on_a_milvus_collection_takes_the_served_default_of_its_directory(lite, tiny_bert_dir):
    """Without ``--index`` and without a live index, ``search --backend milvus`` finds the index
    directory the collection was exported from and serves its ``fusion.json`` default (hybrid,
    weighted), as ``serve --backend milvus`` does; a flag still overrides it."""
    from typer.testing import CliRunner

    from scalingnote.cli import app as cli
    from scalingnote.index.hybrid import served_fusion
    from scalingnote.index.pipeline import load_tower_for

    db, idx = lite
    (idx / "fusion.json").write_text(
        json.dumps({"method": "weighted", "weight": 0.7, "norm": "zscore", "default_mode": "hybrid"})
    )

    def run(*extra):
        r = CliRunner().invoke(
            cli,
            [
                "search",
                "--backend",
                "milvus",
                "--uri",
                db,
                "--collection",
                "docs",
                "--query-tower",
                str(tiny_bert_dir),
                "--query",
                "topic words",
                "--k",
                "5",
                *extra,
            ],
        )
        assert r.exit_code == 0, r.output
        return [
            (h["doc_id"], h["score"]) for h in map(json.loads, (x for x in r.output.splitlines() if x.startswith("{")))
        ]

    got = run()
    fusion, mode = served_fusion(idx)
    assert mode == "hybrid" and fusion.method == "weighted"
    r = MilvusLive.open(db, load_tower_for(str(tiny_bert_dir), "query"), collection="docs", live_dir=idx, writer=False)
    try:  # what `serve --backend milvus` answers a request without a mode
        want = r.searcher(fusion).search(["topic words"], 5, mode="hybrid")
    finally:
        r.close()
    assert [d for d, _ in got] == want.doc_ids[0]
    assert run("--mode", "dense") != got  # a flag overrides the file
    assert not live_state_dir(idx, "docs").exists()  # a reader writes nothing into the directory
