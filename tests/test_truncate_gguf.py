"""scripts/truncate_gguf.py: a GGUF cut to its bottom N blocks keeps those blocks bit for bit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("truncate_gguf", ROOT / "scripts" / "truncate_gguf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    from scalingnote.errors import ConfigError
    from scalingnote.models.registry import packaged_model_path

    try:
        return packaged_model_path("smollm2-135m")
    except ConfigError as e:
        pytest.skip(str(e))


@pytest.mark.real_model
def test_truncated_gguf_keeps_the_bottom_blocks_and_everything_else_bit_for_bit(smollm2_gguf, tmp_path):
    import gguf
    import numpy as np

    dst = tmp_path / "cut.gguf"
    info = _script().truncate(smollm2_gguf, dst, 2)
    assert info["blocks"] == 2 and info["of"] == 30 and not (tmp_path / "cut.gguf.tmp").exists()
    src, cut = gguf.GGUFReader(str(smollm2_gguf)), gguf.GGUFReader(str(dst))
    assert int(cut.fields["llama.block_count"].contents()) == 2
    kept = {t.name: t for t in cut.tensors}
    assert {n.split(".")[1] for n in kept if n.startswith("blk.")} == {"0", "1"}
    assert "token_embd.weight" in kept and "output_norm.weight" in kept
    for t in src.tensors:
        if t.name in kept:
            assert kept[t.name].tensor_type == t.tensor_type and np.array_equal(kept[t.name].data, t.data), t.name
    assert cut.fields["tokenizer.ggml.tokens"].contents() == src.fields["tokenizer.ggml.tokens"].contents()


def test_truncate_refuses_more_blocks_than_the_file_has(smollm2_gguf, tmp_path):
    with pytest.raises(SystemExit, match="1..30"):
        _script().truncate(smollm2_gguf, tmp_path / "x.gguf", 31)
    assert not list(tmp_path.iterdir())


@pytest.mark.real_model
@pytest.mark.slow
def test_a_model_loaded_from_the_cut_file_equals_the_source_truncated_to_as_many_layers(
    smollm2_gguf, tmp_path, monkeypatch
):
    import numpy as np

    from scalingnote.models import load_tower

    monkeypatch.setenv("SCALINGNOTE_CACHE", str(tmp_path / "cache"))
    _script().truncate(smollm2_gguf, tmp_path / "cut.gguf", 3)
    texts = ["what causes cancer", "a study of mice given a high-fat diet"]
    cut = load_tower(str(tmp_path / "cut.gguf"), "query", pooling="mean").encode_queries(texts, show_progress=False)
    full = load_tower("smollm2-135m", "query", pooling="mean", num_layers=3).encode_queries(texts, show_progress=False)
    assert np.array_equal(cut, full)
