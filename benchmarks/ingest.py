"""The live index (issue 29, ScalingNote §3.5) on SciFact: ingest throughput, search under
ingest, recall drift, and crash safety of the service.

Set-up: a seeded half of SciFact's corpus (``--base`` documents) is the original corpus; the
next ``--new`` documents are held back as the "new" ones. The quick start's document tower
(``minilm-l6``, zero-shot, mean pooling) encodes both (cached under ``.cache/ingest``); the base
index is the quick start's IVFPQ (:func:`scalingnote.quickstart.default_factory`, 6 semantic-ID
layers, nprobe 16) with titles, snippets and BM25.

Phases (rows ``phase``):

* ``drift``: a :class:`~scalingnote.live.LiveIndex` over the base index takes +10/50/100% new
  documents (stored vectors, the codebooks stay those of the base); recall@10 of its IVFPQ
  against exact search over all live vectors, on SciFact's 300 test queries, next to the same
  documents after ``rebuild`` (quantiser, PQ and semantic-ID codebooks retrained), and the
  service's sampled estimate (document vectors as queries);
* ``ingest``: ``scalingnote serve`` (own process, ``--threads 2``) takes documents through
  ``POST /documents``, the document tower encoding them: single-document requests and batches of 64;
* ``search``: QPS / p99 of 8 closed-loop clients for ``--load-s`` s, idle and while a client
  streams batches of 64 new documents (target: >= 70% of idle QPS, 0 errors);
* ``chaos``: ``--kills`` cycles of: start the service, stream batches of 1-16 new documents
  (each carries a unique marker word), SIGKILL at a random moment, restart; then every
  acknowledged document must be found by BM25 (its marker: exactly that document, once) and by
  dense search (its own text as the query, every IVF list probed, exact re-rank of 200; found
  with the default 16 probes is reported beside it), no hit may be duplicated or lack its title,
  and the batch in flight at the kill must be entirely present or entirely absent.

Run: ``flock /tmp/sn-heavy.lock nice -n 10 .venv/bin/python -m benchmarks.ingest`` (~20 min on 2 cores,
the first run encodes 3,000 documents).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks._common import REPO_ROOT, ServeProcess, loadavg, shared_data_dir, write_results

TOKEN = "ingest-benchmark-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


# --------------------------------------------------------------------------- data


def prepare(cache: Path, n_base: int, n_new: int, seed: int):
    """Base / new documents (seeded split of SciFact), their MiniLM embeddings (cached), the
    test queries and their embeddings."""
    from scalingnote.data import load_beir, write_corpus
    from scalingnote.index import load_embeddings
    from scalingnote.index.pipeline import encode_with_tower, load_tower_for

    ds = load_beir(shared_data_dir() / "scifact", "test")
    ids = sorted(ds.corpus)
    order = np.random.default_rng(seed).permutation(len(ids))
    chosen = [ds.corpus[ids[i]] for i in order[: n_base + n_new]]
    cache.mkdir(parents=True, exist_ok=True)
    sub = cache / f"corpus-{seed}-{n_base + n_new}.jsonl"
    if not sub.exists():
        write_corpus(sub, chosen)
    emb_dir = cache / f"emb-{seed}-{n_base + n_new}"
    encode_with_tower("minilm-l6", sub, emb_dir, shard_size=500, batch_size=32, progress=True)
    emb = load_embeddings(emb_dir)
    vec = dict(zip(emb.ids, np.concatenate([blk for _, blk in emb.iter_chunks(4096)]), strict=True))
    X = np.stack([vec[d.id] for d in chosen]).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    qids = sorted(ds.queries)
    qtexts = [ds.queries[q].text for q in qids]
    qpath = cache / "test-queries.npy"
    if not qpath.exists():
        q = load_tower_for("minilm-l6", "query").encode_queries(qtexts, batch_size=64, show_progress=False)
        np.save(qpath, np.asarray(q, dtype=np.float32))
    Q = np.load(qpath)
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    return chosen[:n_base], chosen[n_base:], X[:n_base], X[n_base:], dict(emb.tower), qtexts, Q


def build_base(out: Path, docs, X, tower: dict, seed: int) -> tuple[Path, str]:
    from scalingnote.index import build_index
    from scalingnote.quickstart import default_factory

    factory = default_factory(len(docs), X.shape[1])
    build_index(X, out, factory, doc_ids=[d.id for d in docs], tower_info=tower, seed=seed, semantic_ids_layers=6,
                codebook_size=min(256, max(2, len(docs) // 40)), nprobe=16, overwrite=True, progress=False, documents=docs)
    from scalingnote.sparse.bm25 import open_or_build_bm25

    open_or_build_bm25(out, docs, show_progress=False)
    return out, factory


# --------------------------------------------------------------------------- drift


def recall_vs_exact(index, X_live: np.ndarray, Q: np.ndarray, k: int = 10) -> float:
    """Recall@k of ``index`` against exact search over ``X_live`` (rows in the order of ``index.doc_ids``)."""
    exact = np.argsort(-(Q @ X_live.T), axis=1)[:, :k]
    live_ids = index.doc_ids
    want = [{live_ids[j] for j in row} for row in exact]
    got = index.search(Q, k).doc_ids
    return float(np.mean([len(w & set(g)) / k for w, g in zip(want, got, strict=True)]))


def phase_drift(base: Path, work: Path, new_docs, X_base, X_new, Q) -> list[dict]:
    from scalingnote.live import LiveIndex

    live_dir = work / "drift"
    shutil.copytree(base, live_dir)
    live = LiveIndex.open(live_dir)
    n0 = len(X_base)
    rows, done = [], 0
    rows.append({"phase": "drift", "added_pct": 0, "n_docs": n0, **_drift_point(live, work, X_base, Q, rebuild=False)})
    for pct in (10, 50, 100):
        upto = min(len(new_docs), n0 * pct // 100)
        for s in range(done, upto, 256):
            live.upsert(new_docs[s : min(upto, s + 256)], vectors=X_new[s : min(upto, s + 256)])
        done = upto
        X_live = np.concatenate([X_base, X_new[:upto]])
        rows.append({"phase": "drift", "added_pct": pct, "n_docs": n0 + upto, **_drift_point(live, work, X_live, Q, rebuild=True)})
        print(json.dumps(rows[-1]), flush=True)
    live.close()
    return rows


def _drift_point(live, work: Path, X_live, Q, rebuild: bool) -> dict:
    from scalingnote.live import LiveIndex

    out = {"recall@10_live": round(recall_vs_exact(live, X_live, Q), 4), "recall_estimate": round(live.recall_estimate(sample=256) or 0, 4),
           "added_share": live.stats()["added_share"]}
    if rebuild:
        copy = work / f"rebuilt-{len(X_live)}"  # the same documents, codebooks retrained (`index rebuild`)
        shutil.copytree(live.root, copy)
        rb = LiveIndex.open(copy)
        t0 = time.perf_counter()
        rb.rebuild()
        out["rebuild_s"] = round(time.perf_counter() - t0, 2)
        out["recall@10_rebuilt"] = round(recall_vs_exact(rb, X_live, Q), 4)
        rb.close()
        shutil.rmtree(copy)
    return out


# --------------------------------------------------------------------------- the service


def start_service(index: Path, log_level: str = "warning") -> ServeProcess:
    srv = ServeProcess(["--index", str(index), "--query-tower", "minilm-l6", "--threads", "2", "--log-level", log_level],
                       env={"SCALINGNOTE_ADMIN_TOKEN": TOKEN})
    srv.wait_ready(timeout=600)
    return srv


def post_docs(client, url: str, docs) -> bool:
    body = {"documents": [d.to_beir() for d in docs]}
    r = client.post(url + "/documents", json=body, headers=AUTH, timeout=300)
    if r.status_code != 200:
        raise RuntimeError(f"POST /documents: {r.status_code} {r.text[:300]}")
    return True


def phase_service(index: Path, new_docs, qtexts, load_s: float, seed: int) -> tuple[list[dict], int]:
    import httpx

    from benchmarks.loadgen import run_loadtest

    rows, used = [], 0
    srv = start_service(index)
    try:
        with httpx.Client(trust_env=False) as c:
            post_docs(c, srv.url, new_docs[:1])  # warm-up: loads the document tower
            used = 1
            for label, size, n_req in (("single", 1, 32), ("batch64", 64, 4)):
                t0 = time.perf_counter()
                for _ in range(n_req):
                    post_docs(c, srv.url, new_docs[used : used + size])
                    used += size
                secs = time.perf_counter() - t0
                rows.append({"phase": "ingest", "mode": label, "docs": size * n_req, "seconds": round(secs, 2), "docs_per_s": round(size * n_req / secs, 2)})
                print(json.dumps(rows[-1]), flush=True)
        run_loadtest(srv.url, qtexts, concurrency=4, duration_s=3, seed=seed)  # warm-up
        idle = run_loadtest(srv.url, qtexts, concurrency=8, duration_s=load_s, seed=seed)
        stop, ingested = threading.Event(), {"n": 0, "errors": 0, "s": 0.0}

        def stream(start: int) -> None:
            i = start
            t0 = time.perf_counter()
            with httpx.Client(trust_env=False) as c2:
                while not stop.is_set() and i + 64 <= len(new_docs):
                    try:
                        post_docs(c2, srv.url, new_docs[i : i + 64])
                        ingested["n"] += 64
                    except (RuntimeError, httpx.HTTPError):
                        ingested["errors"] += 1
                    i += 64
            ingested["s"] = time.perf_counter() - t0

        th = threading.Thread(target=stream, args=(used,))
        th.start()
        time.sleep(1.0)  # the stream is running when the clients start
        busy = run_loadtest(srv.url, qtexts, concurrency=8, duration_s=load_s, seed=seed + 1)
        stop.set()
        th.join()
        used += ingested["n"] + 64 * ingested["errors"]
        for label, res in (("idle", idle), ("ingesting", busy)):
            rows.append({"phase": "search", "mode": label, "concurrency": 8, "requests": res.requests, "errors": res.errors,
                         "qps": res.qps, "p50_ms": res.p50_ms, "p99_ms": res.p99_ms})
        rows[-1].update({"qps_vs_idle": round(busy.qps / idle.qps, 3) if idle.qps else None, "docs_ingested": ingested["n"],
                         "ingest_errors": ingested["errors"], "ingest_docs_per_s": round(ingested["n"] / ingested["s"], 2) if ingested["s"] else None})
        print(json.dumps(rows[-2:]), flush=True)
    finally:
        srv.stop()
    return rows, used


# --------------------------------------------------------------------------- chaos


def _marked(doc, cycle: int, j: int):
    from scalingnote.data import Document

    mark = f"chaosmark{cycle:02d}x{j:04d}"
    return Document(f"chaos-{cycle:02d}-{j:04d}", doc.title or mark, doc.topic, f"{doc.content} {mark}"), mark


def _present(c, url: str, doc, mark: str, nlist: int) -> tuple[bool, bool, bool, str]:
    """(found by BM25 marker, found by dense with every IVF list probed, found by dense with the
    index's default probes, problem or ''). Dense: the document's own text as the query, top-100
    after an exact re-rank of 200 candidates; the all-lists search tells whether the document is
    in the dense index at all, the default one whether IVF probing also reaches it."""
    r = c.post(url + "/search", json={"query": mark, "k": 10, "mode": "bm25"}, timeout=120).json()["results"]
    ids = [h["doc_id"] for h in r]
    bm = ids == [doc.id]
    if ids and not bm:
        return False, False, False, f"bm25 {mark}: {ids}"
    q = f"{doc.title} {doc.content}"[:900]
    found = []
    for probes in (None, nlist):
        body = {"query": q, "k": 100, "mode": "dense", "rerank": 200, **({"nprobe": probes} if probes else {})}
        d = c.post(url + "/search", json=body, timeout=120).json()["results"]
        dids = [h["doc_id"] for h in d]
        if len(dids) != len(set(dids)):
            return bm, False, False, f"duplicated hits for {doc.id}"
        hit = next((h for h in d if h["doc_id"] == doc.id), None)
        if hit is not None and hit["title"] != doc.title:
            return bm, True, True, f"half-added {doc.id}: title {hit['title']!r}"
        found.append(hit is not None)
    return bm, found[1], found[0], ""


def chaos_cycle(srv: ServeProcess, index: Path, pool, cycle: int, rng: random.Random, start: int) -> tuple[dict, int, ServeProcess]:
    """Stream into the running ``srv``, SIGKILL it at a random moment, restart, check; returns the
    row, the next pool position and the restarted service (the next cycle's)."""
    import httpx

    acked, inflight = [], {"batch": []}
    stop = threading.Event()
    with httpx.Client(trust_env=False) as c:  # the document tower is loaded before the clock starts
        first = [_marked(pool[start], cycle, 0)]
        post_docs(c, srv.url, [first[0][0]])
        acked.extend(first)

    def stream() -> None:
        i = start + 1
        with httpx.Client(trust_env=False) as c:
            while not stop.is_set() and i < len(pool):
                n = rng.randint(1, 16)
                batch = [_marked(d, cycle, i - start + j) for j, d in enumerate(pool[i : i + n])]
                inflight["batch"] = batch
                try:
                    post_docs(c, srv.url, [b[0] for b in batch])
                except (RuntimeError, httpx.HTTPError):
                    return
                acked.extend(batch)
                inflight["batch"] = []
                i += n

    th = threading.Thread(target=stream, daemon=True)
    th.start()
    time.sleep(rng.uniform(0.2, 6.0))
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()
    stop.set()
    th.join(30)
    lost = list(inflight["batch"])
    srv = start_service(index)
    nlist = int(httpx.get(srv.url + "/healthz", trust_env=False).json()["index"]["nlist"] or 1)
    problems, n_bm, n_dense, n_default, present = [], 0, 0, 0, 0
    with httpx.Client(trust_env=False) as c:
        for doc, mark in acked:
            bm, de, de_default, why = _present(c, srv.url, doc, mark, nlist)
            n_bm += bm
            n_dense += de
            n_default += de_default
            if why or not (bm and de):
                problems.append(why or f"{doc.id}: bm25={bm} dense={de}")
        present = sum(_present(c, srv.url, d, m, nlist)[0] for d, m in lost)
        if present not in (0, len(lost)):
            problems.append(f"in-flight batch half applied: {present}/{len(lost)}")
    row = {"phase": "chaos", "cycle": cycle, "acked": len(acked), "bm25_found": n_bm, "dense_found": n_dense,
           "dense_found_default_nprobe": n_default,           "inflight_docs": len(lost), "inflight_present": present, "ok": not problems, "problems": "; ".join(problems[:3])}
    print(json.dumps(row), flush=True)
    return row, start + len(acked) + len(lost), srv


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=int, default=1500, help="Documents of the original index.")
    ap.add_argument("--new", type=int, default=1500, help="Held-back documents (the +100%% point needs --base of them).")
    ap.add_argument("--load-s", type=float, default=20.0, help="Seconds per load-test phase.")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=REPO_ROOT / ".cache" / "ingest")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    load0, t_start = os.getloadavg(), time.perf_counter()
    base_docs, new_docs, X_base, X_new, tower, qtexts, Q = prepare(args.cache, args.base, args.new, args.seed)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="sn-ingest-") as d:
        work = Path(d)
        base, factory = build_base(work / "base", base_docs, X_base, tower, args.seed)
        rows += phase_drift(base, work, new_docs, X_base, X_new, Q)
        served = work / "served"
        shutil.copytree(base, served)
        svc_rows, used = phase_service(served, new_docs, qtexts, args.load_s, args.seed)
        rows += svc_rows
        rng, pos = random.Random(args.seed), used
        chaos = []
        srv = start_service(served)
        try:
            for cycle in range(args.kills):
                row, pos, srv = chaos_cycle(srv, served, new_docs, cycle, rng, pos % max(1, len(new_docs) - 64))
                chaos.append(row)
        finally:
            srv.stop()
        rows += chaos
    passed = sum(r["ok"] for r in chaos)
    config = {
        "data": "scifact corpus, seeded split", "n_base": args.base, "n_new": args.new, "seed": args.seed, "factory": factory,
        "document_tower": "minilm-l6 (zero-shot, mean pooling, docs cut at 256 tokens)", "query_tower": "minilm-l6",
        "service": "scalingnote serve --threads 2 (own process); ingest thread: nice +10, 1 torch thread", "load_s": args.load_s,
        "kills": args.kills, "chaos_passed": f"{passed}/{args.kills}", "total_s": round(time.perf_counter() - t_start, 1), **loadavg(load0),
        "note": "2 CPU cores shared with other jobs: throughput and QPS are noisy; chaos and recall are the point",
    }
    path = write_results("ingest", rows, config)
    print(f"chaos {passed}/{args.kills}; wrote {path}", flush=True)


if __name__ == "__main__":
    main()
