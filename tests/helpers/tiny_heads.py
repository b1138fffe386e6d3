"""A head-only training session (:mod:`scalingnote.scaling.points`) on a tiny random LLM and the
tiny BEIR directory, for the tests of converged head points and of fusion towers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.tiny_data import tiny_inputs


@dataclass
class TinyHeads:
    session: Any  #: HeadSession over the tiny corpus
    cfg: Any  #: its TrainConfig
    corpus: dict  #: doc id -> Document
    queries: dict[str, str]  #: query id -> text
    data: Path  #: the BEIR directory
    train_qrels: dict
    test_qrels: dict


def tiny_head_session(root: Path, docs_per_topic: int) -> TinyHeads:
    """Both towers the same tiny 2-layer LLM (frozen, mean pooling, 16-d heads initialised by
    PCA), pooled features cached under ``root/features``."""
    import torch

    from scalingnote.config import load_config
    from scalingnote.data import load_corpus, load_qrels, load_queries
    from scalingnote.data.beir import qrels_path
    from scalingnote.scaling.points import HeadSession
    from scalingnote.training import TrainConfig

    torch.set_num_threads(1)
    paths = tiny_inputs(root, "llm", docs_per_topic=docs_per_topic)
    llm, data = paths["llm"], Path(paths["data"])
    corpus = load_corpus(data / "corpus.jsonl")
    queries = {q.id: q.text for q in load_queries(data / "queries.jsonl").values()}
    train_qrels = load_qrels(qrels_path(data, "train"), queries, corpus)
    test_qrels = load_qrels(qrels_path(data, "test"), queries, corpus)
    cfg = load_config(
        TrainConfig,
        {
            "method": "scaling_dual",
            "output_dir": str(root / "run"),
            "query_tower": {"model": llm, "max_length": 16, "pooling": "mean", "trainable_layers": 0},
            "doc_tower": {"model": llm, "max_length": 96, "pooling": "mean", "trainable_layers": 0},
            "dim": 16,
            "loss": {"dims": [8, 16]},
            "data": {"data_dir": str(data), "negatives": "none"},
            "projection_init": "pca",
            "center_samples": 64,
            "feature_cache_dir": str(root / "features"),
            "show_progress": False,
        },
    )
    return TinyHeads(HeadSession(cfg, corpus), cfg, corpus, queries, data, train_qrels, test_qrels)
