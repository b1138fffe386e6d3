"""Issue 47 on ``POST /documents``: every malformed body or document gets a 4xx naming the
document (position and ``_id``), field and reason, nothing of the batch is applied and no
server error is logged; ids are stored exactly as sent (padded ids refused, ``DELETE`` agrees);
the response says per document whether it was added or replaced; re-sending a batch after a
503 or a dropped connection leaves the same state. A real uvicorn server over a live tiny index."""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import pytest

from scalingnote.serve import BackgroundServer, ServeSettings, create_app

TOKEN = "live-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "content-type": "application/json"}


@pytest.fixture
def server(live_index, tiny_bert_dir):
    app = create_app(live_index, tiny_bert_dir, ServeSettings(port=0, admin_token=TOKEN, max_wait_ms=2))
    with BackgroundServer(app) as srv:
        srv.wait_ready()
        yield srv


def _post(url: str, body: bytes, headers=JSON, timeout=60) -> httpx.Response:
    return httpx.post(url + "/documents", content=body, headers=headers, trust_env=False, timeout=timeout)


def _state(srv) -> tuple[int, int]:
    idx = srv.app.state.service.index
    return len(idx), idx.wal.records


def _ids(url: str, q: str, k: int = 48) -> list[str]:
    r = httpx.post(url + "/search", json={"query": q, "k": k, "mode": "bm25"}, trust_env=False, timeout=60)
    assert r.status_code == 200, r.text
    return [h["doc_id"] for h in r.json()["results"]]


# the probes of the issue (raw bodies: JSON escapes, raw bytes, deep nesting) -> (status, error)
PROBES = {
    "surrogate_text": (b'{"documents":[{"_id":"s1","text":"bad \\ud800 text"}]}', 422, "invalid_document"),
    "surrogate_title": (
        b'{"documents":[{"_id":"s1","title":"t \\udfff","text":"fine text"}]}',
        422,
        "invalid_document",
    ),
    "surrogate_id": (b'{"documents":[{"_id":"s\\ud800","text":"fine text"}]}', 422, "invalid_document"),
    "raw_surrogate_bytes": (b'{"documents":[{"_id":"s1","text":"bad \xed\xa0\x80 text"}]}', 400, "malformed_json"),
    "invalid_utf8": (b'{"documents":[{"_id":"s1","text":"caf\xc3 \xff"}]}', 400, "malformed_json"),
    "deep_json": (b"[" * 100_000 + b"]" * 100_000, 400, "malformed_json"),
    "deep_unclosed": (b'{"documents":' + b"[" * 100_000, 400, "malformed_json"),
    "not_json": (b'{"documents": [', 400, "malformed_json"),
    "padded_id": (b'{"documents":[{"_id":" padded id ","text":"fine text"}]}', 422, "invalid_document"),
    "control_id": (b'{"documents":[{"_id":"a\\tb","text":"fine text"}]}', 422, "invalid_document"),
    "surrogate_field_name": (b'{"documents":[{"_id":"s1","text":"ok","\\ud800x":1}]}', 422, "invalid_document"),
    "unknown_top_field": (b'{"documents":[{"_id":"s1","text":"ok"}],"docs":1}', 422, "invalid_request"),
    "empty_batch": (b'{"documents":[]}', 422, "invalid_document"),
    "no_body": (b"", 422, "invalid_request"),
}


def test_every_probe_is_a_4xx_nothing_applied_no_server_error(server, caplog):
    before = _state(server)
    with caplog.at_level(logging.ERROR):
        for name, (body, status, error) in PROBES.items():
            r = _post(server.url, body)
            assert r.status_code == status and r.json()["error"] == error, (name, r.status_code, r.text[:300])
            assert "Traceback" not in r.text and "There was an error" not in r.text
    assert _state(server) == before  # nothing applied, nothing logged to the WAL
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], [
        rec.getMessage()[:200] for rec in caplog.records
    ]
    assert httpx.get(server.url + "/healthz", trust_env=False).status_code == 200


@pytest.mark.parametrize("field", ["text", "title", "_id"])
def test_a_lone_surrogate_names_document_id_and_field(server, field):
    rec = {"_id": "s1", "title": "a title", "text": "some text"}
    rec[field] = rec[field][:2] + "\ud800" + rec[field][2:]
    body = json.dumps(
        {"documents": [{"_id": "ok0", "text": "fine"}, rec]}
    ).encode()  # json.dumps escapes it: valid JSON
    r = _post(server.url, body)
    assert r.status_code == 422, r.text
    (err,) = r.json()["errors"]
    assert err["index"] == 1 and err["field"] == f"documents.1.{field}" and "lone surrogate U+D800" in err["message"], (
        err
    )
    assert err["_id"] == ("s1" if field != "_id" else "s1\\ud800")  # echoed safely
    assert "document 1" in r.json()["detail"]
    assert "ok0" not in server.app.state.service.index.row_of  # its good neighbour is not applied either


def test_a_refused_batch_names_every_document_and_field(server):
    before = _state(server)
    docs = [
        {"_id": "good1", "title": "zebra", "text": "a fine zebra"},
        {"_id": 3, "text": "int id"},
        {"_id": "two-bad", "title": 5, "text": "x\udc80"},
        {"text": "no id"},
        {"_id": "good1", "text": "repeated"},
        {"_id": "big", "text": "x" * 100_001},
        "not an object",
        {"_id": "good2", "text": "fine", "extra": 1},
    ]
    r = _post(server.url, json.dumps({"documents": docs}).encode())
    assert r.status_code == 422, r.text
    got = {(e["index"], e["field"]) for e in r.json()["errors"]}
    assert got == {
        (1, "documents.1._id"),
        (2, "documents.2.title"),
        (2, "documents.2.text"),
        (3, "documents.3._id"),
        (4, "documents.4._id"),
        (5, "documents.5.text"),
        (6, "documents.6"),
        (7, "documents.7.extra"),
    }, got
    assert "7 of 8 documents refused, none applied" in r.json()["detail"]
    assert _state(server) == before and _ids(server.url, "zebra") == []


