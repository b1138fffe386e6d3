"""Hard negatives mined by a dense tower (``data.negatives: dense | mixed``), several per query.

ScalingNote draws one hard negative per example from BM25-style ranks K+1..T (§4.1.1: "filter
out the top-K relevant documents to prevent false negative samples. Then, we randomly choose a
document ranked between top-K and top-T"). Here the ranking can come from a trained dense tower
(ANCE, Xiong et al. 2021; RocketQA's denoised negatives, Qu et al. 2021), and several negatives
are drawn per example:

1. the mining tower (``data.mining.tower``: a Stage I run's query and document towers, or a base
   model used zero-shot on both sides) encodes every training query and the corpus — or, for a
   Stage I run, its own stored corpus embeddings are used once a seeded sample re-encoded by its
   document tower agrees with them (:func:`stored_doc_embeddings`);
2. an exact inner-product search (FAISS ``IndexFlatIP`` over unit vectors: the corpora are small)
   ranks the corpus for every query;
3. the window: dense ranks K+1..T (``mining.skip_top`` / ``max_rank``), the query's known
   positives removed as :func:`scalingnote.sparse.bm25.sample_hard_negatives` removes them;
   ``mixed``: the union of that window and the BM25 window (``data.neg_skip_top`` / ``neg_max_rank``),
   deduplicated, each candidate carrying both scores;
4. the false-negative guard (:mod:`scalingnote.training.guard`) marks candidates that look like
   unlabelled positives; the kept ones are the pool;
5. per (query, positive) example, ``num_negatives`` are drawn uniformly without replacement from
   the pool (seeded by the example's position, as the BM25 path seeds its one draw); a pool
   smaller than n is used whole and then cycled, so every example carries exactly n; a query
   whose pool the guard emptied draws from its BM25 window (source ``bm25_fallback``, counted in
   the summary).

The mined triplets are cached (:func:`mined_rows`) under a key of the mining towers' fingerprints
and these settings, in the ``scalingnote data build`` triplet JSONL (one line per negative).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from scalingnote.data import Document, Triplet, load_triplets, write_triplets
from scalingnote.errors import ConfigError
from scalingnote.models import load_tower_pair, model_cache_root
from scalingnote.models.towers import load_saved_tower
from scalingnote.sparse.bm25 import BM25Retriever
from scalingnote.training.audit import audit_records, audit_summary, write_audit
from scalingnote.training.config import DataSpec
from scalingnote.training.guard import Candidate, MinedQuery, apply_guard
from scalingnote.utils.io import atomic_write, read_json, write_json
from scalingnote.utils.steps import check_step, input_digest, mark_step

log = logging.getLogger(__name__)

TRIPLETS_FILE = "triplets.jsonl"
SUMMARY_FILE = "mining_summary.json"


# ----------------------------------------------------------------------------- towers and search
def load_mining_towers(tower: str, device: str | None = None):
    """(query tower, document tower) from a Stage I run directory (``query_tower/`` and
    ``doc_tower/``) or a base model name / path loaded as a pair (zero-shot)."""
    root = Path(tower).expanduser()
    if root.is_dir() and (root / "query_tower").is_dir() and (root / "doc_tower").is_dir():
        return load_saved_tower(root / "query_tower", device=device), load_saved_tower(
            root / "doc_tower", device=device
        )
    if root.is_dir() and (root / "tower.json").is_file():
        raise ConfigError(
            None,
            None,
            "data.mining.tower",
            f"{root} is one saved tower: give the Stage I run directory that holds query_tower/ and doc_tower/",
        )
    return load_tower_pair(tower, device=device)


def tower_key(qt, dt) -> dict[str, str]:
    """The mining towers' identity in the cache key: their fingerprints (weights + settings)."""
    return {"query": str(qt.fingerprint), "document": str(dt.fingerprint)}


#: stored corpus embeddings are used when this many seeded documents, re-encoded by the mining
#: tower, agree with them to :data:`STORED_MIN_COS` (fp16 feature caches agree to ~1e-6)
STORED_SAMPLE = 16
STORED_MIN_COS = 0.999


def _unit(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12), dtype=np.float32)


