"""Metrics recomputed independently from what a run saved, so a test can check that a reported
figure is the saved model's figure (not a number from the wrong towers, rows or qrels)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def saved_ndcg10(
    query_tower: str | Path, doc_dir: str | Path, data_dir: str | Path, split: str = "test", dim: int | None = None
) -> float:
    """nDCG@10 on ``data_dir``'s ``split`` of the saved ``query_tower`` against the document
    embeddings saved in ``doc_dir`` (``doc_embeddings.npy`` + ``doc_ids.json``): exhaustive
    cosine ranking in NumPy, scored by :func:`scalingnote.evaluation.evaluate`."""
    from scalingnote.data import load_qrels, load_queries
    from scalingnote.evaluation import evaluate
    from scalingnote.models import load_tower

    qrels = load_qrels(Path(data_dir) / "qrels" / f"{split}.tsv")
    queries = load_queries(Path(data_dir) / "queries.jsonl")
    qids = sorted(qrels)
    q = np.asarray(
        load_tower(query_tower).encode_queries([queries[x].text for x in qids], show_progress=False), dtype=np.float64
    )
    d = np.load(Path(doc_dir) / "doc_embeddings.npy").astype(np.float64)
    ids = json.loads((Path(doc_dir) / "doc_ids.json").read_text(encoding="utf-8"))
    q, d = q[:, :dim], d[:, :dim]
    scores = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (d / np.linalg.norm(d, axis=1, keepdims=True)).T
    run = {qid: dict(zip(ids, map(float, row), strict=True)) for qid, row in zip(qids, scores, strict=True)}
    return float(evaluate(run, qrels, ["ndcg@10"])["ndcg@10"])