def test_ids_are_exact_padded_ids_refused_and_delete_agrees(server):
    url = server.url
    r = _post(url, json.dumps([{"_id": " padded id ", "text": "padded"}]).encode())
    assert r.status_code == 422 and "leading or trailing whitespace" in r.json()["errors"][0]["message"], r.text
    d = httpx.delete(url + "/documents/%20padded%20id%20", headers=AUTH, trust_env=False)
    assert d.status_code == 422 and "leading or trailing whitespace" in d.json()["detail"], (
        d.text
    )  # not a 404: the same rule
    r = _post(url, json.dumps([{"_id": "inner space id", "text": "kept exactly"}]).encode())
    assert r.status_code == 200 and r.json()["documents"] == [
        {"index": 0, "_id": "inner space id", "status": "added"}
    ], r.text
    assert server.app.state.service.index.row_of.get("inner space id") is not None
    assert httpx.delete(url + "/documents/inner%20space%20id", headers=AUTH, trust_env=False).status_code == 200


def test_text_plain_is_415_like_search(server):
    body = json.dumps([{"_id": "tp", "text": "plain"}]).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded"):
        r = _post(server.url, body, headers={**AUTH, "content-type": ctype})
        s = httpx.post(
            server.url + "/search", content=b'{"query": "fox"}', headers={"content-type": ctype}, trust_env=False
        )
        assert (
            r.status_code == s.status_code == 415 and r.json()["error"] == s.json()["error"] == "unsupported_media_type"
        ), r.text
    assert "tp" not in server.app.state.service.index.row_of


def test_per_document_status_and_resending_is_idempotent(server):
    url = server.url
    n0 = len(server.app.state.service.index)
    batch = [
        {"_id": "ia", "title": "okapi", "text": "okapi forest"},
        {"_id": "ib", "title": "tapir", "text": "tapir river"},
    ]
    r = _post(url, json.dumps({"documents": batch}).encode())
    assert [d["status"] for d in r.json()["documents"]] == ["added", "added"] and r.json()["replaced"] == 0, r.text
    first = (_ids(url, "okapi"), _ids(url, "tapir"), len(server.app.state.service.index))
    for _ in range(2):  # the same batch again: same documents, every one "replaced"
        r = _post(url, json.dumps({"documents": batch}).encode())
        assert [d["status"] for d in r.json()["documents"]] == ["replaced", "replaced"], r.text
        assert (_ids(url, "okapi"), _ids(url, "tapir"), len(server.app.state.service.index)) == first
    assert first[2] == n0 + 2 and first[0] == ["ia"] and first[1] == ["ib"]
    r = _post(url, json.dumps([{"_id": "ia", "text": "okapi again"}, {"_id": "ic", "text": "quokka"}]).encode())
    assert r.json()["documents"] == [
        {"index": 0, "_id": "ia", "status": "replaced"},
        {"index": 1, "_id": "ic", "status": "added"},
    ]


def test_resend_after_a_dropped_connection_leaves_the_same_state(server):
    url = server.url
    n0 = len(server.app.state.service.index)
    batch = json.dumps(
        [{"_id": f"drop{i}", "title": "wombat", "text": f"wombat burrow {i}"} for i in range(6)]
    ).encode()
    with pytest.raises(httpx.TimeoutException):  # the client gives up and closes the connection mid-request
        _post(url, batch, timeout=httpx.Timeout(30, read=0.001))
    r = _post(url, batch)  # the client re-sends: it cannot know whether the first one was applied
    assert r.status_code == 200 and {d["status"] for d in r.json()["documents"]} <= {"added", "replaced"}, r.text
    time.sleep(0.5)  # a first request still in the ingest thread would be applied by now
    r = _post(url, batch)
    assert [d["status"] for d in r.json()["documents"]] == ["replaced"] * 6
    assert len(server.app.state.service.index) == n0 + 6 and sorted(_ids(url, "wombat")) == sorted(
        f"drop{i}" for i in range(6)
    )


def test_resend_after_a_503_while_loading(live_index, tiny_bert_dir):
    app = create_app(live_index, tiny_bert_dir, ServeSettings(port=0, admin_token=TOKEN, max_wait_ms=2))
    svc = app.state.service
    gate = threading.Event()
    real_load = svc._load_sync

    def slow_load():  # the real loader, held until the 503 has been seen
        gate.wait(30)
        real_load()

    svc._load_sync = slow_load
    batch = json.dumps(
        [{"_id": "late1", "title": "pangolin", "text": "pangolin scales"}, {"_id": "late2", "text": "aardvark"}]
    ).encode()
    with BackgroundServer(app) as srv:
        r = _post(srv.url, batch)
        assert r.status_code == 503 and r.json()["error"] == "not_ready" and int(r.headers["retry-after"]) >= 1, r.text
        gate.set()
        srv.wait_ready()
        assert len(svc.index) == 48 and svc.index.wal.records == 0  # the refused request left nothing
        r = _post(srv.url, batch)
        assert [d["status"] for d in r.json()["documents"]] == ["added", "added"], r.text
        r = _post(srv.url, batch)
        assert [d["status"] for d in r.json()["documents"]] == ["replaced", "replaced"]
        assert len(svc.index) == 50 and _ids(srv.url, "pangolin") == ["late1"]
