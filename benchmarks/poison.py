"""Poisoned neighbours: do bad requests hurt the normal clients they are
micro-batched with, and does a legal batch starve them?

The service (``scalingnote serve`` in a subprocess, loopback) serves the real MiniLM query
tower (zero-shot all-MiniLM-L6-v2, the quick start's BERT) over an IVF-PQ index with
semantic IDs (the quick start's kind of index) of the synthetic note-search log's corpus,
opened live (``POST /documents``, a copy in a temporary directory: the cached index is never
changed). Normal clients: ``concurrency`` closed-loop workers (``benchmarks.loadgen.run_loadtest``)
with the test queries. Phases alternate, ``--rounds`` times each, ``--duration`` seconds each:

* ``clean``: the normal clients alone;
* ``poisoned``: the same, plus an attacker sending ``--bad-rate`` bad requests per second
  (open loop, paced), cycling through the probes: ``/search`` queries holding a lone surrogate
  (valid JSON ``\\ud800`` escapes: refused alone, without failing the micro-batch it shares),
  NUL-only and zero-width-only queries, a lone surrogate inside ``/search/batch``,
  invalid UTF-8; and the ``/documents`` probes (admin token sent): a lone surrogate in
  ``text`` / ``title`` / ``_id``, the raw bytes ``\\xed\\xa0\\x80``, 100,000 nested ``[``,
  ``text/plain``, a padded id (and ``DELETE`` of it), a batch with several bad documents;
* ``batch``: the normal clients plus one closed-loop client sending ``/search/batch`` requests
  of ``--batch-queries`` (256: the documented maximum, equal to the default ``max_queue``).

Before the ``batch`` phases, a control request shows ``/documents`` is live (a good document
added, re-sent = replaced, deleted). Reported per phase (summed over its rounds): QPS and error
count of the normal requests, the bad requests' status codes (per probe: every one must be its
expected 4xx), the batch requests' statuses, and the service's log lines. Targets: 0 errors
among normal requests with the attacker and beside the batches, QPS >= 90% of the clean QPS with
the attacker, every probe its 4xx, 0 server errors.

Run: ``python -m benchmarks.poison`` (about 5 minutes; the corpus embeddings are cached
under ``.cache/serve_loadtest/``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks._common import REPO_ROOT, ServeProcess, loadavg, report

FACTORY, NPROBE = "IVF16,PQ48x4", 8  # serve_loadtest.py's index for the synthetic corpus

ADMIN_TOKEN = "poison-benchmark-admin-token-0123456789"
_JSON = {"content-type": "application/json"}
_ADMIN = {**_JSON, "authorization": f"Bearer {ADMIN_TOKEN}"}

#: (name, method, path, body, headers, expected status)
PROBES = [
    ("search_surrogate", "POST", "/search", b'{"query": "vitamin \\ud800 deficiency", "k": 10}', _JSON, 422),
    ("search_lone_low_surrogate", "POST", "/search", b'{"query": "\\udfff", "k": 10}', _JSON, 422),
    ("search_inner_surrogate", "POST", "/search", b'{"query": "a\\ud800b", "k": 10}', _JSON, 422),
    ("search_nul_only", "POST", "/search", b'{"query": "\\u0000\\u0000", "k": 10}', _JSON, 422),
    ("search_zero_width_only", "POST", "/search", b'{"query": "\\u200b\\u200d\\ufeff", "k": 10}', _JSON, 422),
    ("batch_surrogate", "POST", "/search/batch", b'{"queries": ["fox", "bad \\udc80 query"], "k": 10}', _JSON, 422),
    ("search_invalid_utf8", "POST", "/search", b'{"query": "caf\xc3 \xff", "k": 10}', _JSON, 400),
    (
        "docs_surrogate_text",
        "POST",
        "/documents",
        b'{"documents":[{"_id":"s1","text":"bad \\ud800 text"}]}',
        _ADMIN,
        422,
    ),
    (
        "docs_surrogate_title",
        "POST",
        "/documents",
        b'{"documents":[{"_id":"s1","title":"t \\udfff","text":"fine"}]}',
        _ADMIN,
        422,
    ),
    ("docs_surrogate_id", "POST", "/documents", b'{"documents":[{"_id":"s\\ud800","text":"fine"}]}', _ADMIN, 422),
    (
        "docs_raw_surrogate_bytes",
        "POST",
        "/documents",
        b'{"documents":[{"_id":"s1","text":"bad \xed\xa0\x80 text"}]}',
        _ADMIN,
        400,
    ),
    ("docs_deep_json", "POST", "/documents", b"[" * 100_000, _ADMIN, 400),
    (
        "docs_text_plain",
        "POST",
        "/documents",
        b'{"documents":[{"_id":"tp","text":"plain"}]}',
        {**_ADMIN, "content-type": "text/plain"},
        415,
    ),
    ("docs_padded_id", "POST", "/documents", b'{"documents":[{"_id":" padded id ","text":"fine"}]}', _ADMIN, 422),
    ("docs_delete_padded_id", "DELETE", "/documents/%20padded%20id%20", b"", _ADMIN, 422),
    (
        "docs_many_bad",
        "POST",
        "/documents",
        b'{"documents":[{"_id":"g1","text":"good"},{"_id":3,"text":"x"},{"_id":"b2","title":5,"text":"\\ud800"},{"_id":"g1","text":"again"}]}',
        _ADMIN,
        422,
    ),
]
#: the fields the many-bad batch must name (document index, field)
MANY_BAD_FIELDS = {"documents.1._id", "documents.2.title", "documents.2.text", "documents.3._id"}


async def _attacker(
    base: str, rate: float, duration_s: float, statuses: dict[str, dict[str, int]], checks: dict[str, int]
) -> None:
    """``rate`` bad requests per second for ``duration_s`` (each in its own task, paced), cycling
    through :data:`PROBES`; ``statuses[probe][status]`` counts the answers."""
    import httpx

    async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=30) as c:

        async def one(name: str, method: str, path: str, body: bytes, headers: dict[str, str], want: int) -> None:
            try:
                r = await c.request(method, path, content=body, headers=headers)
                key = str(r.status_code)
                if name == "docs_many_bad" and r.status_code == 422:
                    named = {e.get("field") for e in r.json().get("errors", [])}
                    checks["many_bad_all_named"] += int(named == MANY_BAD_FIELDS)
            except httpx.HTTPError as e:
                key = type(e).__name__
            per = statuses.setdefault(name, {})
            per[key] = per.get(key, 0) + 1

        tasks, i, t0 = [], 0, time.perf_counter()
        while True:
            at = t0 + i / rate
            if at - t0 >= duration_s:
                break
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            tasks.append(asyncio.create_task(one(*PROBES[i % len(PROBES)])))
            i += 1
        await asyncio.gather(*tasks)


async def _batcher(
    base: str, texts: list[str], n: int, duration_s: float, k: int, out: dict[str, int], lat: list[float]
) -> None:
    """One closed-loop client sending ``/search/batch`` requests of ``n`` queries for ``duration_s``."""
    import httpx

    async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=120) as c:
        t0, i = time.perf_counter(), 0
        while time.perf_counter() - t0 < duration_s:
            qs = [texts[(i + j) % len(texts)] for j in range(n)]
            i += n
            t = time.perf_counter()
            try:
                r = await c.post("/search/batch", json={"queries": qs, "k": k, "nprobe": NPROBE})
                key = str(r.status_code)
                if r.status_code == 200:
                    lat.append(time.perf_counter() - t)
                else:
                    await asyncio.sleep(0.5)
            except httpx.HTTPError as e:
                key = type(e).__name__
            out[key] = out.get(key, 0) + 1


async def _phase(
    url: str, texts: list[str], args, phase: str, statuses: dict, checks: dict, batch_out: dict, batch_lat: list
) -> object:
    from benchmarks.loadgen import run_loadtest_async

    load = run_loadtest_async(
        url,
        texts,
        concurrency=args.concurrency,
        duration_s=args.duration,
        k=args.k,
        seed=args.seed,
        extra={"nprobe": NPROBE},
    )
    if phase == "clean":
        return await load
    if phase == "poisoned":
        side = _attacker(url, args.bad_rate, args.duration, statuses, checks)
    else:
        side = _batcher(url, texts, args.batch_queries, args.duration, args.k, batch_out, batch_lat)
    res, _ = await asyncio.gather(load, side)
    return res


def _control(url: str) -> dict[str, object]:
    """A good document added, re-sent (replaced) and deleted: ``/documents`` is live, so the
    probes' 4xx are their own, not a ``not_live`` refusal."""
    import httpx

    doc = {"documents": [{"_id": "poison-control", "title": "control", "text": "a control document"}]}
    a = httpx.post(url + "/documents", json=doc, headers=_ADMIN, trust_env=False, timeout=300)
    b = httpx.post(url + "/documents", json=doc, headers=_ADMIN, trust_env=False, timeout=300)
    d = httpx.delete(url + "/documents/poison-control", headers=_ADMIN, trust_env=False, timeout=300)
    status = [
        x.json().get("documents", [{}])[0].get("status") if x.status_code == 200 else x.status_code for x in (a, b)
    ]
    return {
        "upsert": status[0],
        "resend": status[1],
        "delete": d.status_code,
        "live": status == ["added", "replaced"] and d.status_code == 200,
    }


