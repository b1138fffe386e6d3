"""Poisoned neighbours (issue 32): do a few bad requests hurt the normal clients they are
micro-batched with?

The service (``scalingnote serve`` in a subprocess, loopback) serves the real MiniLM query
tower (zero-shot all-MiniLM-L6-v2, the quick start's BERT) over an IVF-PQ index with
semantic IDs (the quick start's kind of index) of the synthetic note-search log's corpus.
Normal clients: ``concurrency`` closed-loop workers (``benchmarks.loadgen.run_loadtest``) with
the test queries. Phases alternate, ``--rounds`` times each, ``--duration`` seconds each:

* ``clean``: the normal clients alone;
* ``poisoned``: the same, plus an attacker sending ``--bad-rate`` bad requests per second
  (open loop, paced): queries holding a lone surrogate (valid JSON ``\\ud800`` escapes, the
  request that failed whole micro-batches before the fix), NUL-only and zero-width-only
  queries, a lone surrogate inside ``/search/batch``, invalid UTF-8 bytes.

Reported per phase (summed over its rounds): QPS and error count of the normal requests, the
bad requests' status codes, and the service's log lines. Target: 0 errors among normal
requests with the attacker, and QPS >= 90% of the clean QPS.

Run: ``python -m benchmarks.poison`` (about 4 minutes; the corpus embeddings are cached
under ``.cache/serve_loadtest/``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import asyncio
import json
import time
from pathlib import Path

from benchmarks._common import REPO_ROOT, ServeProcess, loadavg, report

FACTORY, NPROBE = "IVF16,PQ48x4", 8  # serve_loadtest.py's index for the synthetic corpus

BAD_BODIES = [
    ("/search", b'{"query": "vitamin \\ud800 deficiency", "k": 10}'),
    ("/search", b'{"query": "\\udfff", "k": 10}'),
    ("/search", b'{"query": "a\\ud800b", "k": 10}'),
    ("/search", b'{"query": "\\u0000\\u0000", "k": 10}'),
    ("/search", b'{"query": "\\u200b\\u200d\\ufeff", "k": 10}'),
    ("/search/batch", b'{"queries": ["fox", "bad \\udc80 query"], "k": 10}'),
    ("/search", b'{"query": "caf\xc3 \xff", "k": 10}'),
]


async def _attacker(base: str, rate: float, duration_s: float, statuses: dict[str, int]) -> None:
    """``rate`` bad requests per second for ``duration_s`` (each in its own task, paced)."""
    import httpx

    async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=30, headers={"content-type": "application/json"}) as c:

        async def one(path: str, body: bytes) -> None:
            try:
                r = await c.post(path, content=body)
                key = str(r.status_code)
            except httpx.HTTPError as e:
                key = type(e).__name__
            statuses[key] = statuses.get(key, 0) + 1

        tasks, i, t0 = [], 0, time.perf_counter()
        while True:
            at = t0 + i / rate
            if at - t0 >= duration_s:
                break
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            tasks.append(asyncio.create_task(one(*BAD_BODIES[i % len(BAD_BODIES)])))
            i += 1
        await asyncio.gather(*tasks)


async def _phase(url: str, texts: list[str], args, poisoned: bool) -> tuple[object, dict[str, int]]:
    from benchmarks.loadgen import run_loadtest_async

    statuses: dict[str, int] = {}
    load = run_loadtest_async(url, texts, concurrency=args.concurrency, duration_s=args.duration, k=args.k, seed=args.seed, extra={"nprobe": NPROBE})
    if not poisoned:
        return await load, statuses
    res, _ = await asyncio.gather(load, _attacker(url, args.bad_rate, args.duration, statuses))
    return res, statuses


def _data(args) -> tuple[Path, Path]:
    from benchmarks.serve_loadtest import corpus_embeddings, ensure_index
    from scalingnote.data import SynthConfig, synthesize

    data = REPO_ROOT / ".cache" / "serve_loadtest" / f"synthetic-seed{args.seed}-{args.synthetic_docs}"
    if not (data / "qrels" / "test.tsv").is_file():
        synthesize(data, SynthConfig(seed=args.seed, num_docs=args.synthetic_docs, num_queries=1500))
    emb = corpus_embeddings(data, data.with_name(data.name + "-emb"))
    idx = ensure_index(emb, REPO_ROOT / ".cache" / "poison" / f"{FACTORY.replace(',', '_')}-{data.name}", FACTORY, NPROBE, args.seed)
    return data, idx


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic-docs", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--bad-rate", type=float, default=5.0, help="Bad requests per second in the poisoned phases.")
    ap.add_argument("--duration", type=float, default=20.0, help="Seconds per phase.")
    ap.add_argument("--rounds", type=int, default=3, help="clean / poisoned phase pairs (alternating: the machine is shared).")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from scalingnote.index.pipeline import read_search_queries
    from benchmarks.loadgen import run_loadtest

    data, idx = _data(args)
    texts = [q.text for q in read_search_queries(data, "test")]
    load_before = os.getloadavg()
    svc = ServeProcess(["--index", str(idx), "--query-tower", "minilm-l6", "--corpus", str(data), "--max-batch", str(args.max_batch),
                        "--max-wait-ms", str(args.max_wait_ms), "--threads", str(args.threads), "--log-level", "warning"], stderr_tail=4000)
    totals = {p: {"requests": 0, "ok": 0, "errors": 0, "seconds": 0.0, "bad": {}, "p99": [], "batch": []} for p in ("clean", "poisoned")}
    rows = []
    try:
        health = svc.wait_ready(timeout=1200)
        run_loadtest(svc.url, texts, concurrency=args.concurrency, duration_s=args.warmup, k=args.k, seed=args.seed)
        for rnd in range(args.rounds):
            for phase in ("clean", "poisoned"):
                res, bad = asyncio.run(_phase(svc.url, texts, args, phase == "poisoned"))
                t = totals[phase]
                t["requests"] += res.requests
                t["ok"] += res.ok
                t["errors"] += res.errors
                t["seconds"] += res.duration_s
                t["p99"].append(res.p99_ms)
                t["batch"].append(res.mean_encode_batch_size)
                for k, v in bad.items():
                    t["bad"][k] = t["bad"].get(k, 0) + v
                row = {"phase": phase, "round": rnd, "concurrency": args.concurrency, "bad_per_s": args.bad_rate if phase == "poisoned" else 0.0,
                       "qps": res.qps, "requests": res.requests, "ok": res.ok, "errors": res.errors,
                       "error_kinds": " ".join(f"{k}:{v}" for k, v in res.error_kinds.items()), "p50_ms": res.p50_ms, "p99_ms": res.p99_ms,
                       "bad_requests": sum(bad.values()), "bad_statuses": " ".join(f"{k}:{v}" for k, v in sorted(bad.items())),
                       "mean_encode_batch_size": res.mean_encode_batch_size, "duration_s": res.duration_s}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        code = svc.stop()
        log_tail = svc.proc.stderr.read()
    log_lines = [ln for ln in log_tail.splitlines() if ln.strip()]
    for phase, t in totals.items():
        rows.append({"phase": f"{phase}_total", "round": None, "concurrency": args.concurrency,
                     "bad_per_s": args.bad_rate if phase == "poisoned" else 0.0, "qps": round(t["ok"] / t["seconds"], 2) if t["seconds"] else 0.0,
                     "requests": t["requests"], "ok": t["ok"], "errors": t["errors"], "error_kinds": "", "p50_ms": None,
                     "p99_ms": max((p for p in t["p99"] if p is not None), default=None),
                     "bad_requests": sum(t["bad"].values()), "bad_statuses": " ".join(f"{k}:{v}" for k, v in sorted(t["bad"].items())),
                     "mean_encode_batch_size": None, "duration_s": round(t["seconds"], 2)})
    clean_qps, pois_qps = rows[-2]["qps"], rows[-1]["qps"]
    bad_5xx = sum(v for k, v in totals["poisoned"]["bad"].items() if not k.isdigit() or int(k) >= 500)
    ratio = round(pois_qps / clean_qps, 3) if clean_qps else None
    target = {"normal_errors_poisoned": totals["poisoned"]["errors"], "qps_ratio": ratio,
              "met": totals["poisoned"]["errors"] == 0 and ratio is not None and ratio >= 0.9}
    print(json.dumps(target), flush=True)
    report("poison", rows, {
        "dataset": f"synthetic note-search log (SynthConfig seed={args.seed}, num_docs={args.synthetic_docs}), test queries",
        "n_queries": len(texts), "n_documents": health["index"]["n_vectors"], "index": FACTORY, "nprobe": NPROBE,
        "query_tower": "minilm-l6 (zero-shot all-MiniLM-L6-v2; the same model encoded the documents)",
        "concurrency": args.concurrency, "bad_per_s": args.bad_rate, "duration_s": args.duration, "rounds": args.rounds,
        "k": args.k, "max_batch": args.max_batch, "max_wait_ms": args.max_wait_ms, "service_torch_threads": args.threads, "seed": args.seed,
        "bad_requests": [f"{p} {b.decode('latin-1')}" for p, b in BAD_BODIES],
        "target": "0 errors among normal requests with the attacker, QPS >= 90% of the clean QPS",
        "result": target, "bad_5xx": bad_5xx,
        "service_exit_code": code, "service_log_lines": len(log_lines), "service_log_tail": log_lines[-5:],
        "before_fix": "issue 32: under 8 clients, 71 bad requests (5/s) made 220 of 5,415 normal requests fail (4.1%), ~20 log lines each",
        **loadavg(load_before),
        "note": "2 CPU cores shared with other jobs; the load generator, the attacker and the service share them. Phases alternate "
                "clean/poisoned so slow drifts in the machine's load hit both alike.",
    })


if __name__ == "__main__":
    main()