def stored_doc_embeddings(
    run_dir: str | Path | None, dt, corpus: Mapping[str, Document], batch_size: int = 16, seed: int = 0
) -> np.ndarray | None:
    """The mining tower's own corpus embeddings, when its Stage I run stored them
    (``doc_embeddings.npy`` + ``doc_ids.json``, written by the run's final evaluation through the same
    towers): unit-norm, in ``corpus`` order. Re-encoding the corpus was most of the mining time
    (KUAKE-QTR with a 4-layer SmolLM2: 624 s encoding, 24 s with the stored ones). None — encode
    instead — when they are absent, cover another corpus, or a seeded sample re-encoded by ``dt``
    disagrees (towers replaced after the run wrote them)."""
    root = Path(run_dir).expanduser() if run_dir else None
    if root is None or not (root / "doc_embeddings.npy").is_file() or not (root / "doc_ids.json").is_file():
        return None
    ids = read_json(root / "doc_ids.json")
    emb = np.load(root / "doc_embeddings.npy", mmap_mode="r")
    if emb.ndim != 2 or emb.shape[0] != len(ids) or len(ids) != len(corpus) or set(ids) != set(corpus):
        log.info(
            "%s: stored embeddings cover another corpus (%d rows, corpus %d): encoding", root, emb.shape[0], len(corpus)
        )
        return None
    row = {doc: i for i, doc in enumerate(ids)}
    d = _unit(
        np.asarray(emb[np.fromiter((row[doc] for doc in corpus), dtype=np.int64, count=len(corpus))], dtype=np.float32)
    )
    docs = list(corpus.values())
    pick = np.random.default_rng(seed).choice(len(docs), size=min(STORED_SAMPLE, len(docs)), replace=False)
    fresh = _unit(dt.encode_documents([docs[i] for i in pick], batch_size=batch_size, show_progress=False))
    if fresh.shape[1] != d.shape[1] or float((fresh * d[pick]).sum(axis=1).min()) < STORED_MIN_COS:
        log.warning("%s: stored embeddings disagree with its doc_tower on a sample: encoding the corpus", root)
        return None
    return d


def encode_for_mining(
    qt,
    dt,
    corpus: Mapping[str, Document],
    queries: Mapping[str, str],
    batch_size: int,
    show_progress: bool,
    tower_dir: str | Path | None = None,
) -> tuple[np.ndarray, np.ndarray, str]:
    """Unit-norm float32 (query, document) embeddings, in ``queries`` / ``corpus`` order, and where the
    documents' came from (``stored``: the mining run's own, see :func:`stored_doc_embeddings`; ``encoded``)."""
    d = stored_doc_embeddings(tower_dir, dt, corpus, batch_size)
    source = "stored" if d is not None else "encoded"
    if d is None:
        d = _unit(dt.encode_documents(list(corpus.values()), batch_size=batch_size, show_progress=show_progress))
    q = _unit(qt.encode_queries(list(queries.values()), batch_size=batch_size, show_progress=False))
    return q, d, source


