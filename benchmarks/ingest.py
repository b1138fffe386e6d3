"""The live index (ScalingNote §3.5) on the quick start's own output: ingest throughput, search
under ingest, recall drift and crash safety of the service the quick start prints.

Set-up: ``--run`` is a quick-start directory (``bash scripts/quickstart.sh`` writes
``runs/quickstart``). Its index (``index/ivfpq``, the teacher's fine-tuned document tower recorded in
the manifest, the tuned nprobe / re-rank and ``fusion.json``) is copied to a scratch directory, and
the service is started with the printed command (``scalingnote serve --index ... --query-tower
<the served student>``, ``--port 0``, the admin token from the environment). New documents are notes
the synthetic generator makes beyond the built corpus (the same seed and settings, more notes: the
first ``synth_docs`` are checked to be the built corpus), or ``--new-docs FILE`` for another run.

Phases (rows ``phase``):

* ``drift``: a :class:`~scalingnote.live.LiveIndex` over the copy takes +10/50/100% new documents
  (vectors from the recorded document tower); recall@10 of the index at its tuned search settings
  against exact search over all live vectors, on the run's test queries encoded by the served
  student, next to the same documents after ``rebuild``, and the service's sampled estimate;
* ``ingest``: ``POST /documents`` through the service, single documents and batches of 64, with
  the cost split the service reports per batch (encode / log / lock wait / apply);
* ``search``: ``--rounds`` interleaved rounds of 8 closed-loop clients for ``--load-s`` s, idle and
  while a client streams batches of 64 new documents; ``qps_vs_idle`` per round and its median
  (target >= 0.70, 0 errors);
* ``chaos``: ``--kills`` cycles of: stream batches of 1-16 new documents (each carries a unique
  marker word), SIGKILL at a random moment, restart; then every acknowledged document must be
  found by BM25 (its marker: exactly that document, once) and by dense search (its own stored
  vector as the query, every IVF list probed: in the top 100; found by its own text is reported
  beside it, in the top 1,000 with every list probed and in the top 100 at the tuned probes), no hit may be
  duplicated or lack its title, and the batch in flight at the kill must be
  entirely present or entirely absent.

Back ends (rows ``backend``, ``--backends``): ``faiss`` (the index directory, the phases above) and
``milvus``: the embedded Milvus server (:mod:`scalingnote.index.milvus.milvus_server`) started for the run
and stopped after it, the index copy exported into it (IVF_PQ) and served with ``--backend milvus
--uri ... --collection ingest --index <the copy>`` (the write-ahead log and BM25 side beside the
copy: :mod:`scalingnote.live.milvus`); ingest and chaos phases as above (drift: FAISS only).

Run: ``flock /tmp/bench.lock nice -n 5 .venv/bin/python -m benchmarks.ingest --run runs/quickstart``
(~25 min on 2 cores; ``--chaos-only`` keeps FAISS's drift / ingest / search rows: ~15 min).
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

from benchmarks._common import REPO_ROOT, ServeProcess, loadavg, write_results
from benchmarks._ingest_backends import backend_context, index_for
from benchmarks._ingest_drift import drift_only, phase_drift
from benchmarks._ingest_service import phase_ingest, phase_search, post_docs, start_service

# --------------------------------------------------------------------------- data


class Run:
    """What a quick-start run serves: its index, the served student, the printed serve arguments,
    its corpus and test queries."""

    def __init__(self, root: Path):
        from scalingnote.data import load_beir

        self.root = root
        res = json.loads((root / "results.json").read_text())
        st = res["choices"]["student"]
        self.student = next(c["dir"] for c in st["candidates"] if c["name"] == st["chosen"])
        self.index = root / "index" / "ivfpq"
        ds = load_beir(root / "data", "test")
        self.corpus = ds.corpus
        self.test_texts = [ds.queries[q].text for q in sorted(ds.qrels)]
        self.manifest = json.loads((self.index / "manifest.json").read_text())

    def use_index(self, index: Path) -> None:
        self.index = index
        self.manifest = json.loads((index / "manifest.json").read_text())

    def serve_args(self, index: Path) -> list[str]:
        """The command the quick start prints, on ``index`` (a copy of its index)."""
        return ["--index", str(index), "--query-tower", str(self.student)]


def new_documents(run: Run, n_new: int, new_docs: Path | None) -> list:
    """``n_new`` documents the index does not hold: notes the synthetic generator makes beyond the
    built corpus (checked: the first ones are the corpus), or the documents of ``new_docs``."""
    from scalingnote.data.corpus import iter_corpus
    from scalingnote.data.synth import SynthConfig, generate

    if new_docs is not None:
        docs = [d for d in iter_corpus(new_docs) if d.id not in run.corpus]
        return docs[:n_new]
    synth = run.root / "data" / "synth.json"
    if not synth.exists():
        raise SystemExit(
            f"{run.root}: not a synthetic-log run (no data/synth.json): pass --new-docs FILE (documents held "
            "back from the build)"
        )
    cfg = dict(json.loads(synth.read_text())["config"])
    n0 = int(cfg["num_docs"])
    cfg["num_docs"] = n0 + n_new
    cfg["sessions"] = tuple(cfg["sessions"])
    cfg["click_prob"] = tuple(cfg["click_prob"])
    notes = generate(SynthConfig(**cfg)).corpus
    built = notes[:n0]
    if sorted(d.id for d in built) != sorted(run.corpus) or any(run.corpus[d.id].text != d.text for d in built):
        raise SystemExit(f"{synth}: the generator with these settings no longer makes the built corpus")
    return notes[n0:]


# --------------------------------------------------------------------------- chaos


def _marked(doc, cycle: int, j: int):
    from scalingnote.data import Document

    mark = f"chaosmark{cycle:02d}x{j:04d}"
    return Document(f"chaos-{cycle:02d}-{j:04d}", doc.title or mark, doc.topic, f"{doc.content} {mark}"), mark


def _present(c, url: str, doc, mark: str, nlist: int) -> tuple[bool, bool, bool, str]:
    """(found by BM25 marker, found by dense with every IVF list probed, found by dense with the
    index's default probes, problem or ''). Dense: the document's own text as the query; the
    all-lists search (top 1,000 after an exact re-rank of 2,000) tells whether the document is in
    the dense index at all, the default one (top 100, re-rank 200) whether IVF probing also reaches it."""
    r = c.post(url + "/search", json={"query": mark, "k": 10, "mode": "bm25"}, timeout=120).json()["results"]
    ids = [h["doc_id"] for h in r]
    bm = ids == [doc.id]
    if ids and not bm:
        return False, False, False, f"bm25 {mark}: {ids}"
    q = f"{doc.title} {doc.content}"[:900]
    found = []
    for probes, k in ((None, 100), (nlist, 1000)):
        # with every list probed and k 1000 (exact re-rank of 2,000): is it in the dense index at all (the served
        # student reads 32 query tokens, and near-duplicate synthetic notes can outrank a note's own text at 100)
        body = {"query": q, "k": k, "mode": "dense", "rerank": 2 * k, **({"nprobe": probes} if probes else {})}
        d = c.post(url + "/search", json=body, timeout=120).json()["results"]
        dids = [h["doc_id"] for h in d]
        if len(dids) != len(set(dids)):
            return bm, False, False, f"duplicated hits for {doc.id}"
        hit = next((h for h in d if h["doc_id"] == doc.id), None)
        if hit is not None and hit["title"] != doc.title:
            return bm, True, True, f"half-added {doc.id}: title {hit['title']!r}"
        found.append(hit is not None)
    return bm, found[1], found[0], ""


def kill_mid_stream(srv: ServeProcess, post, make_batch, rng: random.Random, delay_s: float) -> tuple[list, list]:
    """Batches ``make_batch(n_acked_so_far)`` sent back to back by ``post(client, batch)`` (raising
    on a failed request) in a thread; SIGKILL of ``srv`` after ``delay_s``. Returns the items
    acknowledged and the batch in flight at the kill."""
    import httpx

    acked, inflight, stop = [], {"batch": []}, threading.Event()

    def stream() -> None:
        with httpx.Client(trust_env=False) as c:
            while not stop.is_set():
                batch = make_batch(len(acked))
                if not batch:
                    return
                inflight["batch"] = batch
                try:
                    post(c, batch)
                except (RuntimeError, AssertionError, httpx.HTTPError):
                    return
                acked.extend(batch)
                inflight["batch"] = []

    th = threading.Thread(target=stream, daemon=True)
    th.start()
    time.sleep(delay_s)
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()
    stop.set()
    th.join(30)
    return acked, list(inflight["batch"])


def chaos_cycle(
    srv: ServeProcess, args: list[str], pool, cycle: int, rng: random.Random, start: int, dense_check
) -> tuple[dict, int, ServeProcess]:
    """Stream into the running ``srv``, SIGKILL it at a random moment, restart, check; returns the
    row, the next pool position and the restarted service (the next cycle's). ``dense_check(docs,
    nlist)``: (how many are retrievable by their own stored vector, the ids that are not)."""
    import httpx

    with httpx.Client(trust_env=False) as c:  # the document tower is loaded before the clock starts
        first = [_marked(pool[start], cycle, 0)]
        post_docs(c, srv.url, [first[0][0]])

    def make_batch(n_acked: int):
        i = start + 1 + n_acked
        return [_marked(d, cycle, i - start + j) for j, d in enumerate(pool[i : i + rng.randint(1, 16)])]

    acked, lost = kill_mid_stream(
        srv, lambda c, batch: post_docs(c, srv.url, [b[0] for b in batch]), make_batch, rng, rng.uniform(0.2, 6.0)
    )
    acked = first + acked
    srv = start_service(args)
    nlist = int(
        httpx.get(srv.url + "/healthz", trust_env=False).json()["index"]["nlist"] or 0
    )  # 0: no IVF layer (HNSW methods)
    problems, n_bm, n_dense, n_default, present = [], 0, 0, 0, 0
    with httpx.Client(trust_env=False) as c:
        for doc, mark in acked:
            bm, de, de_default, why = _present(c, srv.url, doc, mark, nlist)
            n_bm += bm
            n_dense += de
            n_default += de_default
            if why or not bm:
                problems.append(why or f"{doc.id}: bm25={bm}")
        present = sum(_present(c, srv.url, d, m, nlist)[0] for d, m in lost)
        if present not in (0, len(lost)):
            problems.append(f"in-flight batch half applied: {present}/{len(lost)}")
    in_dense, missing = dense_check([d for d, _ in acked], nlist)
    problems += [f"{i}: not retrievable by its own vector" for i in missing]
    row = {
        "phase": "chaos",
        "cycle": cycle,
        "acked": len(acked),
        "bm25_found": n_bm,
        "dense_found": in_dense,
        "dense_found_by_text": n_dense,
        "dense_found_default_nprobe": n_default,
        "inflight_docs": len(lost),
        "inflight_present": present,
        "ok": not problems,
        "problems": "; ".join(problems[:3]),
    }
    print(json.dumps(row), flush=True)
    return row, start + len(acked) + len(lost), srv


# --------------------------------------------------------------------------- back ends


def backend_phases(
    args, backend: str, serve_args: list[str], dense_check, new_docs, run: Run, chaos_only: bool
) -> list[dict]:
    """The ingest and search phases (with --chaos-only: FAISS none, Milvus at the first --ingest-duty
    only) then the chaos cycles, each row tagged with ``backend``."""
    rows, used = [], 0
    for duty in (
        [] if chaos_only and backend == "faiss" else args.ingest_duty
    ):  # the default pacing last: the chaos runs use it
        srv = start_service([*serve_args, "--ingest-duty", str(duty)])
        try:
            ingest, used = phase_ingest(srv, new_docs, used % max(1, len(new_docs) - 512))
            search, used = phase_search(srv, new_docs, run.test_texts, used, args.rounds, args.load_s, args.seed)
        finally:
            srv.stop()
        rows += [{**r, "ingest_duty": duty} for r in ingest + search]
        if chaos_only:
            break
    rng, pos = random.Random(args.seed), used
    srv = start_service(serve_args)
    try:
        for cycle in range(args.kills):
            row, pos, srv = chaos_cycle(
                srv, serve_args, new_docs, cycle, rng, pos % max(1, len(new_docs) - 64), dense_check
            )
            rows.append(row)
    finally:
        srv.stop()
    return [{"backend": backend, **r} for r in rows]


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--run", type=Path, default=REPO_ROOT / "runs" / "quickstart", help="A quick-start output directory."
    )
    ap.add_argument(
        "--new", type=int, default=1500, help="New documents (the +100%% drift point needs as many as the index holds)."
    )
    ap.add_argument(
        "--new-docs",
        type=Path,
        default=None,
        help="JSONL of documents held back from the run's build (default: more synthetic notes).",
    )
    ap.add_argument("--rounds", type=int, default=5, help="Interleaved idle / ingesting search rounds.")
    ap.add_argument("--load-s", type=float, default=15.0, help="Seconds per load-test phase.")
    ap.add_argument(
        "--ingest-duty",
        type=lambda v: [float(x) for x in v.split(",")],
        default=[1.0, 0.5],
        help="Comma-separated `serve --ingest-duty` values, each measured with its own service (1: no pacing).",
    )
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument(
        "--chaos-only",
        action="store_true",
        help="Re-run the chaos phase (and Milvus's ingest and search phases at the first --ingest-duty) only; "
        "FAISS's other rows are kept from the results file.",
    )
    ap.add_argument(
        "--backends",
        type=lambda v: v.split(","),
        default=["faiss", "milvus"],
        help="Comma-separated back ends: faiss (the index directory) and milvus (the embedded Milvus server, "
        "started and stopped here).",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=REPO_ROOT / ".cache" / "ingest")
    ap.add_argument(
        "--method",
        default="chosen",
        choices=("chosen", "ivf", "ivf_qmetric", "hnsw", "hnsw_pq", "hnsw_sq", "hnsw_sq_qg", "hnsw_lean"),
        help="Structure served and drifted: the run's index as the quick start chose and built it (chosen), or a copy "
        "rebuilt over the same vectors with this method (search defaults of the build, not tuned).",
    )
    ap.add_argument(
        "--drift-only",
        action="store_true",
        help="Only the drift phase of --method, merged into benchmarks/results/ingest_drift.json (one block of "
        "rows per method).",
    )
    return ap.parse_args(argv)


def run_phases(args, run: Run, new_docs: list, kept: dict | None) -> tuple[list[dict], list[dict], dict]:
    """Drift (FAISS; with ``--chaos-only``: FAISS's earlier rows instead), then each back end's
    ingest, search and chaos phases on its own copy of the index -> rows, chaos rows, back-end info."""
    rows: list[dict] = []
    chaos, info = [], {}
    with tempfile.TemporaryDirectory(prefix="sn-ingest-") as d:
        work = Path(d)
        run.use_index(index_for(run, args.method, work))
        if kept is None:
            drift, _X_new, _Q = phase_drift(run, work, new_docs, args.cache)
            rows += drift
        else:  # FAISS's rows of the earlier run (made before rows named their back end)
            rows += [
                {"backend": "faiss", **r}
                for r in kept["rows"]
                if r["phase"] != "chaos" and r.get("backend", "faiss") == "faiss"
            ]
        for backend in args.backends:
            served = work / f"served-{backend}"
            shutil.copytree(run.index, served)
            with backend_context(backend, work, served, run.serve_args(served), run.student) as (
                serve_args,
                dense_check,
                info[backend],
            ):
                out = backend_phases(args, backend, serve_args, dense_check, new_docs, run, kept is not None)
            rows += out
            chaos += [r for r in out if r["phase"] == "chaos"]
    return rows, chaos, info


def run_config(
    args, run: Run, new_docs: list, passed: dict, info: dict, kept: dict | None, t_start: float, load0
) -> dict:
    """The results file's config: the run served, the settings, each back end's info and the chaos tally."""
    tower = run.manifest.get("tower") or {}
    config = {
        "run": str(args.run),
        "data": "synthetic note-search log; new documents: notes the generator makes beyond the built corpus"
        if args.new_docs is None
        else f"new documents from {args.new_docs}",
        "n_base": int(run.manifest.get("n_vectors", 0)),
        "n_new": len(new_docs),
        "seed": args.seed,
        "factory": run.manifest.get("factory"),
        "search_defaults": run.manifest.get("search_defaults"),
        "method": (run.manifest.get("routing") or {}).get("method") or "factory",
        "method_requested": args.method,
        "document_tower": f"{tower.get('path') or tower.get('name')} (fingerprint {tower.get('fingerprint')})",
        "query_tower": run.student,
        "serve": "the quick start's printed command: scalingnote serve "
        + " ".join(run.serve_args(Path("<copy of index>")))
        + " --port 0"
        " (milvus: --backend milvus --uri <embedded server> --collection ingest --index <copy of index, exported>)",
        "ingest_duty": args.ingest_duty,
        "rounds": args.rounds,
        "load_s": args.load_s,
        "kills": args.kills,
        "backends": args.backends,
        **{f"chaos_passed_{b}": f"{n}/{args.kills}" for b, n in passed.items()},
        **{f"{b}_{k}": v for b, i in info.items() for k, v in i.items()},
        "total_s": round(time.perf_counter() - t_start, 1),
        **loadavg(load0),
        **(
            {
                "chaos_rerun": "chaos rows (and Milvus's ingest / search rows) re-made with --chaos-only on a "
                "fresh copy of the index; FAISS's other rows and their config: "
                f"created {kept['created']}, total_s {kept['config'].get('total_s')}"
            }
            if kept is not None
            else {}
        ),
        "note": "2 CPU cores: throughput and QPS are noisy; the search ratio is the median of interleaved rounds",
    }
    return config


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    load0, t_start = os.getloadavg(), time.perf_counter()
    run = Run(args.run)
    new_docs = new_documents(run, args.new, args.new_docs)
    if args.drift_only:
        drift_only(args, run, new_docs, load0, t_start)
        return
    kept = json.loads((REPO_ROOT / "benchmarks" / "results" / "ingest.json").read_text()) if args.chaos_only else None
    rows, chaos, info = run_phases(args, run, new_docs, kept)
    passed = {b: sum(r["ok"] for r in chaos if r["backend"] == b) for b in args.backends}
    config = run_config(args, run, new_docs, passed, info, kept, t_start, load0)
    path = write_results("ingest", rows, config)
    print(f"chaos {passed} of {args.kills} each; wrote {path}", flush=True)


if __name__ == "__main__":
    main()
