"""Encode throughput of the tower backbones -> benchmarks/results/encode_throughput.json.

One row per model config: SmolLM2-135M (all 30 layers, and truncated to 4 layers) and
all-MiniLM-L6-v2, zero-shot towers (no projection), fp32 on CPU, ``--threads`` torch
threads (default 2). Queries and documents are SciFact test queries / corpus documents.

Measured per row: ``queries_per_s`` and ``docs_per_s`` (``encode_queries`` /
``encode_documents``, batched, after one warm-up batch; each measurement is time-boxed
to ``--budget-s`` seconds, so the throughput is items done / time spent),
``load_s_cached`` (``load_tower`` from the conversion cache / HF directory, in-process
after the first load so imports are excluded), ``gguf_convert_s`` (first GGUF ->
safetensors conversion into a fresh temporary cache), ``non_embedding_params``.

The machine's 2 cores are shared with other engineers' jobs, so numbers are noisy: the
1-minute load average before and after each row is recorded (``loadavg_*``).
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time

from benchmarks._common import shared_data_dir, write_results

CONFIGS = [
    # model, num_layers, docs to encode (at most), doc max length
    {"model": "smollm2-135m", "num_layers": None, "max_docs": 32, "max_doc_length": 512},
    {"model": "smollm2-135m", "num_layers": 4, "max_docs": 128, "max_doc_length": 512},
    {"model": "minilm-l6", "num_layers": None, "max_docs": 256, "max_doc_length": 256},
]


def _timed(fn, items: list, batch_size: int, budget_s: float) -> tuple[float, int, float]:
    """Run ``fn`` over ``items`` one batch at a time until done or out of budget -> (items/s, n, seconds)."""
    fn(items[:2])  # warm-up (allocations, kernel selection), not timed
    done = 0
    t0 = time.perf_counter()
    while done < len(items) and time.perf_counter() - t0 < budget_s:
        chunk = items[done : done + batch_size]
        fn(chunk)
        done += len(chunk)
    dt = time.perf_counter() - t0
    return done / dt, done, dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=35.0, help="time box per throughput measurement")
    ap.add_argument("--queries", type=int, default=128)
    ap.add_argument("--query-batch", type=int, default=32)
    ap.add_argument("--doc-batch", type=int, default=16)
    ap.add_argument("--skip-convert", action="store_true", help="do not time a fresh GGUF conversion")
    args = ap.parse_args()

    import torch

    from scalingnote.data import load_beir
    from scalingnote.models import convert_gguf, load_tower, packaged_model_path

    torch.set_num_threads(args.threads)
    ds = load_beir(shared_data_dir() / "scifact", "test")
    queries = [ds.queries[q].text for q in sorted(ds.queries)][: args.queries]
    docs = [ds.corpus[d] for d in sorted(ds.corpus)]

    convert_s = None
    gguf = packaged_model_path("smollm2-135m")
    if not args.skip_convert:
        with tempfile.TemporaryDirectory(prefix="sn-convert-") as tmp:
            t0 = time.perf_counter()
            convert_gguf(gguf, cache_dir=tmp)
            convert_s = round(time.perf_counter() - t0, 2)
        print(f"first GGUF conversion: {convert_s:.1f} s", flush=True)
    convert_gguf(gguf)  # make sure the default cache holds it (no-op when it does)

    rows = []
    for cfg in CONFIGS:
        name, layers = cfg["model"], cfg["num_layers"]
        load_before = os.getloadavg()[0]
        load_tower(name, "query", num_layers=layers, device="cpu", dtype="float32")  # imports, first touch
        t0 = time.perf_counter()
        qt = load_tower(name, "query", num_layers=layers, device="cpu", dtype="float32")
        load_s = time.perf_counter() - t0
        dt = load_tower(
            name, "document", num_layers=layers, device="cpu", dtype="float32", max_doc_length=cfg["max_doc_length"]
        )
        qps, nq, tq = _timed(
            functools.partial(qt.encode_queries, batch_size=args.query_batch, show_progress=False),
            queries,
            args.query_batch,
            args.budget_s,
        )
        sub = docs[: cfg["max_docs"]]
        dps, nd, td = _timed(
            functools.partial(dt.encode_documents, batch_size=args.doc_batch, show_progress=False),
            sub,
            args.doc_batch,
            args.budget_s,
        )
        doc_tokens = sum(len(e.input_ids) for e in dt.document_encodings(sub[:nd]))
        row = {
            "model": name,
            "num_layers": qt.config.num_layers,
            "hidden_size": qt.config.hidden_size,
            "non_embedding_params": qt.non_embedding_params,
            "dtype": "float32",
            "threads": args.threads,
            "queries_per_s": round(qps, 2),
            "queries_timed": nq,
            "docs_per_s": round(dps, 3),
            "docs_timed": nd,
            "doc_tokens_per_s": round(doc_tokens / td, 1),
            "doc_max_length": cfg["max_doc_length"],
            "doc_pooling": dt.config.pooling,
            "load_s_cached": round(load_s, 3),
            "gguf_convert_s": convert_s if name == "smollm2-135m" else None,
            "loadavg_before": round(load_before, 2),
            "loadavg_after": round(os.getloadavg()[0], 2),
        }
        print(row, flush=True)
        rows.append(row)
        del qt, dt

    config = {
        "dataset": "scifact test (queries sorted by id; corpus in id order)",
        "threads": args.threads,
        "budget_s": args.budget_s,
        "query_batch": args.query_batch,
        "doc_batch": args.doc_batch,
        "max_queries": args.queries,
        "query_max_length": 128,
        "towers": "zero-shot (no projection); LLM docs use the ScalingNote §3.2 prompt",
        "note": "2 CPU cores shared with other jobs: throughput is noisy; see loadavg_* per row",
    }
    print(write_results("encode_throughput", rows, config))


if __name__ == "__main__":
    main()
