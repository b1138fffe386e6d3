"""``init_heads_from``: heads trained first over cached pooled states, then the top layers start from them."""

from __future__ import annotations

import pytest
import torch

from scalingnote.errors import ConfigError
from scalingnote.training import train
from tests.training.test_trainer import _cfg


def _over(tmp_path, k: int, **more):
    return dict(
        query_tower={"trainable_layers": k},
        doc_tower={"trainable_layers": k},
        feature_cache_dir=str(tmp_path / "fc"),
        feature_cache_dtype="float32",
        **more,
    )


def test_layers_start_from_the_trained_heads(tiny, tmp_path):
    from scalingnote.models import load_tower
    from scalingnote.training.heads import load_heads
    from scalingnote.training.towers import build_towers

    heads = train(_cfg(tiny, tmp_path / "heads", **_over(tmp_path, 0)))
    cfg = _cfg(
        tiny,
        tmp_path / "layers",
        **_over(tmp_path, 1, init_heads_from=str(tmp_path / "heads"), evaluate_zero_shot=True),
    )
    qt, dt = build_towers(cfg, torch.device("cpu"))
    load_heads(qt, dt, tmp_path / "heads")
    for side, t in (("query", qt), ("doc", dt)):
        saved = load_tower(tmp_path / "heads" / f"{side}_tower")
        torch.testing.assert_close(t.projection.weight, saved.projection.weight, rtol=0, atol=0)
        torch.testing.assert_close(t.center, saved.center, rtol=0, atol=0)
    warm = train(cfg)
    # the layer run starts where the heads run ended: same towers, same heads, same evaluation
    assert warm["init_heads_from"] == str(tmp_path / "heads")
    assert warm["zero_shot_ndcg@10"] == pytest.approx(heads["ndcg@10"], abs=1e-3)


def test_heads_from_another_depth_or_a_missing_run_are_refused(tiny, tmp_path):
    from scalingnote.training.heads import load_heads
    from scalingnote.training.towers import build_towers

    train(_cfg(tiny, tmp_path / "heads", **_over(tmp_path, 0)))
    shallow = _cfg(tiny, tmp_path / "x", **_over(tmp_path, 0))
    shallow.query_tower.num_layers = shallow.doc_tower.num_layers = 1
    qt, dt = build_towers(shallow, torch.device("cpu"))
    with pytest.raises(ConfigError, match="config.num_layers"):
        load_heads(qt, dt, tmp_path / "heads")
    with pytest.raises(ConfigError, match="not a finished Stage I run"):
        train(_cfg(tiny, tmp_path / "y", **_over(tmp_path, 1, init_heads_from=str(tmp_path / "nowhere"))))


def test_changed_heads_make_the_run_refuse_its_checkpoints(tiny, tmp_path):
    from scalingnote.training.driver import stage1_inputs
    from scalingnote.utils.steps import input_digest

    train(_cfg(tiny, tmp_path / "heads", **_over(tmp_path, 0)))
    cfg = _cfg(tiny, tmp_path / "layers", **_over(tmp_path, 1, init_heads_from=str(tmp_path / "heads")))
    before = input_digest(stage1_inputs(cfg))
    f = tmp_path / "heads" / "doc_tower" / "projection.safetensors"
    f.write_bytes(f.read_bytes() + b" ")  # another head file: another input
    assert input_digest(stage1_inputs(cfg)) != before
