"""OpenAPI-driven fuzzing (schemathesis) of the running service on 127.0.0.1 with the tiny
index: schema-valid and schema-violating requests to every operation. No 5xx, no hang (every
request answers within its timeout), and the service is healthy afterwards.
A few tens of examples per operation here; ``benchmarks/fuzz.py`` runs more."""

from __future__ import annotations

import httpx
import pytest

from scalingnote.serve import BackgroundServer, ServeSettings, create_app

pytest.importorskip("schemathesis", reason="schemathesis (test extra) is not installed")


def test_schemathesis_no_5xx_no_hang_healthy_after(serve_index, tiny_bert_dir):
    from tests.helpers.fuzz_service import fuzz_service

    app = create_app(
        serve_index, tiny_bert_dir, ServeSettings(port=0, max_wait_ms=1, max_batch_queries=16, max_query_chars=300)
    )
    with BackgroundServer(app) as srv:
        srv.wait_ready()
        results = fuzz_service(srv.url, app.openapi(), examples=15, admin_token=app.state.admin_token)
        ops = {r.operation for r in results}
        assert {"POST /search", "POST /search/batch", "GET /healthz", "GET /metrics", "POST /admin/reload"} <= ops
        assert all(r.examples > 0 for r in results)
        bad = [r for r in results if r.failures]
        assert not bad, [(r.operation, r.mode, r.first_failure) for r in bad]
        # the 4xx paths were reached, not only 200s
        codes = {c for r in results for c in r.statuses}
        assert 200 in codes and (400 in codes or 422 in codes)
        h = httpx.get(srv.url + "/healthz", trust_env=False, timeout=30)
        assert h.status_code == 200 and h.json()["status"] == "ok"
        r = httpx.post(srv.url + "/search", json={"query": "product quantization", "k": 3}, trust_env=False, timeout=30)
        assert r.status_code == 200 and len(r.json()["results"]) == 3


def test_invalid_unicode_and_malformed_bodies_get_the_documented_4xx(serve_index, tiny_bert_dir):
    """Lone surrogates / blank queries -> 422, invalid UTF-8 / deep JSON -> 400
    malformed_json, a non-JSON content type -> 415; never a 5xx or internals in the body."""
    from tests.helpers.fuzz_service import UNICODE_STRATEGIES, fuzz_unicode

    app = create_app(serve_index, tiny_bert_dir, ServeSettings(port=0, max_wait_ms=1))
    with BackgroundServer(app) as srv:
        srv.wait_ready()
        results = fuzz_unicode(srv.url, examples=20)
        assert {r.operation for r in results} == set(UNICODE_STRATEGIES)
        bad = [(r.operation, r.first_failure) for r in results if r.failures]
        assert not bad, bad
        assert all(r.examples >= 5 for r in results)
        r = httpx.post(srv.url + "/search", json={"query": "product quantization", "k": 3}, trust_env=False, timeout=30)
        assert r.status_code == 200
