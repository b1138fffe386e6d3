"""The student's start (:mod:`scalingnote.distill.student`): layer candidates scored on a small
head fit, the chosen one's head fitted again on the full sample."""

from __future__ import annotations

import json

import pytest
import torch

from tests.distill.test_qkd import _dcfg


def _more_queries(path, n=200):
    """``n`` extra distillation queries: the tiny fixture has fewer training queries than a
    least-squares head of its 32-wide student needs (2 x hidden)."""
    words = ["cell", "gene", "virus", "protein", "dose", "trial", "risk", "brain", "heart", "liver"]
    rows = [
        {"_id": f"x{i}", "text": f"{words[i % 10]} {words[i // 10 % 10]} {words[i // 100 % 10]} study {i}"}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_candidates_are_scored_on_a_small_head_fit_and_the_chosen_one_refit(stage1, tmp_path):
    from scalingnote.distill.data import prepare_data
    from scalingnote.distill.objective import qkd_validation_loss
    from scalingnote.distill.student import _student_start, build_student

    more = _more_queries(tmp_path / "more.jsonl")
    cfg = _dcfg(
        stage1,
        tmp_path / "choose",
        student={"model": stage1["bert"], "num_layers": 1, "max_length": 16},
        queries=[{"path": stage1["data"], "split": "train"}, {"path": more}],
        student_layer_candidates=[[0], [1]],
        layer_choice_samples=1,  # raised to 2 x hidden = 64: the least a fit needs
        head_init_samples=150,
    )
    data = prepare_data(cfg)
    dev = torch.device("cpu")
    assert len(data.train_idx) >= 150
    student, prefix, choice = build_student(cfg, data, dev)
    assert "fitted on 64 training queries" in choice["reason"]
    scored = []
    for layers in ([0], [1]):  # each candidate's figure is its 64-query start's validation loss
        st, pre = _student_start(cfg, data, dev, layers, scoring=True)
        scored.append(qkd_validation_loss(cfg, st, pre, data, dev, False))
    assert [t["val_loss"] for t in choice["tried"]] == pytest.approx(scored, abs=1e-5)
    full, _ = _student_start(cfg, data, dev, choice["layers"])  # the full 150-query fit
    small, _ = _student_start(cfg, data, dev, choice["layers"], scoring=True)
    torch.testing.assert_close(student.projection.weight, full.projection.weight)
    assert not torch.allclose(small.projection.weight, full.projection.weight)  # the refit changed the head


def test_layer_choice_samples_must_be_positive(stage1, tmp_path):
    with pytest.raises(ValueError, match="layer_choice_samples"):
        _dcfg(stage1, tmp_path / "bad", layer_choice_samples=0)
