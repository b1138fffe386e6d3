"""The service side of ``benchmarks/ingest.py``: starting the quick start's service with an admin
token, ``POST /documents`` with the cost split the service reports per batch, and the ingest and
search-under-ingest phases."""

from __future__ import annotations

import json
import statistics
import threading
import time

from benchmarks._common import ServeProcess

TOKEN = "ingest-benchmark-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def start_service(args: list[str], log_level: str = "warning") -> ServeProcess:
    srv = ServeProcess([*args, "--log-level", log_level], env={"SCALINGNOTE_ADMIN_TOKEN": TOKEN})
    srv.wait_ready(timeout=600)
    return srv


def post_docs(client, url: str, docs) -> dict:
    body = {"documents": [d.to_beir() for d in docs]}
    r = client.post(url + "/documents", json=body, headers=AUTH, timeout=300)
    if r.status_code != 200:
        raise RuntimeError(f"POST /documents: {r.status_code} {r.text[:300]}")
    return r.json()


def _split(timings: list[dict]) -> dict:
    """Mean milliseconds per batch of each ingest stage the service reports."""
    keys = sorted({k for t in timings for k in t})
    return {f"{k}_ms": round(statistics.fmean(t.get(k, 0.0) for t in timings), 2) for k in keys} if timings else {}


def phase_ingest(srv: ServeProcess, new_docs, used: int) -> tuple[list[dict], int]:
    """Ingest throughput through POST /documents, single documents and batches of 64, with the cost split."""
    import httpx

    rows = []
    with httpx.Client(trust_env=False) as c:
        post_docs(c, srv.url, new_docs[used : used + 1])  # warm-up: loads the document tower
        used += 1
        for label, size, n_req in (("single", 1, 32), ("batch64", 64, 4)):
            t0, timings = time.perf_counter(), []
            for _ in range(n_req):
                timings.append(post_docs(c, srv.url, new_docs[used : used + size]).get("timings_ms") or {})
                used += size
            secs = time.perf_counter() - t0
            rows.append(
                {
                    "phase": "ingest",
                    "mode": label,
                    "docs": size * n_req,
                    "seconds": round(secs, 2),
                    "docs_per_s": round(size * n_req / secs, 2),
                    **_split(timings),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows, used


def _stream(url: str, new_docs, start: int, stop: threading.Event, out: dict) -> None:
    """Batches of 64 new documents, back to back, until ``stop``."""
    import httpx

    i, t0 = start, time.perf_counter()
    with httpx.Client(trust_env=False) as c:
        while not stop.is_set() and i + 64 <= len(new_docs):
            try:
                out["timings"].append(post_docs(c, url, new_docs[i : i + 64]).get("timings_ms") or {})
                out["n"] += 64
            except (RuntimeError, httpx.HTTPError):
                out["errors"] += 1
            i += 64
    out["s"] = time.perf_counter() - t0
    out["end"] = i


def phase_search(
    srv: ServeProcess, new_docs, qtexts, used: int, rounds: int, load_s: float, seed: int
) -> tuple[list[dict], int]:
    """``rounds`` interleaved rounds of idle / ingesting search load (8 clients each); one row per
    round and mode, and a summary row with the median ratio."""
    from benchmarks.loadgen import run_loadtest

    run_loadtest(srv.url, qtexts, concurrency=4, duration_s=3, seed=seed)  # warm-up
    rows, ratios = [], []
    for r in range(rounds):
        idle = run_loadtest(srv.url, qtexts, concurrency=8, duration_s=load_s, seed=seed + 2 * r)
        stop, ing = threading.Event(), {"n": 0, "errors": 0, "s": 0.0, "timings": [], "end": used}
        th = threading.Thread(target=_stream, args=(srv.url, new_docs, used, stop, ing))
        th.start()
        time.sleep(1.0)  # the stream is running when the clients start
        busy = run_loadtest(srv.url, qtexts, concurrency=8, duration_s=load_s, seed=seed + 2 * r + 1)
        stop.set()
        th.join()
        used = ing["end"]
        ratio = round(busy.qps / idle.qps, 3) if idle.qps else None
        ratios.append(ratio)
        for label, res in (("idle", idle), ("ingesting", busy)):
            rows.append(
                {
                    "phase": "search",
                    "round": r,
                    "mode": label,
                    "concurrency": 8,
                    "requests": res.requests,
                    "errors": res.errors,
                    "qps": res.qps,
                    "p50_ms": res.p50_ms,
                    "p99_ms": res.p99_ms,
                }
            )
        rows[-1].update(
            {
                "qps_vs_idle": ratio,
                "docs_ingested": ing["n"],
                "ingest_errors": ing["errors"],
                "ingest_docs_per_s": round(ing["n"] / ing["s"], 2) if ing["s"] else None,
                **_split(ing["timings"]),
            }
        )
        print(json.dumps(rows[-2:]), flush=True)
        if used + 64 * 8 > len(new_docs):
            used = 0  # the pool is re-used: documents are replaced (upsert by id), the work is the same
    rows.append(
        {
            "phase": "search",
            "mode": "summary",
            "rounds": rounds,
            "qps_vs_idle_median": round(statistics.median(ratios), 3),
            "qps_vs_idle_min": min(ratios),
            "qps_vs_idle_max": max(ratios),
            "errors": sum(r["errors"] for r in rows if r.get("phase") == "search" and "errors" in r),
        }
    )
    print(json.dumps(rows[-1]), flush=True)
    return rows, used
