"""Scoring a query tower over a set of document embeddings, on the reported split and on the
validation queries Stage I held out; query throughput and single-query latency."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.data import load_beir
from scalingnote.evaluation import evaluate
from scalingnote.evaluation.dense import exact_search, truncate_normalize
from scalingnote.evaluation.metrics import per_query
from scalingnote.models import load_tower
from scalingnote.models.onnx_export import export_onnx, onnx_embed, ort_session
from scalingnote.training.config import load_run_config
from scalingnote.training.data import load_training_data
from scalingnote.training.evaluate import heldout_queries

METRICS = ["r@10", "r@100", "ndcg@10", "recall@100", "mrr@10"]


@dataclass
class EvalSet:
    """The reported queries (test split) and the validation queries (held out from training)."""

    qids: list[str]
    texts: list[str]
    qrels: dict[str, dict[str, int]]
    val_qids: list[str]
    val_texts: list[str]
    val_qrels: dict[str, dict[str, int]]


@dataclass
class Scored:
    """A query tower over a document-embedding set: metrics on the reported split, per-query
    nDCG@10 (for paired tests), the validation nDCG@10 and both dense runs."""

    metrics: dict[str, float]
    per_query: dict[str, float]
    val_ndcg: float
    run: dict[str, dict[str, float]] = field(repr=False)
    val_run: dict[str, dict[str, float]] = field(repr=False)
    #: per-query validation nDCG@10 (for the interval of a retention; empty without validation)
    val_per_query: dict[str, float] = field(default_factory=dict, repr=False)


def load_eval_set(beir: Path, split: str, heldout_from: Path, max_queries: int | None) -> EvalSet:
    ds = load_beir(beir, split)
    qids = sorted(ds.queries)[:max_queries] if max_queries else sorted(ds.queries)
    vq, vqrels = heldout_queries(heldout_from, exclude=set(qids))
    vids = sorted(vq)
    return EvalSet(
        qids,
        [ds.queries[q].text for q in qids],
        {q: ds.qrels[q] for q in qids},
        vids,
        [vq[q] for q in vids],
        {q: vqrels[q] for q in vids},
    )


class TuningTexts(list):
    """Query texts for choosing the served index (a list: the validation queries, then the training
    queries); ``n_validation`` says where the training ones start (the structure and its
    settings are chosen on the validation queries only; the training ones fit the query-aware
    routers, e.g. ``ivf_qmetric``'s query metric)."""

    def __init__(self, validation: list[str], train: list[str]):
        super().__init__([*validation, *train])
        self.n_validation = len(validation)

    @property
    def validation(self) -> list[str]:
        return list(self[: self.n_validation])

    @property
    def train(self) -> list[str]:
        return list(self[self.n_validation :])


def tuning_texts(ev: EvalSet, heldout_from: Path, limit: int = 1000, seed: int = 0) -> TuningTexts:
    """Query texts to choose the index on: the validation queries (the choice) and up to ``limit``
    training queries of the Stage I run ``heldout_from`` (router fitting), never a reported query."""
    cfg = load_run_config(heldout_from)  # a moved run reads its data where it now is
    test_ids, test_texts = set(ev.qids), set(ev.texts)
    seen = set(ev.val_texts)
    train = []
    for e in load_training_data(cfg.data, cfg.seed, show_progress=False).train:
        if e.query_id not in test_ids and e.query not in test_texts and e.query not in seen:
            seen.add(e.query)
            train.append(e.query)
    rng = np.random.default_rng(seed)
    pick = sorted(rng.choice(len(train), size=min(limit, len(train)), replace=False).tolist()) if train else []
    return TuningTexts(list(ev.val_texts), [train[i] for i in pick])


class TowerPool:
    """Loads each query tower and each document-embedding set once."""

    def __init__(self) -> None:
        self._towers: dict[str, Any] = {}
        self._docs: dict[str, tuple[np.ndarray, list[str]]] = {}
        self._emb: dict[tuple[str, int], np.ndarray] = {}  #: (tower, id of the text list) -> embeddings
        self.scored: dict[tuple[str, str], Scored] = {}  #: (tower, doc run) -> its score, computed once

    def tower(self, path: str | Path):
        key = str(path)
        if key not in self._towers:
            self._towers[key] = load_tower(path)
        return self._towers[key]

    def docs(self, run_dir: str | Path) -> tuple[np.ndarray, list[str]]:
        import json

        key = str(run_dir)
        if key not in self._docs:
            d = Path(run_dir)
            self._docs[key] = (
                truncate_normalize(np.load(d / "doc_embeddings.npy")),
                json.loads((d / "doc_ids.json").read_text()),
            )
        return self._docs[key]

    def encode(self, path: str | Path, texts: list[str]) -> np.ndarray:
        """Normalised query embeddings; each (tower, text list) is encoded once (the lists are the
        eval set's, which live as long as the pool)."""
        key = (str(path), id(texts))
        if key not in self._emb:
            self._emb[key] = truncate_normalize(
                self.tower(path).encode_queries(texts, batch_size=256, show_progress=False)
            )
        return self._emb[key]


def score(pool: TowerPool, tower_dir: str | Path, doc_run: str | Path, ev: EvalSet) -> Scored:
    key = (str(tower_dir), str(doc_run))
    if key in pool.scored:
        return pool.scored[key]
    d_emb, ids = pool.docs(doc_run)
    run = exact_search(pool.encode(tower_dir, ev.texts), ev.qids, d_emb, ids, k=100)
    val_run = exact_search(pool.encode(tower_dir, ev.val_texts), ev.val_qids, d_emb, ids, k=100) if ev.val_qids else {}
    val = float(evaluate(val_run, ev.val_qrels, ["ndcg@10"])["ndcg@10"]) if ev.val_qids else float("nan")
    pool.scored[key] = Scored(
        evaluate(run, ev.qrels, METRICS),
        per_query_ndcg(run, ev.qrels),
        round(val, 4),
        run,
        val_run,
        per_query_ndcg(val_run, ev.val_qrels) if ev.val_qids else {},
    )
    return pool.scored[key]


def per_query_ndcg(run, qrels) -> dict[str, float]:
    pq = per_query(run, qrels, ["ndcg@10"])
    return {q: float(v["ndcg@10"]) for q, v in pq.items()}


def query_qps(tower, texts: list[str], batch_size: int = 256, repeats: int = 3) -> float:
    """Queries/s of one tower's ``encode_queries`` (see :func:`query_qps_many`)."""
    return query_qps_many({"_": tower}, texts, batch_size=batch_size, repeats=repeats)["_"]


def query_qps_many(
    towers: dict[str, Any], texts: list[str], batch_size: int = 256, repeats: int = 3
) -> dict[str, float]:
    """Queries/s of each tower's ``encode_queries`` (512 queries, batch 256, the threads torch is
    set to): the best of ``repeats`` timed passes, as ``timeit`` reports, since a pass is only
    slowed by other work on the machine (3: best of 5 was 24 of a budgeted run's 26 evaluation
    seconds on one core, and on the same three towers best of 5 read speed-ups of 2.61-3.23 over
    three rounds where best of 3 read 2.57-3.26). The towers take turns within each round, so a slow
    spell of the machine hits every tower alike and their ratio (a speed-up) is not one tower's
    luck (measured one after the other, the same two towers read 2.70x in one run, 3.11x in the
    next; interleaved, 2.6-2.9x across runs)."""
    texts = (texts * math.ceil(512 / max(1, len(texts))))[:512]
    for t in towers.values():
        t.encode_queries(texts[:batch_size], batch_size=batch_size, show_progress=False)  # warm-up
    best = {name: float("inf") for name in towers}
    for _ in range(max(1, repeats)):
        for name, t in towers.items():
            t0 = time.perf_counter()
            t.encode_queries(texts, batch_size=batch_size, show_progress=False)
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: len(texts) / b for name, b in best.items()}


