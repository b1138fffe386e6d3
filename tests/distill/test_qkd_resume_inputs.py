"""QKD resumes only from checkpoints made from the same inputs: another query source
or a retrained teacher is refused naming what changed, or redone from scratch."""

from __future__ import annotations

import json

import pytest
import torch

from scalingnote.distill import distill
from scalingnote.models import load_tower
from scalingnote.training import StopTraining
from scalingnote.utils.steps import StepChangedError
from tests.distill.test_qkd import _dcfg
from tests.helpers.tiny_data import write_tiny_beir


def _killed(cfg):
    def kill(step):
        if step == 3:
            raise StopTraining

    with pytest.raises(StopTraining):
        distill(cfg, on_step=kill)


def test_other_queries_refused_then_redone(stage1, tmp_path):
    out = tmp_path / "qkd"
    _killed(_dcfg(stage1, out))
    other = write_tiny_beir(tmp_path / "other", seed=5)
    changed = _dcfg(stage1, out, queries=[{"path": str(other), "split": "train"}])
    with pytest.raises(StepChangedError) as e:
        distill(changed)
    assert (
        "queries.0.path" in e.value.keys
        and all(k.startswith("queries.") for k in e.value.keys)
        and str(other) in str(e.value)
    )

    distill(changed, on_change="redo")
    fresh = tmp_path / "fresh"
    distill(_dcfg(stage1, fresh, queries=[{"path": str(other), "split": "train"}]))
    a, b = load_tower(fresh / "query_tower").state_dict(), load_tower(out / "query_tower").state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    assert json.loads((out / "checkpoints" / "DONE").read_text())["inputs"]["queries"][0]["path"]["$path"] == str(other)


def test_a_changed_teacher_is_refused(stage1, tmp_path):
    import shutil

    teacher = tmp_path / "teacher"
    shutil.copytree(stage1["stage1"], teacher)
    cfg = _dcfg(stage1, tmp_path / "qkd", teacher=str(teacher))
    _killed(cfg)
    emb = teacher / "doc_embeddings.npy"
    import numpy as np

    np.save(emb, np.load(emb) * 1.0001)  # Stage I re-run: other document embeddings in the same place
    with pytest.raises(StepChangedError, match="teacher.doc_embeddings"):
        distill(cfg)
