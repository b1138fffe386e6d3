"""Load test of the HTTP query service on SciFact with the zero-shot MiniLM tower.

The service (``scalingnote serve``, a separate process on a free loopback port) serves
all-MiniLM-L6-v2 (zero-shot, mean pooling — usable as a query tower for an index of
its own document embeddings) over SciFact's 5,183 documents, once with a compressed
index (``IVF64,PQ48x8``: 32x compression, nprobe 16, requests ask for an exact re-rank
of the top 100 — TMJ §6 post-processing) and once with ``Flat`` as the reference. For
each, the load generator (``scalingnote.serve.run_loadtest``, closed loop) runs at
concurrency 1, 8 and 32 for ~15 s each with the 300 SciFact test queries: QPS, p50 /
p95 / p99 latency, errors, and the mean micro-batch size the service encoded (from
``/metrics``). The compressed index is served twice: with the default ``--max-batch 64``
and with ``--max-batch 8`` (on this CPU MiniLM encodes most queries per second at
batches of ~8; larger padded batches are slower per query). This is the stress-test setting of TMJ §6.2 scaled down to one machine.

As a correctness check, every test query is also searched through ``/search/batch``
and the served run is scored (nDCG@10, R@100): it must match the offline numbers of
``benchmarks/index_scifact.py`` for the same index settings.

Caveat recorded in the results: the machine has 2 CPU cores shared with other
engineers, and the load generator runs on the same cores as the service, so absolute
numbers are noisy and lower than on a dedicated host.

Run: ``.venv/bin/python benchmarks/serve_loadtest.py`` (about 3-4 minutes; corpus
embeddings are reused from ``.cache/index_scifact/`` when present, else encoded there).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # OpenMP spin-waiting is very slow on a shared 2-core machine

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import REPO_ROOT, shared_data_dir, write_results  # noqa: E402

INDEXES = {
    # factory: (stored default nprobe, per-request extra fields)
    "IVF64,PQ48x8": (16, {"rerank": 100}),
    "Flat": (None, {}),
}


def corpus_embeddings(data: Path, cache: Path) -> Path:
    """MiniLM document embeddings of the SciFact corpus (shared with index_scifact.py)."""
    from scalingnote.data import load_corpus
    from scalingnote.index import encode_corpus, load_embeddings

    emb_dir = cache / "minilm-l6-corpus"
    corpus = load_corpus(data / "corpus.jsonl")
    try:
        emb = load_embeddings(emb_dir)
        if len(emb.ids) == len(corpus) and emb.tower.get("name") == "minilm-l6":
            return emb_dir
    except Exception:  # noqa: BLE001 - missing or incomplete: (re-)encode, resuming finished shards
        pass
    import torch

    from scalingnote.models import load_tower

    torch.set_num_threads(2)
    encode_corpus(load_tower("minilm-l6", role="document"), list(corpus.values()), emb_dir, shard_size=2000, batch_size=32)
    return emb_dir


def ensure_index(emb_dir: Path, out: Path, factory: str, nprobe: int | None, seed: int) -> Path:
    from scalingnote.index import build_index

    man = out / "manifest.json"
    if man.is_file():
        m = json.loads(man.read_text())
        if m.get("factory") == factory and m.get("embeddings_dir") == str(emb_dir.resolve()) and m.get("seed") == seed:
            return out
    return build_index(emb_dir, out, factory, seed=seed, nprobe=nprobe, semantic_ids_layers=6, codebook_size=256, overwrite=True, progress=False)


class ServiceProcess:
    """``scalingnote serve`` in a subprocess on a free loopback port."""

    def __init__(self, index: Path, data: Path, args, max_batch: int):
        cmd = [
            sys.executable, "-m", "scalingnote", "serve", "--index", str(index), "--query-tower", "minilm-l6",
            "--corpus", str(data), "--port", "0", "--max-batch", str(max_batch), "--max-wait-ms", str(args.max_wait_ms),
            "--log-level", "warning",
        ]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (http://\S+?) ", line)
        if not m:
            raise RuntimeError(f"service did not start: {line}{self.proc.stderr.read()}")
        self.url = m.group(1)

    def wait_ready(self, timeout: float = 300) -> dict:
        import httpx

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited: {self.proc.stderr.read()[-2000:]}")
            try:
                r = httpx.get(self.url + "/healthz", trust_env=False)
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("service not ready in time")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def served_quality(url: str, queries, qrels, extra: dict, k: int = 100) -> dict:
    """Search every test query through /search/batch and score the served run."""
    import httpx

    from scalingnote.evaluation import evaluate

    run = {}
    with httpx.Client(trust_env=False, timeout=300) as c:
        for s in range(0, len(queries), 64):
            chunk = queries[s : s + 64]
            r = c.post(url + "/search/batch", json={"queries": [q.text for q in chunk], "k": k, **extra})
            r.raise_for_status()
            for q, hits in zip(chunk, r.json()["results"], strict=True):
                run[q.id] = {h["doc_id"]: h["score"] for h in hits}
    return {k_: round(v, 4) for k_, v in evaluate(run, qrels, ["ndcg@10", "r@100"]).items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=shared_data_dir() / "scifact")
    ap.add_argument("--cache", type=Path, default=REPO_ROOT / ".cache" / "index_scifact")
    ap.add_argument(
        "--runs", nargs="*", default=["IVF64,PQ48x8@64", "IVF64,PQ48x8@8", "Flat@64"],
        help="Service configurations FACTORY@MAX_BATCH (factory one of: " + ", ".join(INDEXES) + ").",
    )
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32])
    ap.add_argument("--duration", type=float, default=15.0, help="Seconds per concurrency level.")
    ap.add_argument("--warmup", type=float, default=3.0, help="Unrecorded warm-up seconds per index.")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=2, help="torch threads in the service.")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    runs = []
    for spec in args.runs:
        factory, _, mb = spec.rpartition("@")
        if factory not in INDEXES or not mb.isdigit() or int(mb) < 1:
            ap.error(f"--runs: {spec!r} is not FACTORY@MAX_BATCH with FACTORY in {list(INDEXES)}")
        runs.append((factory, int(mb)))

    from scalingnote.index.pipeline import read_search_queries
    from scalingnote.data import load_qrels
    from scalingnote.serve import run_loadtest

    queries = read_search_queries(args.data, "test")
    qrels_all = load_qrels(args.data / "qrels" / "test.tsv")
    qrels = {q.id: qrels_all[q.id] for q in queries}
    texts = [q.text for q in queries]
    emb_dir = corpus_embeddings(args.data, args.cache)
    load_before = os.getloadavg()

    rows, health, qualities = [], {}, {}
    for factory, max_batch in runs:
        nprobe, extra = INDEXES[factory]
        idx = ensure_index(emb_dir, REPO_ROOT / ".cache" / "serve_loadtest" / factory.replace(",", "_"), factory, nprobe, args.seed)
        svc = ServiceProcess(idx, args.data, args, max_batch)
        try:
            t0 = time.perf_counter()
            h = svc.wait_ready()
            health[f"{factory}@{max_batch}"] = {"ready_s": round(time.perf_counter() - t0, 1), "index": h["index"], "query_tower": h["query_tower"], "titles": h["titles"]["n"]}
            if factory not in qualities:
                qualities[factory] = served_quality(svc.url, queries, qrels, extra)
            quality = qualities[factory]
            print(f"{factory}: served nDCG@10 {quality['ndcg@10']}, R@100 {quality['r@100']}", flush=True)
            run_loadtest(svc.url, texts, concurrency=8, duration_s=args.warmup, k=args.k, seed=args.seed, extra=extra)
            for c in args.concurrency:
                la = os.getloadavg()[0]
                res = run_loadtest(svc.url, texts, concurrency=c, duration_s=args.duration, k=args.k, seed=args.seed, extra=extra)
                row = {
                    "index": factory,
                    "max_batch": max_batch,
                    "concurrency": c,
                    "k": args.k,
                    "nprobe": nprobe,
                    "rerank": extra.get("rerank"),
                    "qps": res.qps,
                    "p50_ms": res.p50_ms,
                    "p95_ms": res.p95_ms,
                    "p99_ms": res.p99_ms,
                    "mean_ms": res.mean_ms,
                    "max_ms": res.max_ms,
                    "requests": res.requests,
                    "ok": res.ok,
                    "errors": res.errors,
                    "mean_encode_batch_size": res.mean_encode_batch_size,
                    "duration_s": res.duration_s,
                    "served_ndcg@10": quality["ndcg@10"],
                    "served_r@100": quality["r@100"],
                    "loadavg_1m_before": round(la, 2),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            code = svc.stop()
            if code != 0:
                print(f"warning: service exited with {code}: {svc.proc.stderr.read()[-2000:]}", file=sys.stderr)

    config = {
        "dataset": "scifact",
        "split": "test",
        "n_queries": len(texts),
        "n_documents": next(iter(health.values()), {}).get("index", {}).get("n_vectors"),
        "query_tower": "minilm-l6 (zero-shot all-MiniLM-L6-v2, mean pooling; same model encoded the documents)",
        "runs": args.runs,
        "indexes": {f: {"nprobe": INDEXES[f][0], "request_extra": INDEXES[f][1]} for f, _ in runs},
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "k": args.k,
        "max_wait_ms": args.max_wait_ms,
        "service_torch_threads": args.threads,
        "seed": args.seed,
        "load_generator": "closed loop, httpx.AsyncClient, same machine as the service",
        "service": health,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "note": (
            "2 CPU cores shared with other engineers working in parallel; the load generator and the service share "
            "those cores, so QPS/latency are noisy lower bounds for a dedicated host. Latency includes HTTP + JSON on "
            "loopback, queueing, micro-batch wait (max_wait_ms), query encoding (MiniLM, CPU fp32) and FAISS search."
        ),
    }
    path = write_results("serve_loadtest", rows, config)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
