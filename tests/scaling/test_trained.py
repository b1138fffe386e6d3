"""Scaling points whose every layer trains (scalingnote.scaling.trained) on a tiny random BERT:
exactly the non-embedding parameters train, every transformer layer moves, each point starts
from the same pre-trained weights, and a validation on a document pool scores only that pool."""

from __future__ import annotations

import numpy as np
import pytest

from scalingnote.errors import ConfigError
from scalingnote.scaling.points import PointSettings, make_eval_set, run_point, score, train_point
from scalingnote.training.data import Example
from tests.helpers.tiny_data import tiny_inputs


def _cfg(paths, root, trainable="all"):
    from scalingnote.config import load_config
    from scalingnote.training import TrainConfig

    bert = {"model": paths["bert"], "trainable_layers": trainable}
    return load_config(
        TrainConfig,
        {
            "method": "twinbert",
            "output_dir": str(root / "run"),
            "dim": 16,
            "loss": {"dims": [8, 16]},
            "query_tower": {**bert, "max_length": 16},
            "doc_tower": {**bert, "max_length": 48},
            "data": {"data_dir": paths["data"], "negatives": "none"},
            "projection_init": "pca",
            "center_samples": 32,
            "feature_cache_dir": str(root / "features"),
            "show_progress": False,
        },
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch

    from scalingnote.data import load_corpus, load_qrels, load_queries
    from scalingnote.data.beir import qrels_path
    from scalingnote.scaling.trained import TowerSession

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("trained")
    paths = tiny_inputs(root, "bert", docs_per_topic=6)
    data = root / "beir"
    corpus = load_corpus(data / "corpus.jsonl")
    queries = {q.id: q.text for q in load_queries(data / "queries.jsonl").values()}
    train_qrels = load_qrels(qrels_path(data, "train"), queries, corpus)
    test_qrels = load_qrels(qrels_path(data, "test"), queries, corpus)
    qids = sorted(train_qrels)
    dev_q = set(qids[::5])
    train = [Example(q, queries[q], corpus[d], None, "human") for q in qids if q not in dev_q for d in train_qrels[q]]
    dev_docs = sorted({d for q in dev_q for d in train_qrels[q]} | set(list(corpus)[::3]))
    dev = make_eval_set(
        queries, {q: train_qrels[q] for q in dev_q}, dev_docs, num_negatives=8, seed=1, name="dev", pool=True
    )
    test = make_eval_set(queries, test_qrels, list(corpus), num_negatives=8, seed=0, name="test")
    session = TowerSession(_cfg(paths, root), corpus, batch_size=16)
    return {
        "session": session,
        "train": train,
        "dev": dev,
        "test": test,
        "paths": paths,
        "root": root,
        "corpus": corpus,
    }


def test_exactly_the_non_embedding_parameters_train(setup):
    s = setup["session"]
    for t, role in ((s.qt, "query"), (s.dt, "doc")):
        assert s.trainable[role] == t.non_embedding_params > 0
        frozen = [n for n, p in t.named_parameters() if not p.requires_grad]
        assert frozen and all("embeddings" in n for n in frozen)


def test_every_layer_trains_and_points_start_from_the_same_weights(setup, tmp_path):
    s = setup["session"]
    s.reset()
    before = {n: p.detach().clone() for n, p in s.qt.named_parameters()}
    rec = train_point(
        s,
        setup["train"],
        setup["dev"],
        tmp_path / "p",
        PointSettings(
            lr=1e-3,
            head_lr=1e-2,
            batch_size=8,
            max_steps=12,
            min_eval_every=4,
            max_eval_every=4,
            schedule="constant",
            warmup_steps=2,
        ),
    )
    assert rec["steps_run"] >= 4 and rec["dev_curve"][0][0] == 0
    moved = {n for n, p in s.qt.named_parameters() if not np.allclose(p.detach().numpy(), before[n].numpy())}
    for i in range(2):  # both transformer layers of the tiny BERT
        assert any(f"layer.{i}." in n for n in moved), sorted(moved)
    assert not any("word_embeddings" in n for n in moved)
    # the towers hold the restored best weights: the dev pool scores the best value again
    again = score_dev(s, setup["dev"])
    assert again == pytest.approx(rec["dev_contrastive_ppl"], abs=1e-4)
    s.reset()
    assert all(np.allclose(p.detach().numpy(), before[n].numpy()) for n, p in s.qt.named_parameters())


def score_dev(s, dev) -> float:
    from scalingnote.evaluation import contrastive_perplexity

    d = s.encode(docs=True, doc_ids=dev.doc_ids)
    assert d.shape[0] == len(dev.doc_ids) < len(s.doc_ids)  # only the pool is encoded
    return contrastive_perplexity(
        s.encode(dev.texts), dev.query_ids, d, dev.doc_ids, dev.cset, temperature=s.cfg.loss.tau
    )


def test_pool_documents_encode_like_the_corpus(setup):
    s = setup["session"]
    s.reset()
    full = s.encode(docs=True)
    pos = {d: i for i, d in enumerate(s.doc_ids)}
    part = s.encode(docs=True, doc_ids=setup["dev"].doc_ids)
    assert np.allclose(part, full[[pos[d] for d in setup["dev"].doc_ids]], atol=1e-5)


def test_run_point_scores_on_the_whole_corpus(setup, tmp_path):
    s = setup["session"]
    rec = run_point(
        s,
        setup["train"][:16],
        setup["dev"],
        setup["test"],
        tmp_path / "r",
        PointSettings(batch_size=8, max_steps=4, min_eval_every=2),
        extra={"key": "k"},
    )
    assert rec["non_embedding_params"]["query"] == s.qt.non_embedding_params
    sc = score(s, setup["test"], per_query=False)
    assert sc["contrastive_ppl"] == pytest.approx(rec["test_contrastive_ppl"], abs=1e-5)


def test_a_cached_prefix_config_is_refused(setup):
    from scalingnote.scaling.trained import TowerSession

    with pytest.raises(ConfigError, match="trainable_layers"):
        TowerSession(_cfg(setup["paths"], setup["root"], trainable=1), setup["corpus"])
