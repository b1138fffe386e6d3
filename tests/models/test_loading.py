"""Loading from local disk: sources, layer truncation, GGUF conversion cache, parameter counts."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from scalingnote.errors import ConfigError
from scalingnote.models import (
    cached_gguf_dir,
    convert_gguf,
    count_non_embedding_params,
    load_backbone,
    model_cache_root,
    resolve_source,
)
from scalingnote.models.loading import CACHE_MARKER, gguf_cache_key
from tests.models.gguf_writer import write_llama_gguf


def test_resolve_source_kinds(tiny_dirs, tmp_path):
    assert resolve_source(tiny_dirs["llama"]).form == "hf"
    with pytest.raises(ConfigError, match="not a packaged model name"):
        resolve_source(tmp_path / "missing")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"\.gguf"):
        resolve_source(tmp_path / "weights.bin")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_source(tmp_path / "empty")


@pytest.mark.parametrize("name,kind", [("llama", "llm"), ("qwen2", "llm"), ("bert", "bert")])
def test_layer_truncation(tiny_dirs, name, kind):
    full = load_backbone(tiny_dirs[name])
    cut = load_backbone(tiny_dirs[name], num_layers=2)
    assert full.kind == cut.kind == kind
    assert full.num_layers == 3 and full.base_num_layers == 3
    assert cut.num_layers == 2 and cut.base_num_layers == 3 and cut.model.config.num_hidden_layers == 2
    layers = cut.model.encoder.layer if kind == "bert" else cut.model.layers
    assert len(layers) == 2
    # the kept layers carry the checkpoint's weights (not fresh random ones)
    a, b = full.model.state_dict(), cut.model.state_dict()
    assert set(b) < set(a)
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    with pytest.raises(ConfigError, match="num_layers"):
        load_backbone(tiny_dirs[name], num_layers=4)
    with pytest.raises(ConfigError, match="num_layers"):
        load_backbone(tiny_dirs[name], num_layers=0)


def test_count_non_embedding_params(tiny_dirs):
    bb = load_backbone(tiny_dirs["bert"])
    m = bb.model
    emb = sum(p.numel() for mod in m.modules() if isinstance(mod, nn.Embedding) for p in mod.parameters())
    assert emb > 0
    assert count_non_embedding_params(m) == sum(p.numel() for p in m.parameters()) - emb
    llm = load_backbone(tiny_dirs["llama"]).model
    h = llm.config.hidden_size
    cfg = llm.config
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    attn = h * h * 2 + 2 * h * kv  # q, o, k, v
    mlp = 3 * h * cfg.intermediate_size
    norms = 2 * h
    assert count_non_embedding_params(llm) == cfg.num_hidden_layers * (attn + mlp + norms) + h


def test_cache_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALINGNOTE_CACHE", str(tmp_path / "env"))
    assert model_cache_root() == tmp_path / "env" / "models"
    assert model_cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("SCALINGNOTE_CACHE")
    assert model_cache_root() == model_cache_root.__globals__["Path"].home() / ".cache" / "scalingnote" / "models"


@pytest.fixture(scope="module")
def tiny_gguf(tiny_dirs, tmp_path_factory):
    return write_llama_gguf(tiny_dirs["llama"], tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf")


def test_gguf_converts_once_and_matches_the_original(tiny_dirs, tiny_gguf, tmp_path):
    cache = tmp_path / "cache"
    assert cached_gguf_dir(tiny_gguf, cache) is None
    out = convert_gguf(tiny_gguf, cache_dir=cache)
    assert out == cache / gguf_cache_key(tiny_gguf) and (out / CACHE_MARKER).is_file()
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert "quantization_config" not in (out / "config.json").read_text()
    assert [p.name for p in cache.iterdir()] == [out.name]  # no temporary directories left
    stamp = (out / CACHE_MARKER).stat().st_mtime_ns
    # a second load reuses the cache entry
    via_gguf = load_backbone(tiny_gguf, cache_dir=cache)
    assert via_gguf.hf_dir == out and (out / CACHE_MARKER).stat().st_mtime_ns == stamp
    orig = load_backbone(tiny_dirs["llama"])
    text = "The quick brown fox “jumps” over 2024 lazy dogs [x]"
    ids = orig.tokenizer(text)["input_ids"]
    assert via_gguf.tokenizer(text)["input_ids"] == ids
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(
            via_gguf.model(input_ids=x).last_hidden_state, orig.model(input_ids=x).last_hidden_state
        )
    # layer truncation works through the GGUF cache too
    assert load_backbone(tiny_gguf, cache_dir=cache, num_layers=1).num_layers == 1


def test_gguf_conversion_crash_leaves_no_cache_entry(tiny_gguf, tmp_path, monkeypatch):
    from transformers import PreTrainedModel

    def boom(self, *a, **k):
        raise KeyboardInterrupt("simulated crash while writing")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", boom)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(tiny_gguf, cache_dir=cache)
    assert list(cache.iterdir()) == []
    monkeypatch.undo()
    assert (convert_gguf(tiny_gguf, cache_dir=cache) / CACHE_MARKER).is_file()


def test_env_cache_is_used_for_gguf(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("SCALINGNOTE_CACHE", str(tmp_path))
    out = convert_gguf(tiny_gguf)
    assert out.parent == tmp_path / "models"
    assert os.access(out, os.R_OK | os.X_OK)


def test_unknown_packaged_name():
    with pytest.raises(ConfigError, match="not a packaged model"):
        load_backbone("no-such-model-xyz")


def test_a_models_hidden_size_is_read_without_loading_its_weights(tiny_dirs, tiny_gguf, tmp_path):
    from scalingnote.models import load_tower
    from scalingnote.models.info import hidden_size

    want = {k: int(json.loads((d / "config.json").read_text())["hidden_size"]) for k, d in tiny_dirs.items()}
    assert {k: hidden_size(d) for k, d in tiny_dirs.items()} == want
    assert hidden_size(tiny_gguf, cache_dir=tmp_path / "cache") == want["llama"]  # converted once into the cache
    tower = load_tower(tiny_dirs["bert"], "query", dim=8)
    tower.save(tmp_path / "tower")
    assert hidden_size(tmp_path / "tower") == want["bert"]  # a saved tower: its own record, not the projection
    with pytest.raises(ConfigError):
        hidden_size(tmp_path / "nothing")