def _data(args) -> tuple[Path, Path]:
    from benchmarks.serve_loadtest import corpus_embeddings, ensure_index
    from scalingnote.data import SynthConfig, synthesize

    data = REPO_ROOT / ".cache" / "serve_loadtest" / f"synthetic-seed{args.seed}-{args.synthetic_docs}"
    if not (data / "qrels" / "test.tsv").is_file():
        synthesize(data, SynthConfig(seed=args.seed, num_docs=args.synthetic_docs, num_queries=1500))
    emb = corpus_embeddings(data, data.with_name(data.name + "-emb"))
    idx = ensure_index(
        emb, REPO_ROOT / ".cache" / "poison" / f"{FACTORY.replace(',', '_')}-{data.name}", FACTORY, NPROBE, args.seed
    )
    return data, idx


def _phase_row(phase: str, rnd, args, res, bad: int = 0, bad_statuses: str = "", batch: str = "") -> dict:
    return {
        "phase": phase,
        "round": rnd,
        "concurrency": args.concurrency,
        "bad_per_s": args.bad_rate if phase.startswith("poisoned") else 0.0,
        "batch_queries": args.batch_queries if phase.startswith("batch") else 0,
        "qps": res["qps"],
        "requests": res["requests"],
        "ok": res["ok"],
        "errors": res["errors"],
        "error_kinds": res["error_kinds"],
        "p50_ms": res["p50_ms"],
        "p99_ms": res["p99_ms"],
        "bad_requests": bad,
        "bad_statuses": bad_statuses,
        "batch_statuses": batch,
        "mean_encode_batch_size": res["mean_encode_batch_size"],
        "duration_s": res["duration_s"],
    }


