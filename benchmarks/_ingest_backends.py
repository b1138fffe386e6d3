"""The back ends of ``benchmarks/ingest.py``: FAISS (the index directory) and the Milvus server --
the embedded Milvus server started for the run and stopped after it, the quick start's index exported into it,
the service's arguments
(``scalingnote serve --backend milvus --uri ... --collection ... --index <the exported copy>``)
and the dense presence check by stored vector (the collection read through a read-only
:class:`~scalingnote.live.milvus.MilvusLive`: checkpoint and log replayed, as the restarted
service did); FAISS's check reads a read-only :class:`~scalingnote.live.LiveIndex` the same way."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np

COLLECTION = "ingest"


@contextlib.contextmanager
def backend_context(name: str, work: Path, served: Path, faiss_args: list[str], student: str):
    """(service arguments, dense check ``(docs, nlist) -> (found, missing ids)``, info) of back end
    ``name`` over ``served`` (a copy of the run's index; ``faiss_args``: the quick start's command on it)."""
    if name == "faiss":
        yield faiss_args, (lambda docs, nlist: faiss_dense_by_vector(served, docs, nlist)), {}
    elif name == "milvus":
        with milvus_backend(work, served, student) as out:
            yield out
    else:
        raise SystemExit(f"--backends: unknown back end {name!r} (faiss, milvus)")


@contextlib.contextmanager
def milvus_backend(work: Path, served: Path, student: str):
    """Start the server in ``work``, export ``served`` (an index directory) into it; yields the
    service arguments and the dense check; stops the server after."""
    from scalingnote.index.milvus.milvus_export import export_to_milvus
    from scalingnote.index.milvus.milvus_server import EmbeddedMilvus, milvus_server_available

    reason = milvus_server_available()
    if reason:
        raise SystemExit(f"--backends milvus: the embedded Milvus server cannot run here: {reason}")
    srv = EmbeddedMilvus(work / "milvus-data", start_timeout_s=300).start()
    try:
        method = (json.loads((served / "manifest.json").read_text()).get("routing") or {}).get("method")
        # ivf_qmetric's lists cannot go to Milvus (auto refuses): its vectors under Milvus's own IVF_PQ,
        # recorded as the fallback
        man = export_to_milvus(
            served, srv.uri, COLLECTION, progress=False, index_type="IVF_PQ" if method == "ivf_qmetric" else "auto"
        )
        args = [
            "--backend",
            "milvus",
            "--uri",
            srv.uri,
            "--collection",
            COLLECTION,
            "--index",
            str(served),
            "--query-tower",
            str(student),
        ]
        info = {
            "uri": srv.uri,
            "index_type": man["index_type"],
            "index_params": man.get("index_params"),
            "server_start_s": round(srv.startup_seconds or 0.0, 1),
        }
        yield args, (lambda docs, nlist: milvus_dense_by_vector(srv.uri, served, docs, nlist)), info
    finally:
        srv.stop()


def index_for(run, method: str, work: Path) -> Path:
    """The index the phases serve: the run's own (``chosen``, or the method it was built with), or a
    copy rebuilt over its vectors with ``method`` (the method's default sizes, the
    build's search defaults). ivf_qmetric needs the student's training-query vectors: only the
    quick start's own choice builds it. ``hnsw_sq_qg``'s and ``hnsw_lean``'s edges (and hnsw_lean's
    projection) are fitted as the quick start fits them (:func:`edge_queries`)."""
    from scalingnote.index import DenseIndex, build_index

    built = (run.manifest.get("routing") or {}).get("method")
    if method == "chosen" or method == built:
        return run.index
    if method == "ivf_qmetric":
        raise SystemExit(
            f"{run.index}: built as {built or run.manifest.get('factory')}; --method ivf_qmetric needs the "
            "student's training-query "
            "vectors (its lists are cut in their metric): use a quick-start run that chose it, or --method chosen"
        )
    dense = DenseIndex.open(run.index)
    sem = run.manifest.get("semantic_ids") or {}
    out = work / f"index-{method}"
    X = np.asarray(dense.vectors)
    edges = {"train_queries": edge_queries(run, X.shape[1], method)} if method in ("hnsw_sq_qg", "hnsw_lean") else {}
    build_index(
        X,
        out,
        method=method,
        doc_ids=list(dense.doc_ids),
        tower_info=run.manifest.get("tower"),
        documents=run.root / "data",
        semantic_ids_layers=int(sem.get("n_layers", 0)),
        codebook_size=int(sem.get("codebook_size", 256)),
        seed=int(run.manifest.get("seed", 0)),
        progress=False,
        **edges,
    )
    return out


def edge_queries(run, dim: int, method: str = "hnsw_sq_qg") -> np.ndarray:
    """The queries ``method``'s (hnsw_sq_qg / hnsw_lean) edges are fitted on, as the quick start fits them
    (:mod:`scalingnote.quickstart.index_choice`): the run's training queries and QKD's unlabelled
    pool (``pseudo_ict`` + ``corpus_texts`` beside the run), through the served student, unit
    vectors at the index's width. Never a test query: those measure the drift."""
    from scalingnote.data import load_beir
    from scalingnote.data.jsonl import iter_jsonl
    from scalingnote.models import load_tower
    from scalingnote.quickstart.index_choice import student_vectors

    ds = load_beir(run.root / "data", "train")
    test = set(run.test_texts)
    texts = [ds.queries[q].text for q in sorted(ds.qrels)]
    for name in ("pseudo_ict", "corpus_texts"):
        path = run.root / name / "queries.jsonl"
        if not path.exists():
            raise SystemExit(
                f"{path}: missing; --method {method} fits its edges on the run's QKD pool as the quick start does"
            )
        texts += [str(rec.get("text") or "") for _, rec in iter_jsonl(path)]
    texts = [t for t in texts if t.strip() and t not in test]
    return student_vectors(load_tower(run.student), texts, dim)


