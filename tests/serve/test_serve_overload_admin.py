"""Overload shedding (bounded queue, 503 + Retry-After) and the admin guard (token,
loopback, no proxy forwarding headers), on a real uvicorn server with the tiny index."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from scalingnote.errors import ConfigError
from scalingnote.serve import BackgroundServer, ServeSettings, create_app, metric_value, parse_metrics
from scalingnote.serve.settings import resolve_admin_token


async def _post_all(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=60) as c:
        return await asyncio.gather(*(c.post("/search" if "query" in b else "/search/batch", json=b) for b in bodies))


# ------------------------------------------------------------------ overload


def test_queue_bound_sheds_with_503_and_retry_after(serve_index, tiny_bert_dir):
    # a long batching window keeps admitted requests counted as queued while the rest arrive
    settings = ServeSettings(port=0, max_queue=4, max_batch=64, max_wait_ms=600, max_batch_queries=8)
    app = create_app(serve_index, tiny_bert_dir, settings)
    with BackgroundServer(app) as srv:
        srv.wait_ready()
        rs = asyncio.run(_post_all(srv.url, [{"query": f"quantization codes {i}", "k": 3} for i in range(12)]))
        codes = [r.status_code for r in rs]
        assert codes.count(200) == 4 and codes.count(503) == 8, codes
        for r in rs:
            if r.status_code == 503:
                body = r.json()
                assert body["error"] == "overloaded" and "limit 4" in body["detail"]
                assert 1 <= int(r.headers["retry-after"]) <= 60
            else:
                assert len(r.json()["results"]) == 3
        m = parse_metrics(httpx.get(srv.url + "/metrics", trust_env=False).text)
        assert metric_value(m, "scalingnote_shed_queries_total") == 8
        assert metric_value(m, "scalingnote_rejected_total", reason="overload") == 8
        assert metric_value(m, "scalingnote_queue_limit_queries") == 4
        assert metric_value(m, "scalingnote_http_requests_total", endpoint="/search", status="503") == 8

        # a batch larger than the bound is admitted into an empty queue (never starved) ...
        r = httpx.post(
            srv.url + "/search/batch",
            json={"queries": [f"q {i}" for i in range(6)], "k": 2},
            trust_env=False,
            timeout=60,
        )
        assert r.status_code == 200 and len(r.json()["results"]) == 6
        # ... and after shedding the service is healthy and answers again
        assert httpx.get(srv.url + "/healthz", trust_env=False).json()["queue_queries"] == 0
        r = httpx.post(srv.url + "/search", json={"query": "scaling laws", "k": 2}, trust_env=False, timeout=60)
        assert r.status_code == 200


def test_retry_after_follows_measured_throughput(serve_index, tiny_bert_dir):
    from scalingnote.serve.service import SearchService

    svc = SearchService(serve_index, tiny_bert_dir, ServeSettings(max_queue=10))
    assert svc.retry_after_s() == 1  # nothing measured yet
    svc._rate, svc._lanes.queued_single = 2.0, 10  # 10 waiting at 2 queries/s -> 5 s
    assert svc.retry_after_s() == 5
    svc._rate = 0.01
    assert svc.retry_after_s() == 60  # capped
    assert svc.admits(0) and not svc.admits(1)
    svc._lanes.queued_single = 0
    assert svc.admits(500) and svc.admits(500, batch=True)  # an empty queue admits any request


# ------------------------------------------------------------------ admin guard


def test_admin_needs_token_loopback_and_no_forwarding_headers(tmp_path, serve_index, tiny_bert_dir):
    token = "s3cret-admin-token-0123456789"
    app = create_app(serve_index, tiny_bert_dir, ServeSettings(port=0, admin_token=token))
    assert app.state.admin_token == token and app.state.admin_token_source == "option"
    body = {"query_tower": str(tmp_path / "missing")}  # past the guard this is a 400 (not a tower)
    good = {"Authorization": f"Bearer {token}"}
    with BackgroundServer(app) as srv:
        srv.wait_ready()
        with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
            r = c.post("/admin/reload", json=body)
            assert (
                r.status_code == 401
                and r.json()["error"] == "unauthorized"
                and r.headers["www-authenticate"] == "Bearer"
            )
            assert (
                c.post(
                    "/admin/reload", json=body, headers={"Authorization": "Bearer wrong-token-wrong-token"}
                ).status_code
                == 401
            )
            assert c.post("/admin/reload", json=body, headers={"Authorization": f"Basic {token}"}).status_code == 401
            # the guard runs before the body is parsed: no token -> 401 even for a malformed body
            assert (
                c.post("/admin/reload", content=b"{not json", headers={"content-type": "application/json"}).status_code
                == 401
            )
            for h in (
                {"X-Forwarded-For": "203.0.113.9"},
                {"Forwarded": "for=203.0.113.9"},
                {"X-Real-IP": "203.0.113.9"},
                {"Via": "1.1 proxy"},
            ):
                r = c.post("/admin/reload", json=body, headers={**good, **h})
                assert r.status_code == 403 and "forwarding headers" in r.json()["detail"], (h, r.text)
            r = c.post("/admin/reload", json=body, headers=good)
            assert r.status_code == 400 and r.json()["error"] == "tower_load_failed"
            r = c.post("/admin/reload", json=body, headers={"X-Admin-Token": token})
            assert r.status_code == 400
            # search endpoints need no token and accept proxied requests
            assert (
                c.post("/search", json={"query": "fox", "k": 2}, headers={"X-Forwarded-For": "203.0.113.9"}).status_code
                == 200
            )
            m = parse_metrics(c.get("/metrics").text)
            assert metric_value(m, "scalingnote_rejected_total", reason="admin_unauthorized") == 4
            assert metric_value(m, "scalingnote_rejected_total", reason="admin_proxied") == 4

    async def remote():  # right token, non-loopback peer: still refused
        transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 4567))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.post("/admin/reload", json=body, headers=good)

    r = asyncio.run(remote())
    assert r.status_code == 403 and "loopback" in r.json()["detail"]


def test_admin_token_sources(tmp_path):
    tok, src = resolve_admin_token(ServeSettings())
    assert src == "generated" and len(tok) >= 32
    assert resolve_admin_token(ServeSettings())[0] != tok  # a new one per start
    f = tmp_path / "token.txt"
    f.write_text("from-a-file-0123456789abcdef\n", encoding="utf-8")
    assert resolve_admin_token(ServeSettings(admin_token_file=str(f))) == ("from-a-file-0123456789abcdef", "file")
    f.write_text("short\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="token.txt.*at least 16"):
        resolve_admin_token(ServeSettings(admin_token_file=str(f)))
    with pytest.raises(ConfigError, match="cannot read"):
        resolve_admin_token(ServeSettings(admin_token_file=str(tmp_path / "nope")))
    with pytest.raises(ConfigError, match="at least 16"):
        ServeSettings(admin_token="too short")
    assert ServeSettings(admin_token="x" * 20).to_dict()["admin_token"] == "***"
    assert "x" * 20 not in repr(ServeSettings(admin_token="x" * 20))


def test_cli_serve_prints_generated_token_and_env_token_works(tmp_path, serve_index, tiny_bert_dir):
    """`scalingnote serve` prints a generated token (which then works) and takes one from the env."""
    import os

    def start(env_token: str | None):
        env = {k: v for k, v in os.environ.items() if k != "SCALINGNOTE_ADMIN_TOKEN"}
        if env_token:
            env["SCALINGNOTE_ADMIN_TOKEN"] = env_token
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scalingnote",
                "serve",
                "--index",
                str(serve_index),
                "--query-tower",
                str(tiny_bert_dir),
                "--port",
                "0",
                "--threads",
                "1",
                "--log-level",
                "warning",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        first, second = p.stdout.readline(), p.stdout.readline()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", first)
        assert m, first + p.stderr.read()
        return p, m.group(1), second

    def reload_status(url: str, token: str) -> int:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 180:
            try:
                if httpx.get(url + "/healthz", trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        return httpx.post(
            url + "/admin/reload",
            json={"query_tower": str(tmp_path / "missing")},
            headers={"Authorization": f"Bearer {token}"},
            trust_env=False,
            timeout=30,
        ).status_code

    for env_token in (None, "env-token-0123456789abcdef"):
        p, url, line = start(env_token)
        try:
            if env_token is None:
                m = re.search(r"admin token for this run .*: (\S+)$", line.strip())
                assert m, line
                token = m.group(1)
            else:
                assert "SCALINGNOTE_ADMIN_TOKEN" in line and env_token not in line  # not echoed
                token = env_token
            assert reload_status(url, token) == 400  # authorized: the (missing) tower is what fails
            assert reload_status(url, "not-the-token-0123456789") == 401
        finally:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
