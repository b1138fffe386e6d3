"""Deploy benchmark: one query tower served by eager PyTorch fp32, ONNX Runtime fp32 and
ONNX Runtime int8, on SciFact test queries against the full corpus.

Rows (one per tower x backend in torch_fp32 / onnx_fp32 / onnx_int8): ``query_qps_b1`` (one query
per call), ``query_qps_b32`` (32 queries per call), ``p50_ms`` / ``p99_ms`` of one query per
call, ``ndcg@10`` / ``r@100`` (exact search over the tower's document embeddings),
``max_cos_diff`` (largest 1 - cosine to the torch fp32 embedding over the test queries). The
backends are measured interleaved, round after round, in one process, so their *ratios* are
comparable even on a shared CPU. Then the HTTP service (``scalingnote serve``, Flat index) is
load-tested at concurrency 8 with ``--query-backend torch`` and ``onnx`` (the int8 export),
alternating, one row per backend (``backend`` = serve_torch / serve_onnx).

The int8 model keeps in fp32 the MatMuls its quantization hurts most, chosen on SciFact
*train* queries (validation), never on the test queries (``scalingnote.models.export``).

Towers: ``--query-tower DIR --doc-embeddings DIR`` (repeatable, paired; e.g. the best student of
the recipe benchmark and its teacher's document embeddings, written as an embeddings directory by
``scalingnote index encode --tower <stage1>/doc_tower --data ../shared/data/scifact --out DIR
--feature-cache runs/recipe/scifact/features``, which reads the recipe's cache). Default: all-MiniLM-L6-v2
zero-shot (mean pooling, the SPEC's reference row) on both sides, its corpus embeddings
encoded once into ``runs/export_bench/`` (gitignored, resumable; shard layout of
``benchmarks/index_scifact.py``'s cache, whose finished shards can be copied in).

Run: ``python -m benchmarks.export`` (about 10 minutes on 2 shared cores, of which the
first corpus encoding is most).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from benchmarks._common import REPO_ROOT, ServeProcess, loadavg, shared_data_dir, write_results

BACKENDS = ("torch_fp32", "onnx_fp32", "onnx_int8")


DEFAULT_DESC = "all-MiniLM-L6-v2 zero-shot (packaged minilm-l6), mean pooling, no head, on both towers"


def default_tower(runs: Path, data: Path, encode: bool = True) -> tuple[Path, Path, str]:
    """Zero-shot MiniLM on both sides (one compat id, rule 1); corpus embeddings cached, resumable."""
    from scalingnote.data import load_corpus
    from scalingnote.index import encode_corpus, load_embeddings
    from scalingnote.models import load_tower

    qdir = runs / "towers" / "minilm-l6-zeroshot" / "query"
    if not (qdir / "tower.json").is_file():
        load_tower("minilm-l6", role="query", device="cpu", dtype="float32").save(qdir)
    emb = runs / "emb" / "minilm-l6-zeroshot"
    corpus = load_corpus(data / "corpus.jsonl")
    try:
        e = load_embeddings(emb)
        if len(e.ids) == len(corpus):
            return qdir, emb, DEFAULT_DESC
    except Exception:  # noqa: BLE001 - missing or incomplete: (re-)encode, resuming finished shards
        pass
    if not encode:
        return qdir, emb, DEFAULT_DESC
    import torch

    torch.set_num_threads(2)
    # shard_size 2000: the same layout as benchmarks/index_scifact.py's cache, so its finished shards can be reused
    encode_corpus(
        load_tower("minilm-l6", role="document", device="cpu", dtype="float32"),
        list(corpus.values()),
        emb,
        shard_size=2000,
        batch_size=32,
    )
    return qdir, emb, DEFAULT_DESC


def ensure_onnx(qdir: Path, out: Path, validation: list[str], validation_name: str) -> Path:
    from scalingnote.models import load_tower
    from scalingnote.models.export import ONNX_META, export_onnx

    meta = out / ONNX_META
    tower = load_tower(qdir, device="cpu", dtype="float32")
    if meta.is_file():
        m = json.loads(meta.read_text())
        if m["tower"]["fingerprint"] == tower.fingerprint and "int8" in m.get("models", {}):
            return out
    t0 = time.perf_counter()
    export_onnx(tower, out, quantize="int8", validation_texts=validation, validation_name=validation_name)
    print(f"exported {qdir} -> {out} in {time.perf_counter() - t0:.0f}s", flush=True)
    return out


def timed_b1(encode, texts: list[str]) -> list[float]:
    lat = []
    for t in texts:
        t0 = time.perf_counter()
        encode([t])
        lat.append(time.perf_counter() - t0)
    return lat


def measure_tower(qdir: Path, emb_dir: Path, onnx_dir: Path, queries, qrels, args) -> tuple[list[dict], dict]:
    import torch

    from scalingnote.index import load_embeddings
    from scalingnote.models import load_tower
    from scalingnote.serve.query_backend import OnnxQueryTower

    torch.set_num_threads(args.threads)
    tower = load_tower(qdir, device="cpu", dtype="float32")
    emb = load_embeddings(emb_dir, require_complete=False)
    if emb.tower.get("compat_id") != tower.compat_id:
        raise SystemExit(
            f"{qdir}: compat id {tower.compat_id} does not match the document embeddings {emb_dir} "
            f"({emb.tower.get('compat_id')})"
        )
    encoders = {
        "torch_fp32": lambda xs, bs=64: tower.encode_queries(xs, batch_size=bs, show_progress=False),
    }
    onnx = {p: OnnxQueryTower(tower, onnx_dir, model=p, threads=args.threads) for p in ("fp32", "int8")}
    encoders["onnx_fp32"] = lambda xs, bs=64: onnx["fp32"].encode_queries(xs, batch_size=bs)
    encoders["onnx_int8"] = lambda xs, bs=64: onnx["int8"].encode_queries(xs, batch_size=bs)
    texts = [q.text for q in queries]
    qids = [q.id for q in queries]
    embs = {b: f(texts) for b, f in encoders.items()}
    for f in encoders.values():  # warm-up
        timed_b1(f, texts[:20])
    lat: dict[str, list[float]] = {b: [] for b in encoders}
    b32: dict[str, list[float]] = {b: [] for b in encoders}
    for r in range(args.rounds):  # interleaved: the CPU is shared, ratios within a round are fair
        for b, f in encoders.items():
            lat[b] += timed_b1(f, texts)
            t0 = time.perf_counter()
            for s in range(0, len(texts), 32):
                f(texts[s : s + 32], 32)
            b32[b].append(len(texts) / (time.perf_counter() - t0))
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{b} {len(texts) / sum(lat[b][-len(texts) :]):.0f} q/s" for b in encoders),
            flush=True,
        )
    ref = embs["torch_fp32"]
    rows = []
    for b in encoders:
        cos = (embs[b].astype(np.float64) * ref.astype(np.float64)).sum(1)
        la = np.asarray(lat[b]) * 1000
        rows.append(
            {
                "tower": args.tower_names[str(qdir)],
                "backend": b,
                "threads": args.threads,
                "query_qps_b1": round(len(la) / (la.sum() / 1000), 1),
                "query_qps_b32": round(float(np.median(b32[b])), 1),
                "p50_ms": round(float(np.percentile(la, 50)), 3),
                "p99_ms": round(float(np.percentile(la, 99)), 3),
                "ndcg@10": None,  # filled by score_rows once the corpus embeddings are complete
                "r@100": None,
                "max_cos_diff": float(f"{1.0 - cos.min():.3g}"),
                "min_cos": round(float(cos.min()), 6),
                "n_queries": len(texts),
                "n_documents": None,
            }
        )
    # thread sweep for the ONNX Runtime default (one query per call)
    sweep = {}
    for th in args.sweep_threads:
        for p in ("fp32", "int8"):
            enc = OnnxQueryTower(tower, onnx_dir, model=p, threads=th)
            timed_b1(enc.encode_queries, texts[:20])
            la = timed_b1(enc.encode_queries, texts)
            sweep[f"onnx_{p}_threads{th}_qps_b1"] = round(len(la) / sum(la), 1)
    np.savez(Path(args.runs) / f"query_emb_{qdir.parent.name}.npz", qids=np.asarray(qids), **embs)
    return rows, sweep


def score_rows(rows: list[dict], qdir: Path, emb_dir: Path, qrels, args) -> bool:
    """nDCG@10 / R@100 over the full corpus for each backend's query embeddings (False if the corpus is incomplete)."""
    from scalingnote.evaluation import evaluate
    from scalingnote.evaluation.dense import exact_search
    from scalingnote.index import load_embeddings

    try:
        emb = load_embeddings(emb_dir)
    except Exception:  # noqa: BLE001 - incomplete
        return False
    z = np.load(Path(args.runs) / f"query_emb_{qdir.parent.name}.npz")
    qids = [str(x) for x in z["qids"]]
    doc = np.asarray(emb.vectors, dtype=np.float32)
    for row in rows:
        if row.get("backend") in BACKENDS and row["tower"] == args.tower_names[str(qdir)]:
            m = evaluate(exact_search(z[row["backend"]], qids, doc, emb.ids, k=100), qrels, ["ndcg@10", "r@100"])
            row.update({"ndcg@10": round(m["ndcg@10"], 4), "r@100": round(m["r@100"], 4), "n_documents": len(emb.ids)})
    return True


