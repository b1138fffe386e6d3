"""The load generator (``benchmarks/loadgen.py``, ``python -m benchmarks.loadgen``): loopback-only
rule, queries files, a real run against the service."""

from __future__ import annotations

import json

import pytest

from benchmarks.loadgen import check_loopback_url, read_queries_file, run_loadtest
from benchmarks.loadgen import main as loadgen
from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.serve import BackgroundServer, ServeSettings, check_bind_host, create_app, is_loopback_host


@pytest.mark.parametrize(
    ("url", "base", "search"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080", "http://127.0.0.1:8080/search"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080", "http://127.0.0.1:8080/search"),
        ("http://127.3.4.5:9/search", "http://127.3.4.5:9", "http://127.3.4.5:9/search"),
        ("http://localhost:8080", "http://localhost:8080", "http://localhost:8080/search"),
        ("https://LOCALHOST", "https://LOCALHOST", "https://LOCALHOST/search"),
        ("http://[::1]:8080/api", "http://[::1]:8080/api", "http://[::1]:8080/api/search"),
    ],
)
def test_loopback_urls_accepted(url, base, search):
    assert check_loopback_url(url) == (base, search)


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1:8080",
        "http://192.168.1.2",
        "http://0.0.0.0:8080",
        "http://example.com",
        "http://localhost.example.com:8080",
        "http://127.0.0.1.nip.io",
        "http://[2001:db8::1]:80",
        "http://[::]:8080",
        "ftp://127.0.0.1",
        "127.0.0.1:8080",
        "http://user:pw@127.0.0.1:8080",
        "http://127.0.0.1:99999",
        "",
    ],
)
def test_non_loopback_urls_refused(url):
    with pytest.raises(ScalingNoteError):
        check_loopback_url(url)


def test_bind_host_rule():
    for h in ("127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"):
        assert is_loopback_host(h)
        check_bind_host(h, allow_remote=False)
    for h in ("0.0.0.0", "::", "10.1.2.3", "example.com", ""):
        assert not is_loopback_host(h)
        with pytest.raises(ScalingNoteError, match="loopback"):
            check_bind_host(h, allow_remote=False)
    check_bind_host("0.0.0.0", allow_remote=True)


def test_loadtest_refuses_remote_before_sending(tmp_path, capsys):
    q = tmp_path / "q.txt"
    q.write_text("fox\n")
    assert loadgen(["--url", "http://93.184.216.34:80", "--queries", str(q), "--duration", "1"]) == 2
    assert "not a loopback address" in capsys.readouterr().err
    with pytest.raises(ScalingNoteError, match="loopback"):
        run_loadtest("http://example.com", ["fox"], duration_s=1)
    with pytest.raises(ScalingNoteError, match="concurrency"):
        run_loadtest("http://127.0.0.1:1", ["fox"], concurrency=0, duration_s=1)
    with pytest.raises(ScalingNoteError, match="duration"):
        run_loadtest("http://127.0.0.1:1", ["fox"], duration_s=0)


def test_read_queries_file(tmp_path):
    txt = tmp_path / "q.txt"
    txt.write_text("first query\n\n  second query  \n")
    assert read_queries_file(txt) == ["first query", "second query"]
    jl = tmp_path / "queries.jsonl"
    jl.write_text('{"_id": "1", "text": "alpha"}\n{"_id": "2", "text": "beta"}\n')
    assert read_queries_file(jl) == ["alpha", "beta"]
    assert read_queries_file(tmp_path) == ["alpha", "beta"]  # a BEIR directory
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "1", "text": "alpha"}\n{"_id": "2", "txt": "beta"}\n')
    with pytest.raises(DataError) as e:
        read_queries_file(bad)
    assert e.value.line == 2 and "bad.jsonl" in str(e.value)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match="no queries"):
        read_queries_file(empty)
    with pytest.raises(ScalingNoteError, match="not found"):
        read_queries_file(tmp_path / "missing.txt")


def _free_port() -> int:
    from scalingnote.serve import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()  # a free port with nothing listening
    return port


