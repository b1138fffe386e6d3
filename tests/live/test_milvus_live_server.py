"""MilvusLive (upsert / replace / delete) on a real Milvus server — the embedded Milvus 2.3.5
standalone build, started by the test on 127.0.0.1 and stopped after it — over an IVF_PQ
collection exported from the live-index fixture's FAISS IVF-PQ index; acknowledged writes
survive a stop and a restart of the server. Skips (with the reason) where the server cannot run."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'pymilvus==3.0.2')")

from scalingnote.data import Document  # noqa: E402
from scalingnote.index.milvus import DOC_ID, MilvusSearcher, connect  # noqa: E402
from scalingnote.index.milvus_export import export_to_milvus  # noqa: E402
from tests.helpers.milvus import start_embedded_milvus  # noqa: E402
from scalingnote.live.milvus import MilvusLive  # noqa: E402
from scalingnote.models import load_tower  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_embedded_milvus(tmp_path_factory, "milvus-live-server")
    yield srv
    srv.stop()


def _poll(fn, want, timeout_s=30.0):
    """``fn()`` until ``want`` holds of it or ``timeout_s`` passes (a server collection's default
    consistency is bounded staleness: a write is acknowledged before every reader sees it)."""
    t0 = time.monotonic()
    while True:
        got = fn()
        if want(got) or time.monotonic() - t0 > timeout_s:
            return got
        time.sleep(0.5)


def _stored(uri, ids):
    """How many rows each of ``ids`` has in the collection (a filter query, not a search)."""
    c = connect(uri)
    try:
        # a restarted server reloads its collections in the background: a query before that is
        # refused ("collection not loaded"); load_collection waits for it (a no-op once loaded)
        c.load_collection("docs")
        rows = c.query("docs", filter=f"{DOC_ID} in {json.dumps(ids)}", output_fields=[DOC_ID])
    finally:
        c.close()
    return {i: sum(r[DOC_ID] == i for r in rows) for i in ids}


def _top(uri, qt, vec, k=48):
    with MilvusSearcher.open(uri, "docs", query_tower=qt) as ms:  # (k capped at the exported n_vectors, 48)
        return ms.search(vec, k).doc_ids[0]


@pytest.mark.slow  # server start, IVF_PQ build, a stop and a restart (~1-2 min on 2 loaded cores)
def test_upsert_replace_delete_on_the_server_and_acked_writes_survive_a_restart(server, live_index, tiny_bert_dir):
    man = export_to_milvus(live_index, server.uri, "docs", progress=False)  # auto -> IVF_PQ on a server
    assert man["index_type"] == "IVF_PQ"
    w = MilvusLive(server.uri, "docs", document_tower=str(tiny_bert_dir))
    qt = load_tower(tiny_bert_dir, role="query")
    new = Document("m1", "ocelot", "", "ocelot spots")
    assert w.upsert([new]) == {"upserted": 1}
    vec = w.document_tower.encode_documents([new], show_progress=False)
    assert "m1" in _poll(lambda: _top(server.uri, qt, vec), lambda ids: "m1" in ids)  # searchable on the server
    # replace a live and an exported document (one row each), add one more, delete the exported one
    w.upsert([Document("m1", "lynx", "", "lynx ears"), Document("d0", "replaced", "", "kangaroo")])
    want = {"m1": 1, "d0": 1, "m2": 0}
    assert _poll(lambda: _stored(server.uri, list(want)), lambda got: got == want) == want
    w.upsert([Document("m2", "tapir", "", "tapir snout")])
    w.delete(["d0"])
    want = {"m1": 1, "d0": 0, "m2": 1}
    assert _poll(lambda: _stored(server.uri, list(want)), lambda got: got == want) == want
    w.close()
    # acknowledged writes are Milvus's to keep: stop the server, start it on the same data
    server.stop()
    server.start()
    assert _poll(lambda: _stored(server.uri, list(want)), lambda got: got == want) == want
    assert "m1" in _top(server.uri, qt, vec)
