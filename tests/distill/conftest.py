"""Fixtures of the QKD tests: a Stage I teacher trained on tiny random towers (once per module)."""

from __future__ import annotations

import pytest

from scalingnote.config import load_config
from scalingnote.models import build_tiny_model
from scalingnote.training import TrainConfig, train
from tests.helpers.tiny_data import write_tiny_beir


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    root = tmp_path_factory.mktemp("qkd")
    llm = build_tiny_model(root / "llm", "llm", num_layers=2)
    bert = build_tiny_model(root / "bert", "bert", num_layers=2)
    data = write_tiny_beir(root / "beir")
    cfg = load_config(
        TrainConfig,
        {
            "method": "scaling_dual",
            "output_dir": str(root / "stage1"),
            "query_tower": {"model": str(llm), "max_length": 16},
            "doc_tower": {"model": str(llm), "max_length": 96},
            "dim": 32,
            "data": {"data_dir": str(data), "neg_skip_top": 1, "neg_max_rank": 8},
            "loss": {"dims": [8, 16, 32]},
            "optim": {"batch_size": 8, "epochs": 2.0, "lr": 1e-3, "head_lr": 1e-2},
            "show_progress": False,
        },
    )
    train(cfg)
    return {"root": root, "bert": str(bert), "data": str(data), "stage1": root / "stage1"}