def _single_query_encoder(tower, texts: list[str], backend: str, export_dir: Path | None):
    """``encode([text])`` with the back end the tower will be served with: eager PyTorch, or ONNX
    Runtime over its int8 export (``backend="onnx"``, made in ``export_dir`` once)."""
    if backend != "onnx":
        return lambda xs: tower.encode_queries(xs, batch_size=1, show_progress=False)

    assert export_dir is not None, "backend onnx needs export_dir"
    if not (export_dir / "scalingnote_onnx.json").exists():
        export_onnx(tower, export_dir, quantize="int8", validation_texts=texts[:64])
    name = "model_int8.onnx" if (export_dir / "model_int8.onnx").exists() else "model.onnx"
    sess = ort_session(export_dir / name, threads=1)
    return lambda xs: onnx_embed(sess, tower, xs, batch_size=1)


def single_query_p99_many(
    towers: dict[str, tuple[Any, Path | None]],
    texts: list[str],
    *,
    backend: str = "torch",
    n: int = 500,
    block: int = 50,
) -> dict[str, float]:
    """p99 (ms) of encoding one query at a time, one intra-op thread, per tower (``{name: (tower,
    export_dir)}``), with the back end it will be served with. The towers take turns in blocks of
    ``block`` queries (each block after 2 untimed queries, so the tower runs from warm caches as
    it would when served alone), so a slow spell of the machine lands on all of them alike and a
    latency budget compares them over the same minutes. ``n`` = 500 timed queries each: the p99
    of 200 was the 2nd-slowest query, and one run's 2-layer student read 4.37 ms where the next
    read 3.37."""
    import torch

    texts = (texts * math.ceil(n / max(1, len(texts))))[:n]
    encoders = {name: _single_query_encoder(t, texts, backend, d) for name, (t, d) in towers.items()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one request, one core: two intra-op threads on a busy machine inflate it ~10x
    times: dict[str, list[float]] = {name: [] for name in encoders}
    block = max(1, block)
    try:
        for start in range(0, len(texts), block):
            chunk = texts[start : start + block]
            for name, enc in encoders.items():
                for t in texts[:2] if start else texts[:10]:
                    enc([t])  # warm-up (longer before the first block)
                for t in chunk:
                    t0 = time.perf_counter()
                    enc([t])
                    times[name].append((time.perf_counter() - t0) * 1000)
    finally:
        torch.set_num_threads(threads)
    return {name: round(float(np.percentile(v, 99)), 3) for name, v in times.items()}


def single_query_p99_ms(
    tower, texts: list[str], *, backend: str = "torch", n: int = 500, export_dir: Path | None = None
) -> float:
    """:func:`single_query_p99_many` of one tower."""
    return single_query_p99_many({"_": (tower, export_dir)}, texts, backend=backend, n=n)["_"]


__all__ = [
    "EvalSet",
    "METRICS",
    "Scored",
    "TowerPool",
    "load_eval_set",
    "per_query_ndcg",
    "query_qps",
    "query_qps_many",
    "score",
    "single_query_p99_many",
    "single_query_p99_ms",
    "TuningTexts",
    "tuning_texts",
]