def milvus_dense_by_vector(uri: str, local: Path, docs, nlist: int) -> tuple[int, list[str]]:
    """How many of ``docs`` the collection returns in the top 100 for their own stored vector
    (every IVF list probed, exact re-rank of 200) among the visible versions."""
    from scalingnote.index.milvus.milvus import PK, VECTOR
    from scalingnote.live.milvus import MilvusLive

    live = MilvusLive.open(uri, collection=COLLECTION, writer=False, live_dir=local)
    try:
        keys = {d.id: live.row_of.get(d.id) for d in docs}
        missing = [i for i, k in keys.items() if k is None]
        have = [(i, k) for i, k in keys.items() if k is not None]
        vec: dict[int, list[float]] = {}
        for s in range(0, len(have), 1024):
            part = [k for _, k in have[s : s + 1024]]
            for r in live.client.query(
                live.collection, filter=f"{PK} in {part}", output_fields=[PK, VECTOR], consistency_level="Strong"
            ):
                vec[int(r[PK])] = r[VECTOR]
        missing += [i for i, k in have if k not in vec]
        have = [(i, k) for i, k in have if k in vec]
        if have:
            q = np.asarray([vec[k] for _, k in have], dtype=np.float32)
            res = live.search(
                q, 100, rerank=200, **({"nprobe": nlist} if nlist else {})
            )  # nlist 0: no IVF layer (HNSW)
            missing += [i for (i, _), hits in zip(have, res.doc_ids, strict=True) if i not in hits]
    finally:
        live.close()
    return len(docs) - len(missing), missing


def faiss_dense_by_vector(index: Path, docs, nlist: int) -> tuple[int, list[str]]:
    """How many of ``docs`` the dense index returns in the top 100 for their own stored vector (every
    list probed, exact re-rank): present and retrievable, whatever a text query would rank. Read
    through a read-only live index (the write-ahead log replayed, as the restarted service did)."""
    from scalingnote.live import LiveIndex

    live = LiveIndex.open(index, writer=False)
    try:
        rows = [live.row_of.get(d.id) for d in docs]
        missing = [d.id for d, r in zip(docs, rows, strict=True) if r is None]
        have = [(d, r) for d, r in zip(docs, rows, strict=True) if r is not None]
        if have:
            q = np.asarray(live.store.vectors.view[[r for _, r in have]], dtype=np.float32)
            res = live.search(
                q, 100, rerank=200, **({"nprobe": nlist} if nlist else {})
            )  # nlist 0: no IVF layer (HNSW)  # ties: notes can repeat another one word for word
            missing += [d.id for (d, _), hits in zip(have, res.doc_ids, strict=True) if d.id not in hits]
    finally:
        live.close()
    return len(docs) - len(missing), missing
