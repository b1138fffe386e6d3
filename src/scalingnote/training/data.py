"""Stage I training examples: (query text, positive document, hard negative documents).

From a BEIR directory, every judged (query, relevant document) pair of the train
split is an example; its hard negatives (``data.num_negatives``, default one) are drawn
from BM25 ranks K+1..T after dropping the top K (ScalingNote §4.1.1), never a
judged-relevant document, or mined by a dense tower (``data.negatives: dense | mixed``,
:mod:`scalingnote.training.mining`). From a triplet JSONL (``scalingnote data build``)
the examples are the triplets.

Validation examples are held out **by query** (no query appears on both sides).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalingnote.data import Document, Qrels, load_corpus, load_qrels, load_queries, load_triplets
from scalingnote.data.beir import qrels_path
from scalingnote.errors import ScalingNoteError
from scalingnote.sparse.bm25 import BM25Retriever, sample_hard_negatives
from scalingnote.training.config import DataSpec
from scalingnote.training.mining import bm25_rows, mined_rows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Example:
    query_id: str
    query: str
    pos: Document
    neg: Document | None  #: the (first) hard negative
    source: str = "qrels"
    extra_negs: tuple[Document, ...] = ()  #: hard negatives 2..n (``data.num_negatives`` > 1)

    @property
    def negs(self) -> tuple[Document, ...]:
        """Every hard negative of the example (empty without one)."""
        return () if self.neg is None else (self.neg, *self.extra_negs)


@dataclass
class TrainingData:
    train: list[Example]
    validation: list[Example]
    corpus: dict[str, Document]
    queries: dict[str, str]
    eval_qrels: Qrels | None
    eval_queries: dict[str, str]
    dropped_eval_overlap: int = 0  #: training queries dropped because they are evaluation queries
    mining: dict | None = None  #: the mining summary (``data.negatives: dense | mixed``)

    def validation_qrels(self) -> Qrels:
        out: Qrels = {}
        for ex in self.validation:
            out.setdefault(ex.query_id, {})[ex.pos.id] = 1
        return out


def _split_by_query(qids: list[str], fraction: float, seed: int) -> set[str]:
    uniq = sorted(set(qids))
    if fraction <= 0 or len(uniq) < 2:
        return set()
    rng = np.random.default_rng(seed)
    n_val = max(1, int(round(len(uniq) * fraction)))
    return set(rng.choice(uniq, size=n_val, replace=False).tolist())


def _qrels_rows(spec: DataSpec, root: Path, corpus, all_queries, seed: int, show_progress: bool, out_dir):
    """(query, positive, [negatives] or None, source) per judged pair of the train split, and the
    mining summary (dense / mixed negatives) or None."""
    qrels = load_qrels(qrels_path(root, spec.train_split), all_queries, corpus)
    positives = {q: [d for d, g in docs.items() if g > 0] for q, docs in qrels.items()}
    if spec.negatives in ("dense", "mixed"):
        return mined_rows(spec, corpus, all_queries, positives, seed, out_dir, show_progress)
    if spec.negatives != "bm25":
        return [(q, p, None, "qrels") for q, ps in sorted(positives.items()) for p in sorted(ps)], None
    bm25 = BM25Retriever.fit(corpus.values(), show_progress=show_progress)
    run = bm25.search({q: all_queries[q] for q in positives}, k=spec.neg_max_rank, show_progress=show_progress)
    if spec.num_negatives > 1:
        return bm25_rows(spec, run, positives, seed), None
    # one draw per (query, positive): seed the draw with the pair's position
    rows = []
    for i, (qid, pos_list) in enumerate(sorted(positives.items())):
        for j, pid in enumerate(sorted(pos_list)):
            neg = sample_hard_negatives(
                {qid: run.get(qid, {})},
                positives,
                spec.neg_skip_top,
                spec.neg_max_rank,
                seed=seed * 1_000_003 + i * 101 + j,
            )[qid]
            rows.append((qid, pid, [neg] if neg else None, "bm25"))
    return rows, None


def _example(q: str, text: str, pos: Document, negs: list[Document], source: str) -> Example:
    return Example(q, text, pos, negs[0] if negs else None, source, tuple(negs[1:]))


def load_training_data(
    spec: DataSpec, seed: int, show_progress: bool = True, out_dir: str | Path | None = None
) -> TrainingData:
    """The examples of ``spec``; ``out_dir`` (the run directory) receives ``mining_audit.jsonl``
    and, unless ``data.mining.cache_dir`` says otherwise, the mined-negative cache."""
    root = Path(spec.data_dir)
    corpus = load_corpus(root)  # any registered corpus format (scalingnote.data.corpus)
    all_queries = {q.id: q.text for q in load_queries(root / "queries.jsonl").values()}

    mining = None
    if spec.triplets:
        triplets = load_triplets(spec.triplets, all_queries, corpus)
        rows = [(t.query_id, t.pos_id, [t.neg_id] if t.neg_id else None, t.source) for t in triplets]
    else:
        rows, mining = _qrels_rows(spec, root, corpus, all_queries, seed, show_progress, out_dir)

    val_q = _split_by_query(
        [r[0] for r in rows], spec.validation_fraction if not spec.validation_triplets else 0.0, seed
    )
    examples = [_example(q, all_queries[q], corpus[p], [corpus[n] for n in negs or ()], s) for q, p, negs, s in rows]
    train = [e for e in examples if e.query_id not in val_q]
    validation = [e for e in examples if e.query_id in val_q]
    if spec.validation_triplets:
        vt = load_triplets(spec.validation_triplets, all_queries, corpus)
        validation = [
            Example(
                t.query_id, all_queries[t.query_id], corpus[t.pos_id], corpus[t.neg_id] if t.neg_id else None, t.source
            )
            for t in vt
        ]
    if spec.max_train_examples is not None and len(train) > spec.max_train_examples:
        rng = np.random.default_rng(seed)
        idx = np.sort(rng.choice(len(train), size=spec.max_train_examples, replace=False))
        train = [train[i] for i in idx]
    if not train:
        raise ScalingNoteError(f"{spec.data_dir}: no training examples (check the train split / triplets)")

    eval_qrels = None
    eval_queries: dict[str, str] = {}
    dropped = 0
    if spec.eval_split:
        eval_qrels = load_qrels(qrels_path(root, spec.eval_split), all_queries, corpus)
        train_q = {e.query_id for e in train} | {e.query_id for e in validation}
        leaked = sorted(set(eval_qrels) & train_q)
        if leaked and spec.eval_overlap == "error":
            raise ScalingNoteError(
                f"{len(leaked)} evaluation queries of split {spec.eval_split!r} are also training queries "
                f"(e.g. {leaked[0]!r}); "
                "set data.eval_overlap: drop to train without them"
            )
        if leaked:
            gone = set(leaked)
            dropped = len(gone)
            train = [e for e in train if e.query_id not in gone]
            validation = [e for e in validation if e.query_id not in gone]
            log.warning(
                "%d evaluation queries of split %r are also training queries: dropped from training",
                dropped,
                spec.eval_split,
            )
            if not train:
                raise ScalingNoteError(
                    f"{spec.data_dir}: no training examples left after dropping the evaluation queries"
                )
        qids = sorted(eval_qrels)
        if spec.max_eval_queries is not None:
            qids = qids[: spec.max_eval_queries]
            eval_qrels = {q: eval_qrels[q] for q in qids}
        eval_queries = {q: all_queries[q] for q in qids}
    return TrainingData(
        train, validation, corpus, all_queries, eval_qrels, eval_queries, dropped_eval_overlap=dropped, mining=mining
    )


def epoch_order(n: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The batches of one epoch: a permutation seeded by (seed, epoch), last partial batch dropped.

    Deterministic, so a resumed run re-derives the same order from the step counter alone.
    """
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return [perm[i : i + batch_size] for i in range(0, n - batch_size + 1, batch_size)]