def test_loadtest_refuses_a_closed_port_before_the_run(tmp_path, capsys):
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(ScalingNoteError, match="no service answers"):
        run_loadtest(url, ["fox"], concurrency=2, duration_s=5, max_requests=6, timeout_s=2)
    queries = tmp_path / "q.txt"
    queries.write_text("fox\n")
    assert loadgen(["--url", url, "--queries", str(queries), "--duration", "30"]) == 2
    assert "no service answers" in capsys.readouterr().err


def test_loadtest_stops_when_the_service_goes_away(serve_index, tiny_bert_dir):
    """The service stops mid-run: the run ends soon after (not at its 60 s duration), reports
    ``unreachable`` and counts the connection errors."""
    import threading
    import time

    app = create_app(serve_index, tiny_bert_dir, ServeSettings(port=0, max_wait_ms=1, shutdown_timeout_s=1))
    out = {}
    with BackgroundServer(app) as srv:
        srv.wait_ready()
        t = threading.Thread(
            target=lambda: out.update(res=run_loadtest(srv.url, ["fox"], concurrency=2, duration_s=60, timeout_s=2))
        )
        t.start()
        time.sleep(1.0)
    t0 = time.perf_counter()
    t.join(30)
    res = out["res"]
    assert not t.is_alive() and time.perf_counter() - t0 < 20
    assert res.stopped_by == "unreachable" and res.ok > 0 and res.errors >= 10 and res.duration_s < 30


def test_loadtest_cli_exits_nonzero_when_every_request_fails(serve_index, tiny_bert_dir, serve_beir, capsys):
    app = create_app(serve_index, tiny_bert_dir, ServeSettings(port=0, max_wait_ms=1, max_k=10))
    with BackgroundServer(app) as srv:
        srv.wait_ready()
        code = loadgen(["--url", srv.url, "--queries", str(serve_beir), "--max-requests", "4", "--k", "50"])
    out = capsys.readouterr()
    assert code == 1 and "no request succeeded" in out.err and "http_422" in out.out


def test_loadtest_against_the_service(tmp_path, serve_index, tiny_bert_dir, serve_beir, capsys):
    app = create_app(serve_index, tiny_bert_dir, ServeSettings(port=0, max_wait_ms=5))
    with BackgroundServer(app) as srv:
        srv.wait_ready()
        res = run_loadtest(
            srv.url, read_queries_file(serve_beir / "queries.jsonl"), concurrency=4, duration_s=30, max_requests=40, k=5
        )
        assert res.ok == 40 and res.errors == 0 and res.stopped_by == "max_requests"
        assert 0 < res.p50_ms <= res.p95_ms <= res.p99_ms <= res.max_ms and res.qps > 0
        assert (
            res.server_queries == 40 and res.mean_encode_batch_size is not None and 1 <= res.mean_encode_batch_size <= 4
        )

        # time-bounded run, and the CLI's --json / --out
        out = tmp_path / "lt.json"
        capsys.readouterr()
        code = loadgen(
            [
                "--url",
                srv.url,
                "--queries",
                str(serve_beir),
                "--concurrency",
                "2",
                "--duration",
                "0.5",
                "--json",
                "--out",
                str(out),
            ]
        )
        printed = capsys.readouterr()
        assert code == 0, printed.err
        obj = json.loads(printed.out.strip().splitlines()[-1])
        assert obj["stopped_by"] == "duration" and obj["ok"] > 0 and obj["errors"] == 0 and obj["duration_s"] < 5
        saved = json.loads(out.read_text())
        assert saved["result"]["ok"] == obj["ok"] and saved["config"]["concurrency"] == 2 and "versions" in saved

        # errors are counted, not fatal: k above the service's limit -> 422 for every request
        bad = run_loadtest(srv.url, ["fox"], concurrency=2, duration_s=10, max_requests=5, k=5000)
        assert bad.ok == 0 and bad.error_kinds == {"http_422": 5}
        code = loadgen(["--url", srv.url, "--queries", str(serve_beir), "--max-requests", "3"])
        printed = capsys.readouterr().out
        assert code == 0 and "p99 (ms)" in printed and "qps" in printed
