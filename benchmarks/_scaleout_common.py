"""Pieces shared by the search parts of ``benchmarks/scaleout.py``: the load average recorded per
row, the timing of a search function (batched and one query per call) and the SciFact MiniLM
embeddings both search parts run on."""

from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np


def loadavg() -> float:
    """The machine's 1-minute load average (recorded per row: the cores are shared)."""
    return round(os.getloadavg()[0], 2)


def timed_search(search, qvecs: np.ndarray, k: int) -> dict:
    """``search(qvecs, k)`` batched (median of 3) and one query per call -> QPS, p50 / p99 and the batched result."""
    batched = []
    for _ in range(3):
        t0 = time.perf_counter()
        res = search(qvecs, k)
        batched.append(time.perf_counter() - t0)
    lat = []
    for i in range(len(qvecs)):
        t0 = time.perf_counter()
        search(qvecs[i : i + 1], k)
        lat.append(time.perf_counter() - t0)
    lat_ms = np.array(lat) * 1000
    return {
        "res": res,
        "qps_batched": round(len(qvecs) / statistics.median(batched), 1),
        "qps_single": round(len(qvecs) / float(np.sum(lat)), 1),
        "p50_ms": round(float(np.percentile(lat_ms, 50)), 3),
        "p99_ms": round(float(np.percentile(lat_ms, 99)), 3),
    }


def search_inputs(args, encode_cached):
    """SciFact MiniLM corpus + test-query embeddings: read from ``benchmarks/index_scifact.py``'s
    cache when it is complete (never written to: that benchmark may be running), else
    encoded once into this benchmark's own cache ``--own-cache`` (resumable)."""
    from scalingnote.errors import ScalingNoteError
    from scalingnote.index import load_embeddings

    emb = args.cache / "minilm-l6-corpus"
    qid_path, qvec_path = args.cache / "minilm-l6-test-queries.ids.json", args.cache / "minilm-l6-test-queries.npy"
    try:
        e = load_embeddings(emb)
        meta = json.loads(qid_path.read_text(encoding="utf-8"))
        qvecs = np.load(qvec_path)
        if len(e) == 5183 and len(meta["qids"]) == len(qvecs):
            return emb, qvecs, meta["qids"], {"query_tower": {"name": "minilm-l6"}, "cache": str(args.cache)}
    except (ScalingNoteError, OSError, ValueError, KeyError):
        pass
    print(f"{args.cache}: no complete cache; encoding into {args.own_cache}", flush=True)
    args.own_cache.mkdir(parents=True, exist_ok=True)
    emb_dir, qvecs, qids, enc = encode_cached(args.own_cache, args.data)
    enc["cache"] = str(args.own_cache)
    return emb_dir, qvecs, qids, enc
