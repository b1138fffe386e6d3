"""Part 3 of ``benchmarks/scaleout.py``: a real Milvus 2.3.5 server (embedded standalone, 127.0.0.1)
with IVF_PQ against FAISS IVFPQ with the same nlist / m / nbits / nprobe on the same embeddings,
HNSW and SCANN on the server, and the server's start-up and restart times."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks._scaleout_common import loadavg, search_inputs, timed_search

SERVER_PARTS = ("search-server", "milvus-server-startup", "milvus-server-vs-faiss")


def _synthetic_inputs(args, work: Path):
    """``--server-embeddings synthetic``: ``--syn-n`` unit vectors (384-d) from a 200-component
    Gaussian mixture and 300 perturbed copies as queries; each query's "relevant" document is the
    one it was drawn from."""
    rng = np.random.default_rng(0)
    d, n = 384, args.syn_n
    centers = rng.normal(size=(200, d))
    x = centers[rng.integers(0, 200, size=n)] + 0.6 * rng.normal(size=(n, d))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    src = rng.choice(n, size=300, replace=False)
    q = x[src] + 0.03 * rng.normal(size=(300, d))
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    ids = [f"s{i}" for i in range(n)]
    qids = [f"q{i}" for i in range(300)]
    qrels = {qid: {ids[j]: 1} for qid, j in zip(qids, src, strict=True)}
    tower = {"name": "synthetic", "compat_id": "synthetic", "fingerprint": "synthetic", "dim": d}
    return (x, ids, tower), q, qids, qrels, f"synthetic clustered ({n} x {d}, 200 clusters, seed 0)"


def _server_inputs(args, work: Path):
    """(embeddings, query vectors, query ids, qrels, label, encoding info) of ``--server-embeddings``."""
    from benchmarks.index_scifact import encode_cached
    from scalingnote.data import load_qrels

    if args.server_embeddings == "scifact":
        emb_dir, qvecs, qids, enc = search_inputs(args, encode_cached)
        qrels = load_qrels(args.data / "qrels" / "test.tsv")
        keep = [i for i, q in enumerate(qids) if q in qrels]
        qvecs, qids = np.ascontiguousarray(qvecs[keep]), [qids[i] for i in keep]
        return emb_dir, qvecs, qids, qrels, "scifact minilm-l6 (5183 x 384)", enc
    # seeded clustered unit vectors (when the SciFact encoding cannot be afforded)
    emb_dir, qvecs, qids, qrels, label = _synthetic_inputs(args, work)
    return emb_dir, qvecs, qids, qrels, label, {"query_tower": {"name": None}}


def _overlap(ref, got, k: int) -> float:
    return round(float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(ref, got, strict=True)])), 4)


@dataclass
class _ServerBench:
    """The embeddings and queries of part 3, the exact top 10 / top 100 and the rows measured so far."""

    emb_dir: object  # an embeddings directory, or (vectors, ids, tower info) for synthetic vectors
    qvecs: np.ndarray
    qids: list[str]
    qrels: dict
    label: str
    n: int = 0
    exact10: list = field(default_factory=list)
    exact100: list = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)

    def build(self, out: Path, factory: str) -> Path:  # no semantic IDs: they play no part in this comparison
        from scalingnote.index import build_index

        if isinstance(self.emb_dir, tuple):
            x, ids, tower = self.emb_dir
            return build_index(
                x, out, factory, doc_ids=ids, tower_info=tower, semantic_ids_layers=0, progress=False, overwrite=True
            )
        return build_index(self.emb_dir, out, factory, semantic_ids_layers=0, progress=False, overwrite=True)

    def row(self, engine, index_type, params, search, build_s, **extra) -> dict:
        from scalingnote.evaluation import evaluate

        t = timed_search(search, self.qvecs, 10)
        res = t.pop("res")
        r100 = search(self.qvecs, 100)
        m_ = evaluate(res.to_run(self.qids), self.qrels, ["ndcg@10", "recall@10"])
        r = {
            "part": "search-server",
            "engine": engine,
            "embeddings": self.label,
            "index_type": index_type,
            "params": json.dumps(params, sort_keys=True),
            "n_docs": self.n,
            "n_queries": len(self.qids),
            "recall@10_vs_flat": _overlap(self.exact10, res.doc_ids, 10),
            "r@100_vs_flat": _overlap(self.exact100, r100.doc_ids, 100),
            "ndcg@10": round(m_["ndcg@10"], 4),
            "recall@10": round(m_["recall@10"], 4),
            **t,
            "build_s": round(build_s, 2),
            "loadavg": loadavg(),
            **extra,
        }
        self.rows.append(r)
        print(r, flush=True)
        return r


def _milvus_rows(bench: _ServerBench, srv, fdir: Path, flat_dir: Path, sizes: tuple[int, int, int, int]) -> dict:
    """IVF_PQ (exported from the FAISS index: same nlist, m), HNSW and SCANN rows on the running server."""
    from scalingnote.index.milvus.milvus import MilvusSearcher
    from scalingnote.index.milvus.milvus_export import export_to_milvus

    nlist, m, nbits, nprobe = sizes
    man = export_to_milvus(fdir, srv.uri, "scifact_ivf_pq", index_type="IVF_PQ", progress=False)
    assert (man["index_params"]["nlist"], man["index_params"]["m"], man["index_params"]["nbits"]) == (
        nlist,
        m,
        nbits,
    ), man["index_params"]
    with MilvusSearcher.open(srv.uri, "scifact_ivf_pq") as ms:
        r_mil = bench.row(
            "milvus-server",
            "IVF_PQ",
            {**man["index_params"], "nprobe": nprobe},
            lambda q, kk: ms.search(q, kk, nprobe=nprobe),
            man["export_seconds"],
            insert_s=man.get("insert_seconds"),
            index_s=man.get("index_seconds"),
        )
    for itype, sp in (("HNSW", {"ef_search": 128}), ("SCANN", {"nprobe": nprobe})):
        man = export_to_milvus(flat_dir, srv.uri, f"scifact_{itype.lower()}", index_type=itype, progress=False)
        with MilvusSearcher.open(srv.uri, f"scifact_{itype.lower()}") as ms:
            p_ = {
                **man["index_params"],
                **({"ef": 128} if itype == "HNSW" else {"nprobe": nprobe, "reorder_k": 100}),
            }
            bench.row(
                "milvus-server",
                itype,
                p_,
                lambda q, kk, ms=ms, sp=sp: ms.search(q, kk, **sp),
                man["export_seconds"],
                insert_s=man.get("insert_seconds"),
                index_s=man.get("index_seconds"),
            )
    return r_mil


def _restart(srv, n: int) -> tuple[float, float, bool]:
    """Stop the server, start it again on the same data -> (stop s, restart s, collections persisted)."""
    from scalingnote.index.milvus.milvus import MilvusSearcher

    t0 = time.perf_counter()
    srv.stop()
    stop_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    srv.start()  # warm restart on the same data: the collections are still there
    warm_s = time.perf_counter() - t0
    with MilvusSearcher.open(srv.uri, "scifact_ivf_pq") as ms:
        persisted = len(ms) == n
    return stop_s, warm_s, persisted


def _gap_row(r_mil: dict, r_faiss: dict) -> dict:
    g10 = round(abs(r_mil["recall@10_vs_flat"] - r_faiss["recall@10_vs_flat"]), 4)
    g100 = round(abs(r_mil["r@100_vs_flat"] - r_faiss["r@100_vs_flat"]), 4)
    return {
        "part": "milvus-server-vs-faiss",
        "engine": "milvus-server",
        "index_type": "IVF_PQ",
        "recall@10_gap": g10,
        "r@100_gap": g100,
        "target_max_gap": 0.02,
        "target_met": bool(g10 <= 0.02 and g100 <= 0.02),
        "qps_single_milvus": r_mil["qps_single"],
        "qps_single_faiss": r_faiss["qps_single"],
        "qps_batched_milvus": r_mil["qps_batched"],
        "qps_batched_faiss": r_faiss["qps_batched"],
    }


def bench_milvus_server(args, work: Path) -> tuple[list[dict], dict]:
    """A real Milvus 2.3.5 server (embedded standalone, 127.0.0.1) with IVF_PQ, against FAISS
    IVFPQ with the same nlist / m / nbits / nprobe on the same embeddings; HNSW and SCANN too."""
    import faiss

    from scalingnote.index import DenseIndex
    from scalingnote.index.milvus.milvus_export import default_index_params
    from scalingnote.index.milvus.milvus_server import EmbeddedMilvus, _cache_root

    faiss.omp_set_num_threads(args.threads)
    emb_dir, qvecs, qids, qrels, label, enc = _server_inputs(args, work)
    bench = _ServerBench(emb_dir, qvecs, qids, qrels, label)

    flat_dir = bench.build(work / "server-faiss-Flat", "Flat")
    flat = DenseIndex.open(flat_dir)
    n, d = len(flat), flat.dim
    bench.n = n
    # the sizes Milvus would pick: nlist ~ 4 sqrt(n) (<= n/39), m = d/8, 8 bits
    ivfpq = default_index_params("IVF_PQ", n, d)
    nlist, m, nbits, nprobe = ivfpq["nlist"], ivfpq["m"], ivfpq["nbits"], args.nprobe
    bench.exact10, bench.exact100 = flat.search(qvecs, 10).doc_ids, flat.search(qvecs, 100).doc_ids

    # FAISS IVFPQ, same sizes (by_residual ADC, 8-bit codes: the IVF_PQ of Milvus' knowhere)
    t0 = time.perf_counter()
    fdir = bench.build(work / "server-faiss-ivfpq", f"IVF{nlist},PQ{m}")
    fi = DenseIndex.open(fdir)
    r_faiss = bench.row(
        "faiss",
        "IVFPQ",
        {"nlist": nlist, "m": m, "nbits": nbits, "nprobe": nprobe},
        lambda q, kk: fi.search(q, kk, nprobe=nprobe),
        time.perf_counter() - t0,
    )

    cached = (_cache_root() / "milvus-2.3.5" / "bin" / ".complete").exists()
    srv = EmbeddedMilvus(work / "milvus-data")
    t0 = time.perf_counter()
    srv.start()
    cold_s = time.perf_counter() - t0
    try:
        r_mil = _milvus_rows(bench, srv, fdir, flat_dir, (nlist, m, nbits, nprobe))
        stop_s, warm_s, persisted = _restart(srv, n)
    finally:
        srv.stop()
    rows = bench.rows
    rows.append(
        {
            "part": "milvus-server-startup",
            "engine": "milvus-server",
            "startup_s": round(cold_s, 2),
            "binaries_cached_before": cached,
            "restart_s": round(warm_s, 2),
            "stop_s": round(stop_s, 2),
            "data_persisted_across_restart": persisted,
            "loadavg": loadavg(),
        }
    )
    print(rows[-1], flush=True)
    rows.append(_gap_row(r_mil, r_faiss))
    print(rows[-1], flush=True)
    info = {
        "search_embeddings": label,
        "query_tower": enc.get("query_tower", {}).get("name"),
        "nlist": nlist,
        "m": m,
        "nbits": nbits,
        "nprobe": nprobe,
    }
    return rows, info
