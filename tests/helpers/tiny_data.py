"""A tiny, learnable BEIR directory for fast end-to-end tests (written in code, seeded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scalingnote.data import Document, Query, write_beir

TOPICS = {
    "fox": ["quick", "brown", "fox", "jumps", "dog"],
    "retrieval": ["dense", "retrieval", "queries", "documents", "vector"],
    "model": ["large", "language", "model", "encodes", "small"],
    "scaling": ["scaling", "laws", "size", "data", "quality"],
    "vitamin": ["vitamin", "deficiency", "risk", "fractures", "associated"],
    "pq": ["product", "quantization", "compresses", "codes", "search"],
}


def write_tiny_beir(root: Path, docs_per_topic: int = 8, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    docs, queries = [], []
    qrels_train: dict[str, dict[str, int]] = {}
    qrels_test: dict[str, dict[str, int]] = {}
    n = 0
    for t, words in TOPICS.items():
        for i in range(docs_per_topic):
            w = rng.choice(words, size=6).tolist()
            docs.append(Document(f"d{n}", f"{t} {w[0]}", t, " ".join(w)))
            qid = f"q{n}"
            queries.append(Query(qid, " ".join(rng.choice(words, size=3).tolist())))
            (qrels_test if i == 0 else qrels_train)[qid] = {f"d{n}": 1}
            n += 1
    write_beir(root, docs, queries, {"train": qrels_train, "test": qrels_test})
    return root


def tiny_inputs(root: Path, *models: str, data: bool = True, docs_per_topic: int = 8) -> dict[str, str]:
    """Paths (as strings) of tiny random 2-layer models, one per kind in ``models`` ("llm",
    "bert") at ``root/<kind>``, and with ``data`` the tiny BEIR directory ``root/beir`` (key "data")."""
    from scalingnote.models import build_tiny_model

    out = {kind: str(build_tiny_model(root / kind, kind, num_layers=2)) for kind in models}
    if data:
        out["data"] = str(write_tiny_beir(root / "beir", docs_per_topic=docs_per_topic))
    return out
