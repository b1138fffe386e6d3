"""Scale-out engines on one machine -> benchmarks/results/scaleout.json.

Part 1, corpus encoding (all-MiniLM-L6-v2 zero-shot document tower, the first ``--docs``
SciFact documents, batch ``--batch-size``, shards of ``--shard-size``):

* ``in-process``: :func:`scalingnote.index.encode_corpus`, torch with ``--threads`` threads;
* ``ray``: :func:`scalingnote.index.ray.ray_encode.encode_corpus_ray` on a local Ray instance,
  ``--num-actors`` actors x ``--cpus-per-actor`` CPUs, one torch thread per actor.

``docs_per_s`` is documents / encoding time (Ray: from the first shard handed to Ray to the
last committed, i.e. including actor start-up and model loads, excluding ``ray.init``);
``wall_s`` is the whole call (Ray: including ``ray.init``). The Ray shards are compared with
the in-process ones (``max_abs_diff``, ``bit_identical``).

Part 2, search (SciFact test queries, 5183 MiniLM document embeddings, 384-d, read from
``benchmarks/index_scifact.py``'s cache ``.cache/index_scifact`` when complete, else encoded
once into ``.cache/scaleout``): FAISS Flat / HNSW32 against
Milvus Lite collections exported by :func:`scalingnote.index.milvus.milvus_export.export_to_milvus`
(FLAT, HNSW M=32 efConstruction=200, IVF_FLAT), searched through
:class:`scalingnote.index.milvus.milvus.MilvusSearcher` (gRPC to the in-process Milvus Lite
server). ``qps_batched``: all queries in one call (median of 3); ``qps_single`` /
``p50_ms`` / ``p99_ms``: one query per call. ``recall@10_vs_flat``: overlap of the top 10
with the exact FAISS Flat top 10; ``ndcg@10`` against the SciFact qrels.

Part 3, a real Milvus server (``milvus==2.3.5``, embedded standalone on 127.0.0.1,
:class:`scalingnote.index.milvus.milvus_server.EmbeddedMilvus`) on the same embeddings: FAISS IVFPQ
and Milvus IVF_PQ with the same nlist / m / nbits / nprobe (``recall@10_vs_flat`` and
``r@100_vs_flat`` against exact search, target: within 0.02 of FAISS), single-query and
batched QPS side by side, HNSW and SCANN on the server, and the server's start-up time.
``--server-only`` runs part 3 alone and keeps the other rows of the existing results file.

The machine's 2 cores are shared with other engineers' jobs: the 1-minute load average is
recorded per row (``loadavg``); timings are indicative only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from itertools import islice
from pathlib import Path

import numpy as np

from benchmarks._common import REPO_ROOT, report, shared_data_dir
from benchmarks._scaleout_common import loadavg, search_inputs, timed_search
from benchmarks._scaleout_server import SERVER_PARTS, bench_milvus_server

# --------------------------------------------------------------------------- part 1


def bench_encode(args, work: Path) -> list[dict]:
    import torch

    from scalingnote.data import iter_corpus, write_corpus
    from scalingnote.index import encode_corpus, load_embeddings
    from scalingnote.index.ray.ray_encode import encode_corpus_ray
    from scalingnote.models import load_tower

    corpus = work / "corpus.jsonl"
    docs = list(islice(iter_corpus(args.data / "corpus.jsonl"), args.docs))
    write_corpus(corpus, docs)
    rows = []

    torch.set_num_threads(args.threads)
    la = loadavg()
    t0 = time.perf_counter()
    tower = load_tower("minilm-l6", role="document")
    load_s = time.perf_counter() - t0
    res = encode_corpus(
        tower, corpus, work / "inproc", shard_size=args.shard_size, batch_size=args.batch_size, progress=False
    )
    wall = time.perf_counter() - t0
    rows.append(
        {
            "part": "encode",
            "engine": "in-process",
            "n_docs": res.n_docs,
            "shards": res.n_shards,
            "threads": args.threads,
            "num_actors": None,
            "cpus_per_actor": None,
            "docs_per_s": round(res.docs_per_s, 2),
            "encode_s": round(res.seconds, 1),
            "wall_s": round(wall, 1),
            "startup_s": round(load_s, 2),
            "max_abs_diff": None,
            "bit_identical": None,
            "loadavg": la,
            "loadavg_after": loadavg(),
        }
    )
    print(rows[-1], flush=True)
    del tower

    la = loadavg()
    t0 = time.perf_counter()
    res = encode_corpus_ray(
        "minilm-l6",
        corpus,
        work / "ray",
        shard_size=args.shard_size,
        batch_size=args.batch_size,
        num_actors=args.num_actors,
        cpus_per_actor=args.cpus_per_actor,
        progress=False,
    )
    wall = time.perf_counter() - t0
    a, b = load_embeddings(work / "inproc"), load_embeddings(work / "ray")
    if a.ids != b.ids:
        raise SystemExit("Ray and in-process encodings hold different document ids")
    diff = float(np.max(np.abs(np.asarray(a.vectors) - np.asarray(b.vectors))))
    eng = res.manifest["engine"]
    rows.append(
        {
            "part": "encode",
            "engine": "ray",
            "n_docs": res.n_docs,
            "shards": res.n_shards,
            "threads": eng["threads_per_actor"],
            "num_actors": args.num_actors,
            "cpus_per_actor": args.cpus_per_actor,
            "docs_per_s": round(res.docs_per_s, 2),
            "encode_s": round(res.seconds, 1),
            "wall_s": round(wall, 1),
            "startup_s": eng["startup_seconds"],
            "max_abs_diff": diff,
            "bit_identical": bool(np.array_equal(np.asarray(a.vectors), np.asarray(b.vectors))),
            "loadavg": la,
            "loadavg_after": loadavg(),
        }
    )
    print(rows[-1], flush=True)
    return rows


# --------------------------------------------------------------------------- part 2


def bench_search(args, work: Path) -> tuple[list[dict], dict]:
    import faiss

    from benchmarks.index_scifact import encode_cached
    from scalingnote.data import load_qrels
    from scalingnote.evaluation import evaluate
    from scalingnote.index import DenseIndex, build_index
    from scalingnote.index.milvus.milvus import MilvusSearcher
    from scalingnote.index.milvus.milvus_export import export_to_milvus

    faiss.omp_set_num_threads(args.threads)
    emb_dir, qvecs, qids, enc = search_inputs(args, encode_cached)
    qrels = load_qrels(args.data / "qrels" / "test.tsv")
    keep = [i for i, q in enumerate(qids) if q in qrels]
    qvecs, qids = np.ascontiguousarray(qvecs[keep]), [qids[i] for i in keep]
    k = 10

    rows = []
    flat_top: list[list[str]] | None = None

    def row(engine: str, index_type: str, params: dict, t: dict, build_s: float, n_docs: int) -> dict:
        nonlocal flat_top
        res = t.pop("res")
        if flat_top is None:
            flat_top = res.doc_ids
        rec = np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(flat_top, res.doc_ids, strict=True)])
        run = res.to_run(qids)
        m = evaluate(run, qrels, ["ndcg@10", "recall@10"])
        r = {
            "part": "search",
            "engine": engine,
            "index_type": index_type,
            "params": json.dumps(params, sort_keys=True),
            "n_docs": n_docs,
            "n_queries": len(qids),
            "recall@10_vs_flat": round(float(rec), 4),
            "ndcg@10": round(m["ndcg@10"], 4),
            "recall@10": round(m["recall@10"], 4),
            **t,
            "build_s": round(build_s, 2),
            "loadavg": loadavg(),
        }
        print(r, flush=True)
        return r

    # FAISS (in-process)
    for factory, params, ef in (("Flat", {}, None), ("HNSW32", {"M": 32, "efConstruction": 200}, 128)):
        t0 = time.perf_counter()
        out = build_index(
            emb_dir,
            work / f"faiss-{factory}",
            factory,
            semantic_ids_layers=6,
            ef_search=ef,
            progress=False,
            overwrite=True,
        )
        build_s = time.perf_counter() - t0
        idx = DenseIndex.open(out)
        if factory.startswith("HNSW"):
            # the same graph as the Milvus HNSW build: M=32, efConstruction=200 (the FAISS
            # factory's default efConstruction is 40); searched with efSearch=128 like Milvus' ef
            g = faiss.IndexHNSWFlat(idx.dim, 32, faiss.METRIC_INNER_PRODUCT)
            g.hnsw.efConstruction = 200
            t0 = time.perf_counter()
            g.add(np.ascontiguousarray(idx.vectors))
            build_s = time.perf_counter() - t0
            idx.index = g
            params = {**params, "ef": ef}
        t = timed_search(lambda q, kk, idx=idx: idx.search(q, kk), qvecs, k)
        rows.append(row("faiss", factory, params, t, build_s, len(idx)))
    flat_dir = work / "faiss-Flat"

    # Milvus Lite, exported from the FAISS Flat index (vectors, ids, semantic IDs)
    db = str(work / "milvus.db")
    for itype, params in (("FLAT", None), ("HNSW", None), ("IVF_FLAT", None)):
        name = f"scifact_{itype.lower()}"
        t0 = time.perf_counter()
        man = export_to_milvus(flat_dir, db, name, index_type=itype, index_params=params, progress=False)
        build_s = time.perf_counter() - t0
        with MilvusSearcher.open(db, name) as ms:
            t = timed_search(lambda q, kk, ms=ms: ms.search(q, kk), qvecs, k)
        p = dict(man["index_params"])
        p.update({"ef": man["search_defaults"]["ef_search"]} if "ef_search" in man["search_defaults"] else {})
        p.update({"nprobe": man["search_defaults"]["nprobe"]} if "nprobe" in man["search_defaults"] else {})
        rows.append(row("milvus-lite", itype, p, t, build_s, man["n_vectors"]))
    info = {"search_embeddings": str(emb_dir), "query_tower": enc.get("query_tower", {}).get("name")}
    return rows, info


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=shared_data_dir() / "scifact")
    ap.add_argument(
        "--cache",
        type=Path,
        default=REPO_ROOT / ".cache" / "index_scifact",
        help="index_scifact.py's embeddings cache (read only)",
    )
    ap.add_argument(
        "--own-cache",
        type=Path,
        default=REPO_ROOT / ".cache" / "scaleout",
        help="where to encode SciFact if that cache is incomplete",
    )
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--shard-size", type=int, default=250)
    ap.add_argument("--threads", type=int, default=2, help="torch / FAISS threads in-process")
    ap.add_argument("--num-actors", type=int, default=2)
    ap.add_argument("--cpus-per-actor", type=float, default=0.5)
    ap.add_argument("--skip-encode", action="store_true")
    ap.add_argument("--skip-search", action="store_true")
    ap.add_argument("--skip-server", action="store_true", help="skip part 3 (the Milvus 2.3.5 server)")
    ap.add_argument(
        "--server-only",
        action="store_true",
        help="run only part 3 and keep the other rows (and their config) of the existing results file",
    )
    ap.add_argument("--nprobe", type=int, default=16, help="part 3: nprobe of FAISS IVFPQ and Milvus IVF_PQ / SCANN")
    ap.add_argument(
        "--server-embeddings",
        choices=["scifact", "synthetic"],
        default="scifact",
        help="part 3: SciFact MiniLM embeddings (cached, else encoded) or seeded synthetic vectors",
    )
    ap.add_argument("--syn-n", type=int, default=20000, help="part 3 synthetic: number of vectors")
    args = ap.parse_args()
    if args.server_only:
        args.skip_encode = args.skip_search = True
    return args


def run_parts(args) -> tuple[list[dict], dict, dict]:
    """Parts 1-3 (those not skipped) in a temporary work directory -> rows, search info, server info."""
    work = Path(tempfile.mkdtemp(prefix="scaleout-"))
    rows: list[dict] = []
    info: dict = {}
    server_info: dict = {}
    try:
        if not args.skip_encode:
            rows += bench_encode(args, work)
        if not args.skip_search:
            r, info = bench_search(args, work)
            rows += r
        if not args.skip_server:
            r, server_info = bench_milvus_server(args, work)
            rows += r
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows, info, server_info


def run_config(args, info: dict, server_info: dict, total_s: float) -> dict:
    """The results file's config: the settings of each part and the package versions."""
    import pymilvus
    import ray

    config = {
        "dataset": "scifact",
        "encode": {
            "model": "minilm-l6 (all-MiniLM-L6-v2, zero-shot, mean pooling, docs cut at 256 tokens)",
            "docs": args.docs,
            "batch_size": args.batch_size,
            "shard_size": args.shard_size,
            "threads_in_process": args.threads,
            "num_actors": args.num_actors,
            "cpus_per_actor": args.cpus_per_actor,
            "ray_cluster": "local, 127.0.0.1",
        },
        "search": {"k": 10, "queries": "scifact test (judged)", "faiss_threads": args.threads, **info},
        "ray_version": ray.__version__,
        "pymilvus_version": pymilvus.__version__,
        "milvus_lite_version": __import__("importlib.metadata").metadata.version("milvus-lite"),
        "total_seconds": round(total_s, 1),
        "notes": (
            "2 CPU cores shared with other engineers' jobs (see loadavg per row): timings are indicative. "
            "Ray docs_per_s includes actor start-up and one model load per actor; startup_s is ray.init. "
            "Milvus Lite 3.2.2 is a pure-Python gRPC server in the same process (search pays gRPC + protobuf "
            "serialisation per call) and has no IVF_PQ, so its HNSW/IVF_FLAT stand in for the server's IVF_PQ."
        ),
    }
    if not args.skip_server:
        config["milvus_server"] = {
            "package": "milvus==2.3.5 (embedded standalone Milvus 2.3.5: own etcd, local storage; 127.0.0.1)",
            "pymilvus_version": pymilvus.__version__,
            **server_info,
            "notes": (
                "part 3: FAISS IVFPQ and Milvus IVF_PQ with the same nlist, m, nbits and nprobe on the same "
                "embeddings; "
                "recall@10_vs_flat / r@100_vs_flat: overlap of the top-10 / top-100 with exact search (FAISS Flat). "
                "qps_single: one query per call (Milvus: one gRPC round trip each); qps_batched: all queries in "
                "one call. "
                "startup_s: first start of this run, on an empty data directory, to healthy (includes unpacking "
                "~200 MB "
                "of server binaries when binaries_cached_before is false); restart_s: stop, then start again on "
                "the same data "
                "(3 collections), to healthy: the figure to plan a restart with. The machine's 2 cores are "
                "shared with other sessions' jobs: QPS and times are noisy."
            ),
        }
    return config


def keep_other_parts(rows: list[dict], config: dict) -> tuple[list[dict], dict]:
    """``--server-only``: the existing results file's rows and config of parts 1-2, with part 3 replaced."""
    old = json.loads((Path(__file__).resolve().parent / "results" / "scaleout.json").read_text(encoding="utf-8"))
    rows = [r for r in old["rows"] if r.get("part") not in SERVER_PARTS] + rows
    config = {
        **old["config"],
        "milvus_server": config["milvus_server"],
        "preserved_rows": f"parts encode/search kept from the run of {old['created']} (not re-run)",
    }
    return rows, config


def main() -> None:
    args = parse_args()
    t_start = time.perf_counter()
    rows, info, server_info = run_parts(args)
    config = run_config(args, info, server_info, time.perf_counter() - t_start)
    if args.server_only:
        rows, config = keep_other_parts(rows, config)
    report("scaleout", rows, config)


if __name__ == "__main__":
    main()
