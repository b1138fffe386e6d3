"""Which layers a tower keeps: the first N or a listed subset (a student's start)."""

from __future__ import annotations

import pytest
import torch

from scalingnote.errors import ConfigError
from scalingnote.models import build_tiny_model, load_tower
from scalingnote.models.layers import start_candidates


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("layers")
    return build_tiny_model(root / "bert", "bert", num_layers=3), build_tiny_model(root / "llm", "llm", num_layers=3)


@pytest.mark.parametrize("kind", [0, 1])
def test_a_tower_keeps_the_listed_layers_and_saves_them(tiny, kind, tmp_path):
    base = load_tower(tiny[kind], "query", dim=8)
    t = load_tower(tiny[kind], "query", dim=8, layers=[0, 2])
    assert t.config.num_layers == 2 and t.config.base_layers == [0, 2] and t.config.base_num_layers == 3
    pb, pt = dict(base.backbone.named_parameters()), dict(t.backbone.named_parameters())
    moved = {n: n.replace(".2.", ".1.", 1) for n in pb if ".2." in n}  # base layer 2 is the tower's layer 1
    assert moved and all(torch.equal(pb[a], pt[b]) for a, b in moved.items())
    assert t.fingerprint != load_tower(tiny[kind], "query", dim=8, num_layers=2).fingerprint
    t.save(tmp_path / "t")
    again = load_tower(tmp_path / "t")
    x = ["alpha beta", "gamma delta epsilon"]
    assert again.config.base_layers == [0, 2]
    assert torch.allclose(
        torch.from_numpy(t.encode_queries(x, show_progress=False)),
        torch.from_numpy(again.encode_queries(x, show_progress=False)),
    )
    # the bottom layers are plain truncation: the same tower, no layer list recorded
    assert (
        load_tower(tiny[kind], "query", dim=8, layers=[0, 1]).fingerprint
        == load_tower(tiny[kind], "query", dim=8, num_layers=2).fingerprint
    )


@pytest.mark.parametrize("bad", [[2, 0], [0, 0], [3], [], [-1, 1]])
def test_a_bad_layer_list_names_the_field(tiny, bad):
    with pytest.raises(ConfigError, match="layers"):
        load_tower(tiny[0], "query", layers=bad)


def test_num_layers_must_count_the_listed_layers(tiny):
    with pytest.raises(ConfigError, match="num_layers"):
        load_tower(tiny[0], "query", num_layers=1, layers=[0, 2])


def test_start_candidates():
    assert start_candidates(2, 6) == [[0, 1], [0, 5], [4, 5]]
    assert start_candidates(1, 2) == [[0], [1]]
    assert start_candidates(3, 6) == [[0, 1, 2], [0, 2, 5], [3, 4, 5]]
    assert start_candidates(2, 2) == [[0, 1]] and start_candidates(3, 2) == [[0, 1, 2]]
