"""The listwise term of QKD: its loss, the teacher's top-k documents, and a run that uses it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from scalingnote.distill.loss import qkd_rank_loss
from scalingnote.distill.ranking import teacher_ranking
from scalingnote.errors import ConfigError, ScalingNoteError
from tests.distill.test_qkd import _dcfg


def test_rank_loss_is_the_kl_of_the_two_softmaxes():
    t = torch.tensor([[0.9, 0.5, 0.1], [0.2, 0.3, 0.4]])
    s = torch.tensor([[0.1, 0.5, 0.9], [0.2, 0.3, 0.4]])
    tau = 0.1
    p, q = torch.softmax(t / tau, -1), torch.softmax(s / tau, -1)
    want = float((p * (p.log() - q.log())).sum(-1).mean())
    assert float(qkd_rank_loss(t, s, tau)) == pytest.approx(want, rel=1e-5)
    assert float(qkd_rank_loss(t, t, tau)) == pytest.approx(0.0, abs=1e-7)  # same order and gaps: nothing to learn
    assert float(qkd_rank_loss(t, t + 0.3, tau)) == pytest.approx(
        0.0, abs=1e-6
    )  # a shift of every score changes no softmax
    assert want > 0.5


def test_teacher_ranking_is_the_exact_top_k(tmp_path):
    rng = np.random.default_rng(0)
    docs = rng.normal(size=(50, 8)).astype(np.float32) * rng.uniform(0.5, 3, size=(50, 1)).astype(np.float32)
    np.save(tmp_path / "doc_embeddings.npy", docs)
    q = rng.normal(size=(7, 8)).astype(np.float32)
    r = teacher_ranking(tmp_path, q, k=5, batch_size=3)
    cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (docs / np.linalg.norm(docs, axis=1, keepdims=True)).T
    want = np.argsort(-cos, axis=1)[:, :5]
    np.testing.assert_array_equal(r.topk, want)
    np.testing.assert_allclose(r.scores, np.take_along_axis(cos, want, 1), atol=1e-5)
    # the student's scores of those documents: its cosines, gradients flowing
    qs = torch.tensor(q[[2, 4]] * 2.0, requires_grad=True)
    ts, ss = r.batch(np.array([2, 4]), qs)
    np.testing.assert_allclose(
        ss.detach().numpy(), ts.numpy(), atol=1e-5
    )  # same direction as the teacher: same cosines
    ss.sum().backward()
    assert qs.grad is not None and float(qs.grad.abs().sum()) > 0
    with pytest.raises(
        ScalingNoteError, match=r"doc_embeddings\.npy: document embeddings have dim 8, the teacher's query embeddings 4"
    ):
        teacher_ranking(tmp_path, q[:, :4], k=5)


def test_distill_with_the_rank_term_trains_and_records_it(stage1, tmp_path):
    from scalingnote.distill import distill

    res = distill(_dcfg(stage1, tmp_path / "rank", target="normalized", rank_weight=1.0, rank_k=4))
    log = [json.loads(x) for x in (tmp_path / "rank" / "metrics.jsonl").read_text().splitlines()]
    assert res["rank_weight"] == 1.0 and log[-1]["loss"] < log[0]["loss"]
    plain = distill(_dcfg(stage1, tmp_path / "plain", target="normalized"))
    assert plain["rank_weight"] == 0.0
    assert res["qkd_train_loss"] != pytest.approx(plain["qkd_train_loss"])  # the term changed what was trained


def test_rank_options_are_checked(stage1, tmp_path):
    with pytest.raises(ConfigError, match=r"rank_weight must be >= 0, rank_k >= 2 and rank_tau > 0; got 1\.0, 1, "):
        _dcfg(stage1, tmp_path / "x", rank_weight=1.0, rank_k=1)
