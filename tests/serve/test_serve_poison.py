"""One bad query must not fail its micro-batch neighbours, and the small HTTP gaps:
invalid UTF-8 / deep JSON -> ``malformed_json``, a non-JSON content type -> 415, 405 with
``Allow``, fewer than k hits reported. A real uvicorn server, the tiny BERT tower and the
IVF-PQ index of ``tests/serve/conftest.py``."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import numpy as np
import pytest

from scalingnote.serve import metric_value, parse_metrics
from tests.serve.conftest import running_server

POISON = "poison-marker"


@pytest.fixture(scope="module")
def server(serve_index, tiny_bert_dir):
    # max_wait_ms=100: 32 concurrent requests land in one or two micro-batches
    with running_server(
        serve_index, tiny_bert_dir, max_wait_ms=100, max_batch=64, max_k=200, max_batch_queries=8
    ) as srv:
        yield srv


async def _post_all(url: str, bodies: list[bytes]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=30) as c:
        return await asyncio.gather(
            *(c.post("/search", content=b, headers={"content-type": "application/json"}) for b in bodies)
        )


def _queries(serve_beir, n: int) -> list[str]:
    texts = [json.loads(line)["text"] for line in (serve_beir / "queries.jsonl").read_text().splitlines()]
    return [texts[i % len(texts)] + f" {i}" for i in range(n)]


def _batches(server) -> float:
    return metric_value(
        parse_metrics(httpx.get(server.url + "/metrics", trust_env=False).text), "scalingnote_encode_batch_size_count"
    )


def test_one_lone_surrogate_among_32_queries_fails_alone(server, serve_beir):
    texts = _queries(serve_beir, 32)
    # valid JSON (an escaped lone surrogate), not valid Unicode
    bodies = [json.dumps({"query": t, "k": 5}).encode() for t in texts]
    bodies[13] = b'{"query": "fox \\ud800 jumps", "k": 5}'
    before = _batches(server)
    resps = asyncio.run(_post_all(server.url, bodies))
    codes = [r.status_code for r in resps]
    assert codes.count(200) == 31 and codes[13] == 422, codes
    bad = resps[13].json()
    assert (
        bad["error"] == "invalid_request"
        and bad["detail"].startswith("query: not valid Unicode")
        and "U+D800" in bad["detail"]
    )
    assert all(len(r.json()["results"]) == 5 for i, r in enumerate(resps) if i != 13)
    assert _batches(server) - before < 31  # the 31 good ones were still micro-batched together


class _Poisoned:
    """The real query tower, except that it raises on any batch holding the marker text (an
    encoding failure the request validation cannot foresee)."""

    def __init__(self, tower):
        self._tower = tower

    def __getattr__(self, name):
        return getattr(self._tower, name)

    def encode_queries(self, texts, **kw):
        if any(POISON in t for t in texts):
            raise TypeError("internal detail that must not reach a client")
        return self._tower.encode_queries(texts, **kw)


def test_an_encode_failure_is_retried_one_request_at_a_time(server, serve_beir, client, caplog):
    svc = server.app.state.service
    texts = _queries(serve_beir, 32)
    reference = [client.post("/search", json={"query": t, "k": 5}).json()["results"] for t in texts]
    texts[7] = f"fox {POISON}"
    real = svc.tower
    svc.tower = _Poisoned(real)  # read by the batcher once per micro-batch
    try:
        with caplog.at_level(logging.ERROR, logger="scalingnote.serve"):
            resps = asyncio.run(_post_all(server.url, [json.dumps({"query": t, "k": 5}).encode() for t in texts]))
    finally:
        svc.tower = real
    codes = [r.status_code for r in resps]
    assert codes.count(200) == 31 and codes[7] == 500, codes
    body = resps[7].json()
    assert (
        body["error"] == "encode_failed" and "internal detail" not in resps[7].text and "TypeError" not in resps[7].text
    )
    for i, r in enumerate(resps):
        if i != 7:  # the neighbours get the answers they get alone
            got, ref = r.json()["results"], reference[i]
            assert [h["doc_id"] for h in got] == [h["doc_id"] for h in ref] or np.allclose(
                [h["score"] for h in got], [h["score"] for h in ref], atol=1e-5
            )
    lines = [rec for rec in caplog.records if "query encoding failed" in rec.getMessage()]
    assert 1 <= len(lines) <= 2 and all(
        rec.exc_info is None and "\n" not in rec.getMessage() for rec in lines
    )  # one line per micro-batch, no traceback
    assert "1 of" in lines[0].getMessage()
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("\x00", "empty"),
        ("\x00\x00 \t", "empty"),
        ("\u200b\u200c\u200d\ufeff", "empty"),
        ("a\udc80", "not valid Unicode"),
    ],
)
def test_invalid_and_blank_queries_are_422_naming_the_field(client, query, why):
    body = json.dumps({"query": query}).encode()  # json.dumps escapes the surrogate: valid JSON
    r = client.post("/search", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"].startswith("query: ") and why in r.json()["detail"], r.text
    r = client.post(
        "/search/batch",
        content=json.dumps({"queries": ["fox", query]}).encode(),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422 and r.json()["detail"].startswith("queries.1: ") and why in r.json()["detail"], r.text


def test_null_byte_inside_a_real_query_is_searched(client):
    r = client.post("/search", json={"query": "quick\x00 brown fox", "k": 3})
    assert r.status_code == 200 and len(r.json()["results"]) == 3


def test_malformed_bodies_content_type_and_method(client):
    cases = [
        b'{"query": "fox \xff\xfe"}',  # invalid UTF-8
        b'{"query": "\xc3"}',  # truncated UTF-8 sequence
        # an encoded surrogate: not UTF-8 (the shared parser; /documents answers alike)
        b'{"query": "bad \xed\xa0\x80 text"}',
        b"[" * 100_000 + b"]" * 100_000,  # nested too deeply for the JSON parser
    ]
    for body in cases:
        r = client.post("/search", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"] == "malformed_json", (body[:20], r.text)
        assert "There was an error" not in r.text
    r = client.post("/search", content=b"[" * 100_000, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "malformed_json"
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = client.post("/search", content=b'{"query": "fox"}', headers={"content-type": ctype})
        assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type", (ctype, r.text)
    r = client.post("/search", content=b'{"query": "fox"}', headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200
    r = client.get("/search")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed" and r.headers["allow"] == "POST"
    r = client.delete("/healthz")
    assert r.status_code == 405 and "GET" in r.headers["allow"]


def test_a_surrogate_in_a_field_name_still_gets_a_json_422(client):
    r = client.post("/search", content=b'{"query": "fox", "\\ud800x": 1}', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_request"


def test_fewer_than_k_hits_are_reported(client):
    r = client.post("/search", json={"query": "vitamin", "k": 5})
    assert r.status_code == 200 and r.json()["found"] == 5 and r.json()["fewer_than_k"] is False
    r = client.post("/search", json={"query": "vitamin", "k": 200, "nprobe": 1})  # 48 documents, 1 of 4 lists probed
    body = r.json()
    assert r.status_code == 200 and body["found"] == len(body["results"]) < 48 and body["fewer_than_k"] is True
    r = client.post("/search", json={"query": "vitamin", "k": 200, "mode": "dense", "nprobe": 4})
    assert r.json()["found"] == 48 and r.json()["fewer_than_k"] is True
    r = client.post("/search/batch", json={"queries": ["vitamin", "fox"], "k": 3})
    assert r.json()["found"] == [3, 3] and r.json()["fewer_than_k"] == [False, False]