def _kinds(d: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(d.items()))


def _run(url: str, texts: list[str], args) -> tuple[list[dict], dict]:
    """The phases, ``--rounds`` times; rows per phase and round, plus the totals."""
    totals = {
        p: {"requests": 0, "ok": 0, "errors": 0, "seconds": 0.0, "kinds": {}, "p99": []}
        for p in ("clean", "poisoned", "batch")
    }
    probes: dict[str, dict[str, int]] = {}
    checks = {"many_bad_all_named": 0}
    batch_out: dict[str, int] = {}
    batch_lat: list[float] = []
    rows = []
    for rnd in range(args.rounds):
        for phase in ("clean", "poisoned", "batch"):
            seen = {k: dict(v) for k, v in probes.items()}
            b_before = dict(batch_out)
            res = asyncio.run(_phase(url, texts, args, phase, probes, checks, batch_out, batch_lat)).to_dict()
            res["error_kinds"] = _kinds(res["error_kinds"])
            t = totals[phase]
            for key in ("requests", "ok", "errors"):
                t[key] += res[key]
            t["seconds"] += res["duration_s"]
            t["p99"].append(res["p99_ms"])
            bad = {}
            for name, per in probes.items():
                for k, v in per.items():
                    d = v - seen.get(name, {}).get(k, 0)
                    if d:
                        bad[k] = bad.get(k, 0) + d
            bdelta = {k: v - b_before.get(k, 0) for k, v in batch_out.items() if v - b_before.get(k, 0)}
            row = _phase_row(phase, rnd, args, res, sum(bad.values()), _kinds(bad), _kinds(bdelta))
            rows.append(row)
            print(json.dumps(row), flush=True)
    for phase, t in totals.items():
        res = {
            "qps": round(t["ok"] / t["seconds"], 2) if t["seconds"] else 0.0,
            "requests": t["requests"],
            "ok": t["ok"],
            "errors": t["errors"],
            "error_kinds": "",
            "p50_ms": None,
            "p99_ms": max((p for p in t["p99"] if p is not None), default=None),
            "mean_encode_batch_size": None,
            "duration_s": round(t["seconds"], 2),
        }
        all_bad = {}
        for per in probes.values():
            for k, v in per.items():
                all_bad[k] = all_bad.get(k, 0) + v
        rows.append(
            _phase_row(
                f"{phase}_total",
                None,
                args,
                res,
                sum(all_bad.values()) if phase == "poisoned" else 0,
                _kinds(all_bad) if phase == "poisoned" else "",
                _kinds(batch_out) if phase == "batch" else "",
            )
        )
    for name, method, path, _body, _h, want in PROBES:
        per = probes.get(name, {})
        rows.append(
            {
                "phase": "probe",
                "probe": name,
                "method": method,
                "path": path,
                "expected_status": want,
                "statuses": _kinds(per),
                "sent": sum(per.values()),
                "as_expected": sum(v for k, v in per.items() if k == str(want)),
                "server_errors": sum(v for k, v in per.items() if not k.isdigit() or int(k) >= 500),
            }
        )
    lat = sorted(batch_lat)
    extra = {
        "totals": totals,
        "checks": checks,
        "batch_out": batch_out,
        "batch_p50_s": round(lat[len(lat) // 2], 3) if lat else None,
        "batch_max_s": round(lat[-1], 3) if lat else None,
    }
    return rows, extra


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic-docs", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--bad-rate", type=float, default=5.0, help="Bad requests per second in the poisoned phases.")
    ap.add_argument(
        "--batch-queries",
        type=int,
        default=256,
        help="Queries per /search/batch request in the batch phases (256: the documented maximum).",
    )
    ap.add_argument("--duration", type=float, default=20.0, help="Seconds per phase.")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="clean / poisoned / batch phase triples (alternating: the machine is shared).",
    )
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def serve_and_attack(args, data: Path, idx: Path, texts: list[str]) -> tuple[list[dict], dict, dict, dict, int, str]:
    """Serve a live copy of the index, warm it up and run the phases -> (rows, extra, control
    documents, health, the service's exit code, its log tail)."""
    from benchmarks.loadgen import run_loadtest

    work = Path(tempfile.mkdtemp(prefix="poison-"))
    live_idx = work / idx.name
    shutil.copytree(idx, live_idx)  # the service opens it live (/documents): never the cached index
    index_args = ["--index", str(live_idx), "--query-tower", "minilm-l6", "--corpus", str(data)]
    batching = ["--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms)]
    svc = ServeProcess(
        [*index_args, *batching, "--threads", str(args.threads), "--log-level", "warning"],
        env={"SCALINGNOTE_ADMIN_TOKEN": ADMIN_TOKEN},
        stderr_tail=4000,
    )
    try:
        health = svc.wait_ready(timeout=1200)
        control = _control(svc.url)
        print(json.dumps({"control": control}), flush=True)
        run_loadtest(svc.url, texts, concurrency=args.concurrency, duration_s=args.warmup, k=args.k, seed=args.seed)
        rows, extra = _run(svc.url, texts, args)
    finally:
        code = svc.stop()
        log_tail = svc.proc.stderr.read()
        shutil.rmtree(work, ignore_errors=True)
    return rows, extra, control, health, code, log_tail


def judge(rows: list[dict], extra: dict, control: dict, log_lines: list[str]) -> dict:
    """The target: no error among normal requests, QPS >= 90% of clean with the attacker, every probe
    answered as expected, no server error, no unhandled-error log line, the control documents live."""
    totals = extra["totals"]
    by_phase = {r["phase"]: r for r in rows if r["phase"].endswith("_total")}
    clean_qps, pois_qps = by_phase["clean_total"]["qps"], by_phase["poisoned_total"]["qps"]
    probe_rows = [r for r in rows if r["phase"] == "probe"]
    ratio = round(pois_qps / clean_qps, 3) if clean_qps else None
    target = {
        "normal_errors_poisoned": totals["poisoned"]["errors"],
        "normal_errors_beside_batches": totals["batch"]["errors"],
        "qps_ratio_poisoned": ratio,
        "probes_sent": sum(r["sent"] for r in probe_rows),
        "probes_as_expected": sum(r["as_expected"] for r in probe_rows),
        "probe_server_errors": sum(r["server_errors"] for r in probe_rows),
        "many_bad_all_fields_named": extra["checks"]["many_bad_all_named"],
        "batch_statuses": _kinds(extra["batch_out"]),
        "unhandled_error_log_lines": sum(1 for ln in log_lines if "unhandled error" in ln or "Traceback" in ln),
        "documents_live": control["live"],
    }
    target["met"] = (
        target["normal_errors_poisoned"] == 0
        and target["normal_errors_beside_batches"] == 0
        and ratio is not None
        and ratio >= 0.9
        and target["probes_sent"] == target["probes_as_expected"] > 0
        and target["probe_server_errors"] == 0
        and target["many_bad_all_fields_named"] == next(r["sent"] for r in probe_rows if r["probe"] == "docs_many_bad")
        and target["unhandled_error_log_lines"] == 0
        and bool(control["live"])
    )
    return target


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    from scalingnote.index.pipeline import read_search_queries

    data, idx = _data(args)
    texts = [q.text for q in read_search_queries(data, "test")]
    load_before = os.getloadavg()
    rows, extra, control, health, code, log_tail = serve_and_attack(args, data, idx, texts)
    log_lines = [ln for ln in log_tail.splitlines() if ln.strip()]
    target = judge(rows, extra, control, log_lines)
    print(json.dumps(target), flush=True)
    report(
        "poison",
        rows,
        {
            "dataset": f"synthetic note-search log (SynthConfig seed={args.seed}, "
            f"num_docs={args.synthetic_docs}), test queries",
            "n_queries": len(texts),
            "n_documents": health["index"]["n_vectors"],
            "index": FACTORY,
            "nprobe": NPROBE,
            "query_tower": "minilm-l6 (zero-shot all-MiniLM-L6-v2; the same model encoded the documents)",
            "concurrency": args.concurrency,
            "bad_per_s": args.bad_rate,
            "batch_queries": args.batch_queries,
            "duration_s": args.duration,
            "rounds": args.rounds,
            "k": args.k,
            "max_batch": args.max_batch,
            "max_wait_ms": args.max_wait_ms,
            "service_queue": "scalingnote serve defaults: max_queue 256, max_batch_queries 256, batch_queue_share 0.5",
            "service_torch_threads": args.threads,
            "seed": args.seed,
            "probes": [
                {
                    "name": n,
                    "request": f"{m} {p} {b[:120].decode('latin-1')}",
                    "content_type": h.get("content-type"),
                    "expected": w,
                }
                for n, m, p, b, h, w in PROBES
            ],
            "control_documents": control,
            "batch_latency_p50_s": extra["batch_p50_s"],
            "batch_latency_max_s": extra["batch_max_s"],
            "target": "0 errors among normal requests with the attacker and beside 256-query batches, QPS >= "
            "90% of the clean QPS with "
            "the attacker, every probe answered its expected 4xx, 0 server errors, 0 unhandled-error log lines",
            "result": target,
            "service_exit_code": code,
            "service_log_lines": len(log_lines),
            "service_log_tail": log_lines[-5:],
            **loadavg(load_before),
            "note": "2 CPU cores shared with other jobs; the load generator, the attacker, the batch client and "
            "the service share them. "
            "Phases alternate clean/poisoned/batch so slow drifts in the machine's load hit all alike.",
        },
    )


if __name__ == "__main__":
    main()
