"""Converged head-only points (scalingnote.scaling.points) on tiny random towers: training lowers
the dev loss, the best weights are kept, every point starts from the same heads, scoring is on
fixed tuples, and a finished point is not retrained."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalingnote.errors import ConfigError
from scalingnote.scaling.points import HeadSession, PointSettings, make_eval_set, run_point, score, train_point
from scalingnote.training.data import Example
from tests.helpers.tiny_heads import tiny_head_session


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    h = tiny_head_session(root, docs_per_topic=10)
    queries, train_qrels, session = h.queries, h.train_qrels, h.session
    qids = sorted(train_qrels)
    dev_q = set(qids[::6])
    train = [Example(q, queries[q], h.corpus[d], None, "human") for q in qids if q not in dev_q for d in train_qrels[q]]
    dev = make_eval_set(
        queries, {q: train_qrels[q] for q in dev_q}, session.doc_ids, num_negatives=16, seed=1, name="dev"
    )
    test = make_eval_set(queries, h.test_qrels, session.doc_ids, num_negatives=16, seed=0, name="test")
    return {
        "session": session,
        "train": train,
        "dev": dev,
        "test": test,
        "root": root,
        "cfg": h.cfg,
        "corpus": h.corpus,
    }


def test_point_trains_to_a_lower_dev_loss_and_keeps_the_best(setup, tmp_path):
    s = setup["session"]
    rec = train_point(
        s,
        setup["train"],
        setup["dev"],
        tmp_path / "p",
        PointSettings(head_lr=1e-2, batch_size=8, max_steps=300, min_eval_every=5, patience=4),
    )
    curve = rec["dev_curve"]
    assert curve[0][0] == 0 and len(curve) >= 2
    best = min(v for _, v in curve)
    assert rec["dev_contrastive_ppl"] == pytest.approx(best, abs=1e-4)
    assert rec["dev_contrastive_ppl"] < rec["start_dev_contrastive_ppl"]  # learnable toy data
    # the towers hold the restored best heads: scoring the dev set again gives the best value
    again = score(s, setup["dev"], per_query=False)["contrastive_ppl"]
    assert again == pytest.approx(best, abs=1e-4)


def test_points_start_from_the_same_heads(setup, tmp_path):
    s = setup["session"]
    w0 = s.qt.projection.weight.detach().clone()
    s.reset()
    first = s.qt.projection.weight.detach().clone()
    train_point(
        s,
        setup["train"][:16],
        setup["dev"],
        tmp_path / "a",
        PointSettings(batch_size=8, max_steps=20, min_eval_every=5),
    )
    assert not np.allclose(s.qt.projection.weight.detach().numpy(), first.numpy())
    s.reset()
    assert np.allclose(s.qt.projection.weight.detach().numpy(), first.numpy())
    del w0


def test_scores_use_fixed_tuples_and_per_query_values(setup):
    s, test = setup["session"], setup["test"]
    s.reset()
    a = score(s, test)
    b = score(s, test)
    assert a["contrastive_ppl"] == b["contrastive_ppl"]
    assert set(a["per_query"]) == set(test.qrels)
    assert all(len(v) == 3 for v in a["per_query"].values())  # ndcg@10, r@100, contrastive ppl
    assert np.mean([v[0] for v in a["per_query"].values()]) == pytest.approx(a["ndcg@10"])
    # same seed -> same negatives; another seed -> other negatives
    again = make_eval_set(
        dict(zip(test.query_ids, test.texts, strict=True)), test.qrels, s.doc_ids, num_negatives=16, seed=0
    )
    other = make_eval_set(
        dict(zip(test.query_ids, test.texts, strict=True)), test.qrels, s.doc_ids, num_negatives=16, seed=3
    )
    assert np.array_equal(again.cset.neg, test.cset.neg) and not np.array_equal(other.cset.neg, test.cset.neg)


def test_run_point_resumes(setup, tmp_path):
    s = setup["session"]
    st = PointSettings(batch_size=8, max_steps=10, min_eval_every=5)
    r1 = run_point(s, setup["train"][:16], setup["dev"], setup["test"], tmp_path / "r", st, extra={"key": "k1"})
    stamp = (tmp_path / "r" / "point.json").stat().st_mtime_ns
    r2 = run_point(s, setup["train"][:16], setup["dev"], setup["test"], tmp_path / "r", st, extra={"key": "k1"})
    assert (tmp_path / "r" / "point.json").stat().st_mtime_ns == stamp and r2 == json.loads(json.dumps(r1))
    assert {"test_contrastive_ppl", "ndcg@10", "r@100", "dev_contrastive_ppl", "steps_run"} <= set(r1)


def test_session_refuses_full_fine_tuning(setup):
    import dataclasses

    cfg = setup["cfg"]
    bad = dataclasses.replace(cfg, query_tower=dataclasses.replace(cfg.query_tower, trainable_layers="all"))
    with pytest.raises(ConfigError, match="trainable_layers"):
        HeadSession(bad, setup["corpus"])


def test_fast_encode_equals_the_prefix_tower_path(setup):
    s = setup["session"]
    s.reset()
    from scalingnote.evaluation.dense import truncate_normalize

    fast = s.encode(docs=True)
    slow = truncate_normalize(s.d_enc.encode(s.docs, batch_size=7), s.cfg.dim)
    assert np.allclose(fast, slow, atol=1e-5)
    texts = setup["test"].texts
    assert np.allclose(s.encode(texts), truncate_normalize(s.q_enc.encode(texts, batch_size=3), s.cfg.dim), atol=1e-5)
