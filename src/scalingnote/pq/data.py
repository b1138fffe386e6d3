"""The data and towers of a TMJ run: corpus, query splits and qrels (:class:`PQData`), and the
query / document towers built from the config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.data import Document, Qrels, load_corpus, load_qrels, load_queries
from scalingnote.data.beir import qrels_path
from scalingnote.errors import ScalingNoteError
from scalingnote.models import load_tower
from scalingnote.models.loading import resolve_source
from scalingnote.pq.config import PQDataSpec, PQTowers


# ----------------------------------------------------------------------------- data
@dataclass
class PQData:
    """Corpus (row order = ``docs``), training queries with positive rows, evaluation queries."""

    docs: list[Document]
    train_qids: list[str]
    train_texts: list[str]
    train_pos: list[set[int]]
    eval_qids: list[str]
    eval_texts: list[str]
    eval_qrels: Qrels
    val_qids: list[str]
    val_texts: list[str]
    val_qrels: Qrels

    @property
    def doc_ids(self) -> list[str]:
        return [d.id for d in self.docs]


def load_pq_data(spec: PQDataSpec, seed: int = 0) -> PQData:
    """Read a BEIR directory: corpus, queries, ``qrels/<train_split>`` positives (grade > 0),
    ``qrels/<eval_split>``; hold out ``validation_fraction`` of the training queries."""

    root = Path(spec.data_dir)
    corpus = load_corpus(root)  # any registered corpus format (scalingnote.data.corpus)
    queries = {q.id: q.text for q in load_queries(root / "queries.jsonl").values()}
    docs = list(corpus.values())
    row = {d.id: i for i, d in enumerate(docs)}
    tr = load_qrels(qrels_path(root, spec.train_split), queries, corpus)
    pos = {q: {row[d] for d, g in ds.items() if g > 0} for q, ds in sorted(tr.items())}
    qids = [q for q, p in pos.items() if p]
    if spec.max_train_queries is not None:
        qids = qids[: spec.max_train_queries]
    val: list[str] = []
    if spec.validation_fraction > 0 and len(qids) > 1:
        rng = np.random.default_rng(seed)
        n_val = max(1, int(round(len(qids) * spec.validation_fraction)))
        val = sorted(rng.choice(qids, size=n_val, replace=False).tolist())
    vset = set(val)
    train = [q for q in qids if q not in vset]
    if not train:
        raise ScalingNoteError(f"{qrels_path(root, spec.train_split)}: no training query with a relevant document")
    eval_qids: list[str] = []
    eval_qrels: Qrels = {}
    if spec.eval_split:
        eq = load_qrels(qrels_path(root, spec.eval_split), queries, corpus)
        leaked = sorted(set(eq) & set(train))
        if leaked:
            raise ScalingNoteError(
                f"{len(leaked)} queries of split {spec.eval_split!r} are also training queries (e.g. {leaked[0]!r})"
            )
        eval_qids = sorted(q for q, ds in eq.items() if any(g > 0 for g in ds.values()))
        if spec.max_eval_queries is not None:
            eval_qids = eval_qids[: spec.max_eval_queries]
        eval_qrels = {q: eq[q] for q in eval_qids}
    val_qrels = {q: {docs[r].id: 1 for r in pos[q]} for q in val}
    return PQData(
        docs=docs,
        train_qids=train,
        train_texts=[queries[q] for q in train],
        train_pos=[pos[q] for q in train],
        eval_qids=eval_qids,
        eval_texts=[queries[q] for q in eval_qids],
        eval_qrels=eval_qrels,
        val_qids=val,
        val_texts=[queries[q] for q in val],
        val_qrels=val_qrels,
    )


def build_towers(spec: PQTowers, seed: int = 0):
    """(query tower, document tower): base models get a projection to ``spec.dim``; saved tower
    directories are loaded as saved."""

    def one(name: str, role: str, max_len: int):
        if resolve_source(name).form == "tower":
            return load_tower(name, role)
        kw: dict[str, Any] = {"max_query_length": max_len} if role == "query" else {"max_doc_length": max_len}
        return load_tower(
            name, role, dim=spec.dim, num_layers=spec.num_layers, pooling=spec.pooling, projection_seed=seed, **kw
        )

    q = one(spec.query_model, "query", spec.query_max_length)
    d = one(spec.doc_model, "document", spec.doc_max_length)
    if q.out_dim != d.out_dim:
        raise ScalingNoteError(f"towers: query tower outputs {q.out_dim}-d vectors, document tower {d.out_dim}-d")
    return q, d
