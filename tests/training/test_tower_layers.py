"""A Stage I run builds its towers from the layers its tower specs list."""

from __future__ import annotations

import pytest

from scalingnote.config import load_config
from scalingnote.errors import ScalingNoteError
from scalingnote.models import build_tiny_model
from scalingnote.training import TrainConfig
from scalingnote.training.towers import build_towers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage1_layers")
    return str(build_tiny_model(root / "bert", "bert", num_layers=3)), str(
        build_tiny_model(root / "llm", "llm", num_layers=3)
    )


def _cfg(method, q, d):
    return load_config(
        TrainConfig, {"method": method, "query_tower": q, "doc_tower": d, "dim": 8, "loss": {"dims": [8]}}
    )


def test_stage1_towers_keep_the_listed_layers(tiny):
    bert, llm = tiny
    qt, dt = build_towers(
        _cfg("twinbert", {"model": bert, "num_layers": 2, "layers": [0, 2]}, {"model": bert, "num_layers": 2}), "cpu"
    )
    assert (
        qt.config.base_layers == [0, 2]
        and dt.config.base_layers is None
        and qt.config.num_layers == dt.config.num_layers == 2
    )
    spec = {"model": llm, "num_layers": 2, "layers": [0, 2]}
    qt, dt = build_towers(_cfg("scaling_dual", spec, spec), "cpu")
    assert qt.config.base_layers == dt.config.base_layers == [0, 2]
    with pytest.raises(ScalingNoteError, match="layers"):
        build_towers(_cfg("scaling_dual", spec, {"model": llm, "num_layers": 2}), "cpu")
