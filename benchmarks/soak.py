"""Soak test: the query service under steady closed-loop load for a bounded time.

``scalingnote serve`` runs as its own process on a free loopback port (a tiny BERT query
tower and an IVF-PQ index with semantic IDs over the tiny BEIR corpus, so the run measures
the service — HTTP, batching, queue, FAISS — rather than model FLOPs). The load generator
(``benchmarks.loadgen.run_loadtest``) keeps ``--concurrency`` clients busy for ``--minutes``
(default 10 at concurrency 16), in one-minute windows; after each window the service's
resident memory (RSS, psutil) is sampled. Rows: one per window (requests, errors, QPS,
p99, RSS). The config holds the totals, RSS at start / end and its growth, and whether the
service was healthy afterwards. Only 127.0.0.1 is targeted; the run stops by itself.

Run: ``.venv/bin/python -m benchmarks.soak`` (10 minutes + set-up).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import tiny_served_index, write_results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--window", type=float, default=60.0, help="Seconds per reported window.")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def wait_ready(proc: subprocess.Popen) -> tuple[str, float]:
    """The service's URL (from its first output line) once ``/healthz`` answers 200 -> (url, seconds)."""
    import httpx

    m = re.search(r"listening on (http://\S+?) ", proc.stdout.readline())
    if not m:
        raise SystemExit(f"service did not start: {proc.stderr.read()[-2000:]}")
    url = m.group(1)
    t0 = time.monotonic()
    ready = False
    while not ready and time.monotonic() - t0 < 1200:  # model + index load (slow on a starved CPU)
        try:
            ready = httpx.get(url + "/healthz", trust_env=False).status_code == 200
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"service exited: {proc.stderr.read()[-2000:]}")
        time.sleep(0.2)
    if not ready:
        raise SystemExit("service not ready after 1200 s")
    return url, round(time.monotonic() - t0, 1)


def soak_windows(url: str, texts: list[str], ps, args) -> list[dict]:
    """Closed-loop load for ``--minutes`` in ``--window`` s windows, the service's RSS after each."""
    from benchmarks.loadgen import run_loadtest

    rows, total_s = [], args.minutes * 60.0
    start = time.monotonic()
    w = 0
    while time.monotonic() - start < total_s - 1:
        dur = min(args.window, total_s - (time.monotonic() - start))
        res = run_loadtest(url, texts, concurrency=args.concurrency, duration_s=dur, seed=args.seed + w, timeout_s=30)
        rss = ps.memory_info().rss
        row = {
            "window": w,
            "t_end_s": round(time.monotonic() - start, 1),
            "concurrency": args.concurrency,
            "requests": res.requests,
            "ok": res.ok,
            "errors": res.errors,
            "error_kinds": " ".join(f"{k}:{v}" for k, v in res.error_kinds.items()),
            "qps": res.qps,
            "p50_ms": res.p50_ms,
            "p99_ms": res.p99_ms,
            "max_ms": res.max_ms,
            "rss_mb": round(rss / 2**20, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        w += 1
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    import httpx
    import psutil

    from benchmarks.loadgen import run_loadtest
    from scalingnote.index.pipeline import read_search_queries

    with tempfile.TemporaryDirectory(prefix="sn-soak-") as d:
        root = Path(d)
        bert, beir, idx = tiny_served_index(root)
        texts = [q.text for q in read_search_queries(beir, None)]
        serve = ["serve", "--index", str(idx), "--query-tower", str(bert), "--port", "0", "--threads", "1"]
        cmd = [sys.executable, "-m", "scalingnote", *serve, "--log-level", "warning"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            url, ready_s = wait_ready(proc)
            ps = psutil.Process(proc.pid)
            # warm-up (allocations of the first batches)
            run_loadtest(url, texts, concurrency=4, duration_s=5, seed=args.seed)
            rss_start = ps.memory_info().rss
            rows = soak_windows(url, texts, ps, args)
            rss_end = ps.memory_info().rss
            h = httpx.get(url + "/healthz", trust_env=False, timeout=30)
            healthy = h.status_code == 200 and h.json().get("status") == "ok"
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()

    config = {
        "minutes": args.minutes,
        "window_s": args.window,
        "concurrency": args.concurrency,
        "seed": args.seed,
        "service": "scalingnote serve (separate process, --threads 1): tiny BERT query tower, IVF4,PQ8x4 + 2 "
        "semantic-ID layers over the tiny BEIR corpus",
        "load_generator": "closed loop, httpx.AsyncClient, 127.0.0.1 only, same machine",
        "requests": sum(r["requests"] for r in rows),
        "ok": sum(r["ok"] for r in rows),
        "errors": sum(r["errors"] for r in rows),
        "ready_s": ready_s,
        "rss_start_mb": round(rss_start / 2**20, 1),
        "rss_start_note": "sampled after the service reported ready and a 5 s warm-up at concurrency 4",
        "rss_end_mb": round(rss_end / 2**20, 1),
        "rss_growth_mb": round((rss_end - rss_start) / 2**20, 1),
        "rss_growth_pct": round(100.0 * (rss_end - rss_start) / rss_start, 2),
        "healthy_after": healthy,
        "service_exit_code": code,
        "note": "2 CPU cores shared with other jobs (the machine was shared): QPS/latency are noisy; "
        "requests/errors/RSS are the point.",
    }
    path = write_results("soak", rows, config)
    print(
        json.dumps({k: config[k] for k in ("requests", "errors", "rss_start_mb", "rss_end_mb", "healthy_after")}),
        f"wrote {path}",
        flush=True,
    )


if __name__ == "__main__":
    main()