def Service(index: Path, qdir: Path, backend: str, onnx_dir: Path, args) -> ServeProcess:
    """``scalingnote serve`` with the ``backend`` query encoder (torch or onnx)."""
    extra = ["--onnx-model", str(onnx_dir), "--onnx-threads", str(args.threads)] if backend == "onnx" else []
    return ServeProcess(
        [
            "--index",
            str(index),
            "--query-tower",
            str(qdir),
            "--log-level",
            "warning",
            "--threads",
            str(args.threads),
            "--max-batch",
            str(args.max_batch),
            "--query-backend",
            backend,
            *extra,
        ]
    )


def measure_serve(qdir: Path, emb_dir: Path, onnx_dir: Path, runs: Path, queries, qrels, args) -> list[dict]:
    import httpx

    from benchmarks.loadgen import run_loadtest
    from scalingnote.evaluation import evaluate
    from scalingnote.index import build_index

    idx = runs / "index" / (emb_dir.name + "-flat")
    if not (idx / "manifest.json").is_file():
        build_index(emb_dir, idx, "Flat", seed=0, overwrite=True, progress=False)
    texts = [q.text for q in queries]
    res: dict[str, list] = {"torch": [], "onnx": []}
    quality = {}
    for r in range(args.serve_rounds):
        for backend in ("torch", "onnx"):
            svc = Service(idx, qdir, backend, onnx_dir, args)
            try:
                svc.wait_ready(timeout=300)
                if backend not in quality:
                    run = {}
                    with httpx.Client(trust_env=False, timeout=300) as c:
                        for s in range(0, len(queries), 64):
                            chunk = queries[s : s + 64]
                            rr = c.post(svc.url + "/search/batch", json={"queries": [q.text for q in chunk], "k": 100})
                            rr.raise_for_status()
                            for q, hits in zip(chunk, rr.json()["results"], strict=True):
                                run[q.id] = {h["doc_id"]: h["score"] for h in hits}
                    quality[backend] = evaluate(run, qrels, ["ndcg@10", "r@100"])
                run_loadtest(
                    svc.url, texts, concurrency=args.concurrency, duration_s=3.0, k=10, seed=args.seed
                )  # warm-up
                out = run_loadtest(
                    svc.url, texts, concurrency=args.concurrency, duration_s=args.serve_duration, k=10, seed=args.seed
                )
                res[backend].append(out)
                print(
                    f"serve round {r + 1} {backend}: {out.qps:.1f} q/s, p50 {out.p50_ms:.1f} ms, p99 "
                    f"{out.p99_ms:.1f} ms, errors {out.errors}",
                    flush=True,
                )
            finally:
                svc.stop()
    rows = []
    for backend, outs in res.items():
        rows.append(
            {
                "tower": args.tower_names[str(qdir)],
                "backend": f"serve_{backend}" + ("_int8" if backend == "onnx" else "_fp32"),
                "threads": args.threads,
                "concurrency": args.concurrency,
                "qps": round(float(np.mean([o.qps for o in outs])), 1),
                "qps_rounds": " ".join(f"{o.qps:.1f}" for o in outs),
                "p50_ms": round(float(np.mean([o.p50_ms for o in outs])), 2),
                "p99_ms": round(float(np.mean([o.p99_ms for o in outs])), 2),
                "errors": int(sum(o.errors for o in outs)),
                "mean_encode_batch_size": round(float(np.mean([o.mean_encode_batch_size or 0 for o in outs])), 2),
                "served_ndcg@10": round(quality[backend]["ndcg@10"], 4),
                "served_r@100": round(quality[backend]["r@100"], 4),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=shared_data_dir() / "scifact")
    ap.add_argument(
        "--runs",
        type=Path,
        default=REPO_ROOT / "runs" / "export_bench",
        help="Cache of towers, embeddings, exports, indexes (gitignored).",
    )
    ap.add_argument(
        "--query-tower",
        type=Path,
        action="append",
        default=[],
        help="Saved query tower (repeatable, paired with --doc-embeddings).",
    )
    ap.add_argument(
        "--doc-embeddings",
        type=Path,
        action="append",
        default=[],
        help="Corpus embeddings dir of the matching document tower.",
    )
    ap.add_argument("--threads", type=int, default=2, help="torch / ONNX Runtime intra-op threads.")
    ap.add_argument("--sweep-threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--serve-rounds", type=int, default=2)
    ap.add_argument("--serve-duration", type=float, default=15.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument(
        "--max-batch",
        type=int,
        default=8,
        help="Service micro-batch size (serve_loadtest.json: MiniLM is fastest per query at ~8).",
    )
    ap.add_argument("--skip-serve", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if len(args.query_tower) != len(args.doc_embeddings):
        ap.error("--query-tower and --doc-embeddings must be given in pairs")

    from scalingnote.data import load_qrels
    from scalingnote.index.pipeline import read_search_queries

    towers: list[tuple[Path, Path, str]] = []
    if args.query_tower:
        towers = [(q, e, str(q)) for q, e in zip(args.query_tower, args.doc_embeddings, strict=True)]
    else:
        towers = [default_tower(args.runs, args.data, encode=False)]
    args.tower_names = {str(q): (q.parent.name + "/" + q.name) for q, _, _ in towers}
    queries = read_search_queries(args.data, "test")
    qrels_all = load_qrels(args.data / "qrels" / "test.tsv")
    qrels = {q.id: qrels_all[q.id] for q in queries}
    validation = [q.text for q in read_search_queries(args.data, "train")]
    load_before = os.getloadavg()
    rows, sweeps, exports = [], {}, {}
    status = {}

    def save() -> None:
        config = make_config(args, validation, exports, sweeps, load_before, status)
        print(f"wrote {write_results('export', rows, config)}", flush=True)

    # 1. query side (needs no corpus): export, int8 choice on validation queries, speed, cosine to torch fp32
    for qdir, emb_dir, desc in towers:
        onnx_dir = ensure_onnx(
            qdir,
            args.runs / "onnx" / args.tower_names[str(qdir)].replace("/", "_"),
            validation,
            f"{args.data.name} train split",
        )
        meta = json.loads((onnx_dir / "scalingnote_onnx.json").read_text())
        exports[args.tower_names[str(qdir)]] = {
            "description": desc,
            "onnx_dir": str(onnx_dir),
            "int8": meta.get("int8"),
            "check": meta.get("check"),
        }
        r, sweep = measure_tower(qdir, emb_dir, onnx_dir, queries, qrels, args)
        rows += r
        sweeps[args.tower_names[str(qdir)]] = sweep
        status[args.tower_names[str(qdir)]] = "query side measured; corpus embeddings pending"
        save()
    # 2. corpus side: complete the document embeddings (resumable), score, serve
    for qdir, emb_dir, _desc in towers:
        name = args.tower_names[str(qdir)]
        if not args.query_tower:
            default_tower(args.runs, args.data, encode=True)
        if not score_rows(rows, qdir, emb_dir, qrels, args):
            status[name] = "corpus embeddings incomplete: ndcg@10 / r@100 not measured"
            save()
            continue
        status[name] = "complete"
        save()
        if not args.skip_serve:
            onnx_dir = Path(exports[name]["onnx_dir"])
            rows += measure_serve(qdir, emb_dir, onnx_dir, args.runs, queries, qrels, args)
            save()
    for row in rows:
        print(json.dumps(row), flush=True)


def make_config(args, validation, exports, sweeps, load_before, status) -> dict:
    return {
        "dataset": args.data.name,
        "split": "test",
        "validation_for_int8": f"{args.data.name} train split queries ({len(validation)})",
        "status": status,
        "towers": exports,
        "threads": args.threads,
        "rounds": args.rounds,
        "ort_threads_sweep": sweeps,
        "serve": {
            "concurrency": args.concurrency,
            "duration_s": args.serve_duration,
            "rounds": args.serve_rounds,
            "max_batch": args.max_batch,
            "index": "Flat",
            "onnx_model": "int8 export",
            "load_generator": "closed loop, loopback, same machine",
        },
        "seed": args.seed,
        **loadavg(load_before),
        "note": (
            "2 CPU cores shared with other sessions working in parallel: absolute QPS and latencies are noisy; "
            "the backends "
            "were measured interleaved in one run, so compare their ratios. p50/p99 are of one query per call "
            "(tokenization "
            "included). max_cos_diff = max over test queries of 1 - cos(backend, torch fp32)."
        ),
    }


if __name__ == "__main__":
    main()