def exact_search(q: np.ndarray, d: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` by inner product (FAISS Flat): (scores [Q, k], document rows [Q, k])."""
    index = faiss.IndexFlatIP(d.shape[1])
    index.add(d)
    return index.search(q, min(k, d.shape[0]))


# ----------------------------------------------------------------------------- windows
def build_windows(
    spec: DataSpec,
    qids: Sequence[str],
    doc_ids: Sequence[str],
    q: np.ndarray,
    d: np.ndarray,
    positives: Mapping[str, Sequence[str]],
    bm25_run: Mapping[str, Mapping[str, float]] | None,
) -> list[MinedQuery]:
    """Every query's candidate window (dense, or dense + BM25 for ``mixed``), known positives removed."""
    k, t = spec.dense_window()
    r = spec.mining.guard_top_r
    scores, rows = exact_search(q, d, max(t, r))
    row_of = {doc: i for i, doc in enumerate(doc_ids)}
    out = []
    for qi, qid in enumerate(qids):
        pos = set(positives.get(qid, ()))
        dense_rank = {doc_ids[j]: n + 1 for n, j in enumerate(rows[qi]) if j >= 0}
        dense_score = {doc_ids[j]: float(s) for s, j in zip(scores[qi], rows[qi], strict=True) if j >= 0}
        bm_ranked = sorted((bm25_run or {}).get(qid, {}).items(), key=lambda x: (-x[1], x[0]))
        bm_rank = {doc: n + 1 for n, (doc, _) in enumerate(bm_ranked)}
        bm_score = dict(bm_ranked)
        window = [doc_ids[j] for j in rows[qi][k:t] if j >= 0]
        if spec.negatives == "mixed":  # the union: the dense window, then the BM25 window's others
            seen = set(window)
            window += [doc for doc, _ in bm_ranked[spec.neg_skip_top : spec.neg_max_rank] if doc not in seen]
        mq = MinedQuery(
            qid,
            positive_scores={p: float(q[qi] @ d[row_of[p]]) for p in sorted(pos) if p in row_of},
            fallback=[doc for doc, _ in bm_ranked[spec.neg_skip_top : spec.neg_max_rank] if doc not in pos],
        )
        for doc in window:
            if doc in pos:
                continue
            dense = dense_score.get(doc, float(q[qi] @ d[row_of[doc]]))  # a BM25-only candidate: its exact dense score
            mq.candidates.append(Candidate(doc, dense, dense_rank.get(doc), bm_score.get(doc), bm_rank.get(doc)))
        out.append(mq)
    return out


def draw_negatives(pool: Sequence[str], n: int, rng: np.random.Generator) -> list[str]:
    """``n`` negatives from ``pool``: uniform without replacement; a pool smaller than ``n`` is
    shuffled and cycled (every example carries exactly n); an empty pool gives none."""
    if not pool:
        return []
    if len(pool) >= n:
        return [pool[i] for i in rng.choice(len(pool), size=n, replace=False)]
    order = [pool[i] for i in rng.permutation(len(pool))]
    return [order[i % len(order)] for i in range(n)]


def example_seed(seed: int, i: int, j: int) -> int:
    """The draw seed of the j-th positive of the i-th query (sorted): the BM25 path's seeding."""
    return seed * 1_000_003 + i * 101 + j


def rows_from_windows(
    mined: Sequence[MinedQuery], positives: Mapping[str, Sequence[str]], n: int, seed: int, source: str
) -> list[tuple[str, str, list[str] | None, str]]:
    """(query, positive, negatives or None, source) per example, from the guarded windows. A query
    whose window the guard emptied draws from its BM25 window instead (source ``bm25_fallback``):
    the trainer uses hard negatives only in batches where every example has them, so one example
    without would switch them off for its whole batch."""
    by_q = {m.query_id: m for m in mined}
    rows = []
    for i, (qid, pos_list) in enumerate(sorted(positives.items())):
        mq = by_q.get(qid)
        pool, src = (
            (mq.kept, source)
            if mq is not None and mq.kept
            else (mq.fallback if mq is not None else [], "bm25_fallback")
        )
        for j, pid in enumerate(sorted(pos_list)):
            negs = draw_negatives(pool, n, np.random.default_rng(example_seed(seed, i, j)))
            rows.append((qid, pid, negs or None, src if negs else source))
    return rows


def bm25_rows(
    spec: DataSpec, run: Mapping[str, Mapping[str, float]], positives: Mapping[str, Sequence[str]], seed: int
) -> list[tuple[str, str, list[str] | None, str]]:
    """BM25 negatives, ``num_negatives`` per example, from ranks K+1..T minus known positives (the
    window :func:`~scalingnote.sparse.bm25.sample_hard_negatives` draws its one negative from)."""
    mined = []
    for qid in sorted(positives):
        ranked = [doc for doc, _ in sorted(run.get(qid, {}).items(), key=lambda x: (-x[1], x[0]))]
        pos = set(positives[qid])
        mined.append(
            MinedQuery(qid, [Candidate(doc) for doc in ranked[spec.neg_skip_top : spec.neg_max_rank] if doc not in pos])
        )
    return rows_from_windows(mined, positives, spec.num_negatives, seed, "bm25")


# ----------------------------------------------------------------------------- mining + cache
def mine_windows(
    spec: DataSpec,
    corpus: Mapping[str, Document],
    queries: Mapping[str, str],
    positives: Mapping[str, Sequence[str]],
    qt,
    dt,
    show_progress: bool = False,
    tower_dir: str | Path | None = None,
) -> tuple[list[MinedQuery], float, str]:
    """Encode (the documents: the run's stored embeddings when ``tower_dir`` has them), search,
    window and guard every query of ``positives``. Returns (windows, seconds, where the document
    embeddings came from: ``stored`` or ``encoded``)."""
    t0 = time.perf_counter()
    qids = sorted(positives)
    doc_ids = list(corpus)
    q, d, source = encode_for_mining(
        qt, dt, corpus, {x: queries[x] for x in qids}, spec.mining.batch_size, show_progress, tower_dir
    )
    log.info("mining: %d queries over %d documents (document embeddings %s)", len(qids), len(doc_ids), source)
    bm25 = BM25Retriever.fit(corpus.values(), show_progress=show_progress)  # mixed, agree_top and the fallback
    k = max(spec.neg_max_rank, spec.mining.guard_top_r)
    bm25_run = bm25.search({x: queries[x] for x in qids}, k=k, show_progress=show_progress)
    mined = build_windows(spec, qids, doc_ids, q, d, positives, bm25_run)
    apply_guard(mined, spec.mining)
    return mined, time.perf_counter() - t0, source


def mining_inputs(
    spec: DataSpec, towers: dict[str, str], seed: int, positives: Mapping[str, Sequence[str]]
) -> dict[str, Any]:
    """The cache key: mining towers' fingerprints, the settings that shape the windows and draws,
    the data directory (fingerprinted) and the labelled positives."""
    m = spec.mining
    return {
        "towers": towers,
        "negatives": spec.negatives,
        "num_negatives": spec.num_negatives,
        "dense_window": list(spec.dense_window()),
        "bm25_window": [spec.neg_skip_top, spec.neg_max_rank] if spec.negatives == "mixed" else None,
        "guard": sorted(m.guard),
        "guard_margin": m.guard_margin if "near_positive" in m.guard else None,
        "guard_top_r": m.guard_top_r,
        "data_dir": Path(spec.data_dir),
        "train_split": spec.train_split,
        "seed": seed,
        "positives": input_digest({q: sorted(p) for q, p in positives.items()}),
        "audit_queries": m.audit_queries,
    }


def cache_root(spec: DataSpec, out_dir: str | Path | None) -> Path:
    if spec.mining.cache_dir:
        return Path(spec.mining.cache_dir)
    return Path(out_dir) / "mined_negatives" if out_dir is not None else model_cache_root() / "mined_negatives"


def group_triplets(triplets: Sequence[Triplet]) -> list[tuple[str, str, list[str] | None, str]]:
    """Triplet lines (one per negative) back into examples: consecutive lines of one (query, positive)."""
    rows: list[tuple[str, str, list[str] | None, str]] = []
    for t in triplets:
        if (
            rows
            and (rows[-1][0], rows[-1][1]) == (t.query_id, t.pos_id)
            and t.neg_id is not None
            and rows[-1][2] is not None
        ):
            rows[-1][2].append(t.neg_id)
        else:
            rows.append((t.query_id, t.pos_id, [t.neg_id] if t.neg_id is not None else None, t.source))
    return rows


def mined_rows(
    spec: DataSpec,
    corpus: Mapping[str, Document],
    queries: Mapping[str, str],
    positives: Mapping[str, Sequence[str]],
    seed: int,
    out_dir: str | Path | None = None,
    show_progress: bool = False,
) -> tuple[list, dict[str, Any]]:
    """The training rows of ``data.negatives: dense | mixed``, mined once per (tower, settings) and
    cached as triplet JSONL (a rerun, or another model trained on the same data, reuses them).
    Writes ``mining_audit.jsonl`` beside the run (``out_dir``). Returns (rows, summary)."""
    qt, dt = load_mining_towers(spec.mining.tower or "")
    inputs = mining_inputs(spec, tower_key(qt, dt), seed, positives)
    step = cache_root(spec, out_dir) / input_digest(inputs)[:16]
    if not check_step(step, inputs):
        mined, seconds, source = mine_windows(
            spec, corpus, queries, positives, qt, dt, show_progress, spec.mining.tower
        )
        rows = rows_from_windows(mined, positives, spec.num_negatives, seed, spec.negatives)
        write_triplets(
            step / TRIPLETS_FILE, (Triplet(q, p, n, s) for q, p, negs, s in rows for n in (negs if negs else (None,)))
        )
        records = audit_records(mined, positives, corpus, queries, spec.mining.audit_queries, seed)
        summary = {
            **audit_summary(mined, rows),
            "mining_seconds": round(seconds, 2),
            "tower": spec.mining.tower,
            "document_embeddings": source,
        }
        write_audit(step / "mining_audit.jsonl", records, summary)
        write_json(step / SUMMARY_FILE, summary)
        mark_step(step, inputs, {"examples": len(rows)})
        log.info("mined %d examples in %.1fs -> %s", len(rows), seconds, step)
    rows = group_triplets(load_triplets(step / TRIPLETS_FILE, queries, corpus))
    summary = {**read_json(step / SUMMARY_FILE), "cache": str(step)}
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        write_audit_copy(step / "mining_audit.jsonl", Path(out_dir) / "mining_audit.jsonl")
    return rows, summary


def write_audit_copy(src: Path, dst: Path) -> None:
    """The cached audit, copied (atomically) beside the run."""
    with atomic_write(dst) as fh:
        fh.write(src.read_text(encoding="utf-8"))


__all__ = [
    "Candidate",
    "MinedQuery",
    "bm25_rows",
    "build_windows",
    "draw_negatives",
    "exact_search",
    "load_mining_towers",
    "mine_windows",
    "mined_rows",
    "rows_from_windows",
    "stored_doc_embeddings",
]
