"""A saved tower stores what it trained over its base (the base named by path and fingerprint)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from scalingnote.data import Document
from scalingnote.errors import ConfigError
from scalingnote.models import load_tower
from scalingnote.models.towers.store import dir_bytes

QUERIES = ["how to make bread", "cheap flights", "a b c d e f"]
DOCS = [Document("d1", "Bread", "Flour, water and salt."), Document("d2", "Flights", "Book early for cheap fares.")]


def _train_top_layer(tower) -> None:
    """A stand-in for training: the top layer and the projection change, the rest stays the base's."""
    top = tower.backbone.encoder.layer[-1] if tower.kind == "bert" else tower.backbone.layers[-1]
    with torch.no_grad():
        for p in top.parameters():
            p.add_(0.01 * torch.randn_like(p))
        tower.projection.weight.mul_(1.5)


@pytest.fixture
def base_copy(tiny_dirs, tmp_path):
    """A private copy of a tiny base (the tests change or remove it)."""
    return {k: shutil.copytree(v, tmp_path / f"base_{k}") for k, v in tiny_dirs.items()}


@pytest.mark.parametrize("model,role", [("llama", "document"), ("bert", "query")])
def test_trained_layers_round_trip_and_only_they_are_stored(base_copy, tmp_path, model, role):
    t = load_tower(base_copy[model], role, device="cpu", dim=16, num_layers=2)
    _train_top_layer(t)
    enc = (
        (lambda x: x.encode_documents(DOCS, show_progress=False, normalize=False))
        if role == "document"
        else (lambda x: x.encode_queries(QUERIES, show_progress=False, normalize=False))
    )
    before, fp = enc(t), t.refresh_fingerprint()
    t.save(tmp_path / "t")
    meta = json.loads((tmp_path / "t" / "tower.json").read_text())
    assert meta["storage"] == "base+trained" and meta["base"]["path"] == str(base_copy[model].resolve())
    stored = meta["trained_tensors"]
    assert stored and all((".1." in k) for k in stored)  # only layer 1 (the top of 2) changed
    assert not (tmp_path / "t" / "tokenizer").exists()  # the base's tokenizer, placeholders included
    whole = tmp_path / "whole"
    t.save(whole, whole=True)
    assert dir_bytes(tmp_path / "t") < 0.75 * dir_bytes(whole)
    for d in (tmp_path / "t", whole):
        back = load_tower(d, verify=True)
        np.testing.assert_array_equal(enc(back), before)
        assert back.fingerprint == fp and back.config == t.config


def test_changed_or_missing_base_is_a_clear_error(base_copy, tmp_path):
    t = load_tower(base_copy["bert"], "query", device="cpu", dim=16)
    t.save(tmp_path / "t")
    sha = json.loads((tmp_path / "t" / "tower.json").read_text())["base"]["sha256"]
    weights = base_copy["bert"] / "model.safetensors"
    from safetensors.torch import load_file, save_file

    w = load_file(str(weights))
    k = next(iter(w))
    w[k] = w[k] + 1.0
    save_file(w, str(weights), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=f"base.*has changed.*{sha[:16]}") as e:
        load_tower(tmp_path / "t")
    assert str(base_copy["bert"]) in str(e.value) and "tower.json" in str(e.value)
    shutil.rmtree(base_copy["bert"])
    with pytest.raises(ConfigError, match=f"base model .*{sha[:16]}.*not found"):
        load_tower(tmp_path / "t")


def test_a_base_that_cannot_be_rebuilt_is_saved_whole(base_copy, tmp_path):
    t = load_tower(base_copy["bert"], "query", device="cpu", dim=16)
    t.config.base_model = str(tmp_path / "gone")  # built from something no longer on disk
    t.save(tmp_path / "t")
    meta = json.loads((tmp_path / "t" / "tower.json").read_text())
    assert meta["storage"] == "full" and (tmp_path / "t" / "backbone" / "model.safetensors").is_file()
    np.testing.assert_array_equal(
        load_tower(tmp_path / "t").encode_queries(QUERIES, show_progress=False),
        t.encode_queries(QUERIES, show_progress=False),
    )


def test_a_student_starts_from_a_saved_towers_backbone(base_copy, tmp_path):
    """``<tower>/backbone`` of a tower that stores only its trained parts is still a base model."""
    t = load_tower(base_copy["bert"], "query", device="cpu", dim=16)
    _train_top_layer(t)
    t.save(tmp_path / "teacher")
    s = load_tower(tmp_path / "teacher" / "backbone", "query", num_layers=3, dim=8, device="cpu")
    ref = t.backbone.encoder.layer[-1].output.dense.weight
    assert torch.equal(s.backbone.encoder.layer[-1].output.dense.weight, ref)
    s.save(tmp_path / "student")
    meta = json.loads((tmp_path / "student" / "tower.json").read_text())
    assert meta["storage"] == "base+trained" and meta["trained_tensors"] == [] and "fingerprint" in meta["base"]
    back = load_tower(tmp_path / "student")
    np.testing.assert_array_equal(
        back.encode_queries(QUERIES, show_progress=False), s.encode_queries(QUERIES, show_progress=False)
    )
