"""Stage I over cached token states: trained top layers on both towers, LoRA on those layers."""

from __future__ import annotations

import pytest
import torch

from scalingnote.training import StopTraining, train
from tests.training.test_trainer import _cfg, _weights

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


@pytest.mark.parametrize("lora", [False, True], ids=["layers", "lora"])
def test_scaling_dual_top_layer_training_resumes_and_saves_plain_towers(tiny, tmp_path, lora):
    from scalingnote.models import load_tower

    over = dict(
        query_tower={"trainable_layers": 1}, doc_tower={"trainable_layers": 1}, feature_cache_dir=str(tmp_path / "fc")
    )
    if lora:
        over["lora"] = LORA
    full = tmp_path / "full"
    res = train(_cfg(tiny, full, **over))
    assert res["doc_trainable_layers"] == 1
    assert list((tmp_path / "fc").glob("document-d1-tokens-*")) and list((tmp_path / "fc").glob("query-d1-tokens-*"))
    killed = tmp_path / "killed"

    def kill(step):
        if step == 3:
            raise StopTraining

    with pytest.raises(StopTraining):
        train(_cfg(tiny, killed, **over), on_step=kill)
    train(_cfg(tiny, killed, **over), resume=True)
    a, b = _weights(full), _weights(killed)
    assert a.keys() == b.keys() and not any("lora" in k for k in a)  # adapters merged into plain weights
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    base = load_tower(tiny["llm"], "document")
    saved = dict(load_tower(full / "doc_tower").backbone.named_parameters())
    for n, p in base.backbone.named_parameters():
        moved = not torch.equal(p, saved[n])
        top = n.startswith("layers.1.") or n == "norm.weight"  # the top layer and the final norm above it
        assert moved == (top and (not lora or "q_proj" in n or "v_proj" in n)), n  # with LoRA: its adapted weights only


def test_lora_with_heads_only_towers_is_refused(tiny, tmp_path):
    with pytest.raises(ValueError, match="lora needs trainable layers"):
        _cfg(tiny, tmp_path, query_tower={"trainable_layers": 0}, doc_tower={"trainable_layers": 0}, lora=LORA)
