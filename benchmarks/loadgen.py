"""An async load generator for the query service (the stress test of TMJ §6.2, on loopback).

Run ``python -m benchmarks.loadgen --url http://127.0.0.1:8080 --queries QUERIES`` from the
repository root (the benchmarks import :func:`run_loadtest` / :func:`run_loadtest_async`). It
is a client of the service, so it lives here rather than in the product packages.

``concurrency`` workers share one ``httpx.AsyncClient``; each sends ``POST /search``
requests back to back (closed loop) with the next query of the list, until
``duration_s`` has passed or ``max_requests`` requests have been sent. A target where nothing
listens is refused before the run; a service that stops answering mid-run (every worker's
connections failing, ``2 x concurrency`` failures in a row) ends it (``stopped_by:
"unreachable"``), and the command exits 1 when no request succeeded. Reported: QPS
(successful requests per second of wall time), latency percentiles of the successful
requests (ms), error counts by kind, and — from two ``/metrics`` scrapes — the mean
encode micro-batch size the service used during the run.

Only loopback targets are accepted (127.0.0.0/8, ``localhost``, ``::1``): this tool is
for measuring one's own service, not for loading other hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.serve.metrics import metric_value, parse_metrics
from scalingnote.serve.settings import is_loopback_host

MAX_CONCURRENCY = 1024
MAX_DURATION_S = 3600.0


def check_loopback_url(url: str) -> tuple[str, str]:
    """Validate ``url`` and return ``(base_url, search_url)``.

    ``url`` is the service root (``http://127.0.0.1:8080``) or its ``/search`` endpoint.
    Refuses anything but http(s) to 127.0.0.0/8, ``localhost`` or ``::1``.
    """
    try:
        parts = urlsplit(str(url).strip())
        host = parts.hostname
        _ = parts.port  # raises ValueError on a bad port
    except ValueError as e:
        raise ScalingNoteError(f"--url {url!r}: invalid URL ({e})") from None
    if parts.scheme not in ("http", "https"):
        raise ScalingNoteError(f"--url {url!r}: scheme must be http or https")
    if not host:
        raise ScalingNoteError(f"--url {url!r}: no host")
    if parts.username or parts.password:
        raise ScalingNoteError(f"--url {url!r}: credentials in the URL are not accepted")
    if not is_loopback_host(host):
        raise ScalingNoteError(
            f"--url {url!r}: host {host!r} is not a loopback address; the load generator only targets "
            "127.0.0.0/8, localhost or ::1"
        )
    path = parts.path.rstrip("/")
    if path.endswith("/search"):
        base_path = path[: -len("/search")]
        search_path = path
    else:
        base_path = path
        search_path = path + "/search"
    base = urlunsplit((parts.scheme, parts.netloc, base_path, "", ""))
    return base, urlunsplit((parts.scheme, parts.netloc, search_path, "", ""))


def read_queries_file(path: str | Path) -> list[str]:
    """Query texts from a BEIR ``queries.jsonl`` (``_id``/``text``; also a BEIR directory)
    or from a text file with one query per line (blank lines skipped)."""
    p = Path(path)
    if p.is_dir():
        p = p / "queries.jsonl"
    if not p.is_file():
        raise ScalingNoteError(f"{p}: queries file not found")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(p, None, None, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if p.suffix == ".jsonl" or first.startswith("{"):
        from scalingnote.data.beir import load_queries

        queries = [q.text for q in load_queries(p).values()]
    else:
        queries = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not queries:
        raise DataError(p, None, None, "no queries")
    return queries


@dataclass
class LoadTestResult:
    url: str
    concurrency: int
    k: int
    duration_s: float  # wall time of the run
    requests: int  # sent (ok + errors)
    ok: int
    errors: int
    error_kinds: dict[str, int] = field(default_factory=dict)
    qps: float = 0.0
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    max_ms: float | None = None
    mean_encode_batch_size: float | None = None  # from /metrics (None if it could not be read)
    server_queries: int | None = None  # queries the service searched during the run (from /metrics)
    stopped_by: str = "duration"  # "duration" | "max_requests" | "unreachable" (the service stopped answering)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        def f(v):
            return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

        rows = [
            ("url", self.url),
            ("concurrency", self.concurrency),
            ("duration (s)", f"{self.duration_s:.2f}"),
            ("requests", self.requests),
            ("ok", self.ok),
            ("errors", self.errors),
            ("qps", f"{self.qps:.1f}"),
            ("p50 (ms)", f(self.p50_ms)),
            ("p95 (ms)", f(self.p95_ms)),
            ("p99 (ms)", f(self.p99_ms)),
            ("mean (ms)", f(self.mean_ms)),
            ("max (ms)", f(self.max_ms)),
            ("mean encode batch", f(self.mean_encode_batch_size)),
        ]
        rows += [(f"  error {k}", v) for k, v in sorted(self.error_kinds.items())]
        w = max(len(r[0]) for r in rows)
        return "\n".join(f"{name:<{w}}  {val}" for name, val in rows)


async def _scrape(client, base: str) -> dict | None:
    try:
        r = await client.get(base + "/metrics")
        if r.status_code != 200:
            return None
        return parse_metrics(r.text)
    except Exception:  # noqa: BLE001 - metrics are optional for the report
        return None


async def _check_reachable(client, base: str) -> None:
    """Refuse to start when nothing answers at ``base`` (a closed port, a wrong host)."""
    import httpx

    try:
        await client.get(base + "/healthz")
    except httpx.TransportError as e:
        raise ScalingNoteError(
            f"{base}: no service answers ({type(e).__name__}); is `scalingnote serve` running on that port?"
        ) from None


def _check_load_args(queries: list[str], concurrency: int, duration_s: float, max_requests: int | None, k: int) -> None:
    if not 1 <= int(concurrency) <= MAX_CONCURRENCY:
        raise ScalingNoteError(f"--concurrency must be in 1..{MAX_CONCURRENCY}, got {concurrency}")
    if not 0 < float(duration_s) <= MAX_DURATION_S:
        raise ScalingNoteError(f"--duration must be in (0, {MAX_DURATION_S:.0f}] seconds, got {duration_s}")
    if max_requests is not None and max_requests < 1:
        raise ScalingNoteError(f"--max-requests must be >= 1, got {max_requests}")
    if k < 1:
        raise ScalingNoteError(f"--k must be >= 1, got {k}")
    if not queries:
        raise ScalingNoteError("no queries to send")


async def run_loadtest_async(
    url: str,
    queries: list[str],
    *,
    concurrency: int = 8,
    duration_s: float = 10.0,
    max_requests: int | None = None,
    k: int = 10,
    timeout_s: float = 30.0,
    seed: int = 0,
    extra: dict[str, Any] | None = None,
) -> LoadTestResult:
    """Closed-loop load: ``concurrency`` workers, bounded by ``duration_s`` and ``max_requests``.

    ``queries`` are sent in a seeded random order (cycling). ``extra`` adds fields to
    each request body (e.g. ``{"rerank": 100}``).
    """
    import httpx

    base, search_url = check_loopback_url(url)
    _check_load_args(queries, concurrency, duration_s, max_requests, k)
    order = np.random.default_rng(seed).permutation(len(queries))
    bodies = [json.dumps({"query": queries[i], "k": int(k), **(extra or {})}).encode("utf-8") for i in order]

    state = {"sent": 0, "down": 0}  # down: transport failures in a row (no answer at all)
    give_up = max(10, 2 * int(concurrency))
    latencies: list[float] = []
    errors: dict[str, int] = {}
    stopped_by = "duration"
    # one client (one keep-alive connection) per worker: httpcore's shared pool re-scans every
    # connection on each request, which made the *client* the bottleneck at concurrency 64
    # (measured: 108 q/s with one shared 64-connection pool, the service idle in epoll)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(trust_env=False, timeout=timeout_s) as client:
        await _check_reachable(client, base)
        before = await _scrape(client, base)
        t0 = time.perf_counter()
        deadline = t0 + float(duration_s)

        async def worker() -> None:
            nonlocal stopped_by
            async with httpx.AsyncClient(trust_env=False, timeout=timeout_s, limits=limits, headers=headers) as own:
                while True:
                    if time.perf_counter() >= deadline:
                        return
                    if max_requests is not None and state["sent"] >= max_requests:
                        stopped_by = "max_requests"
                        return
                    if state["down"] >= give_up:  # the service went away: stop instead of hammering a closed port
                        stopped_by = "unreachable"
                        return
                    i = state["sent"]
                    state["sent"] += 1
                    body = bodies[i % len(bodies)]
                    s = time.perf_counter()
                    try:
                        r = await own.post(search_url, content=body)
                        await r.aread()
                        state["down"] = 0
                        if r.status_code == 200:
                            latencies.append(time.perf_counter() - s)
                        else:
                            key = f"http_{r.status_code}"
                            errors[key] = errors.get(key, 0) + 1
                    except httpx.TimeoutException:
                        errors["timeout"] = errors.get("timeout", 0) + 1
                    except httpx.HTTPError as e:
                        key = type(e).__name__
                        errors[key] = errors.get(key, 0) + 1
                        if isinstance(e, httpx.TransportError):
                            state["down"] += 1
                        await asyncio.sleep(0.01)  # server down: do not spin

        await asyncio.gather(*(worker() for _ in range(int(concurrency))))
        elapsed = time.perf_counter() - t0
        after = await _scrape(client, base)

    return _result(search_url, concurrency, k, elapsed, latencies, errors, stopped_by, before, after)


def _result(
    search_url: str,
    concurrency: int,
    k: int,
    elapsed: float,
    latencies: list[float],
    errors: dict[str, int],
    stopped_by: str,
    before: dict | None,
    after: dict | None,
) -> LoadTestResult:
    """The run's counts, QPS, latency percentiles and (from two /metrics scrapes) batch sizes."""
    lat_ms = np.asarray(latencies) * 1000.0
    n_err = sum(errors.values())
    res = LoadTestResult(
        url=search_url,
        concurrency=int(concurrency),
        k=int(k),
        duration_s=round(elapsed, 3),
        requests=len(latencies) + n_err,
        ok=len(latencies),
        errors=n_err,
        error_kinds=dict(sorted(errors.items())),
        qps=round(len(latencies) / elapsed, 2) if elapsed > 0 else 0.0,
        stopped_by=stopped_by,
    )
    if len(lat_ms):
        p50, p95, p99 = np.percentile(lat_ms, [50, 95, 99])
        res.p50_ms, res.p95_ms, res.p99_ms = round(float(p50), 3), round(float(p95), 3), round(float(p99), 3)
        res.mean_ms, res.max_ms = round(float(lat_ms.mean()), 3), round(float(lat_ms.max()), 3)
    if before is not None and after is not None:
        d_sum = metric_value(after, "scalingnote_encode_batch_size_sum") - metric_value(
            before, "scalingnote_encode_batch_size_sum"
        )
        d_cnt = metric_value(after, "scalingnote_encode_batch_size_count") - metric_value(
            before, "scalingnote_encode_batch_size_count"
        )
        res.mean_encode_batch_size = round(d_sum / d_cnt, 3) if d_cnt > 0 else None
        res.server_queries = int(
            metric_value(after, "scalingnote_queries_total") - metric_value(before, "scalingnote_queries_total")
        )
    return res


def run_loadtest(url: str, queries: list[str], **kwargs: Any) -> LoadTestResult:
    """Synchronous wrapper of :func:`run_loadtest_async`."""
    return asyncio.run(run_loadtest_async(url, queries, **kwargs))


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.loadgen``: load-test a running service (loopback only) and print QPS,
    p50/p95/p99 latency and errors; exit status 1 when no request succeeded."""
    from scalingnote.utils import run_metadata, write_json

    ap = argparse.ArgumentParser(
        description="Load-test a running scalingnote service (loopback only): QPS, p50/p95/p99 latency, errors."
    )
    ap.add_argument("--url", required=True, help="Service URL on loopback, e.g. http://127.0.0.1:8080.")
    ap.add_argument(
        "--queries",
        required=True,
        type=Path,
        help="BEIR queries.jsonl (or BEIR dir), or a text file with one query per line.",
    )
    ap.add_argument("--concurrency", type=int, default=8, help="Concurrent clients (closed loop).")
    ap.add_argument("--duration", type=float, default=10.0, help="Seconds to run.")
    ap.add_argument("--max-requests", type=int, default=None, help="Stop after this many requests.")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--rerank", type=int, default=None, help="Ask the service to re-rank N candidates.")
    ap.add_argument("--timeout", type=float, default=30.0, help="Per-request timeout (seconds).")
    ap.add_argument("--seed", type=int, default=0, help="Seed of the query order.")
    ap.add_argument("--json", action="store_true", help="Print one JSON object instead of a table.")
    ap.add_argument(
        "--out", type=Path, default=None, help="Also write the result + config + versions as JSON (atomically)."
    )
    a = ap.parse_args(argv)
    try:
        check_loopback_url(a.url)  # refuse before reading anything
        texts = read_queries_file(a.queries)
        res = run_loadtest(
            a.url,
            texts,
            concurrency=a.concurrency,
            duration_s=a.duration,
            max_requests=a.max_requests,
            k=a.k,
            timeout_s=a.timeout,
            seed=a.seed,
            extra={"rerank": a.rerank} if a.rerank is not None else None,
        )
    except ScalingNoteError as e:
        print(f"loadgen: {e}", file=sys.stderr)
        return 2
    if a.out is not None:
        meta = run_metadata(
            {
                "url": a.url,
                "queries": str(a.queries),
                "concurrency": a.concurrency,
                "duration": a.duration,
                "max_requests": a.max_requests,
                "k": a.k,
                "rerank": a.rerank,
                "timeout": a.timeout,
                "seed": a.seed,
            }
        )
        meta["result"] = res.to_dict()
        write_json(a.out, meta)
    print(json.dumps(res.to_dict()) if a.json else res.table())
    if res.ok == 0:
        print(f"loadgen: no request succeeded ({res.errors} errors, stopped by {res.stopped_by})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
