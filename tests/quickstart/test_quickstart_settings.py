"""The quick start's settings on tiny random models: each checked before any work (a bad value names
its field), and the defaults they resolve to (the GPU-only steps, the QKD step cap, the index factory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.quickstart import QuickstartConfig, default_factory, quickstart
from scalingnote.quickstart.config import CPU_QKD_STEPS
from tests.quickstart.test_quickstart import _cfg


def test_unfreeze_needs_heads_only_large_towers(tiny_models, tmp_path):
    with pytest.raises(ConfigError, match="unfreeze_layers"):
        _cfg(tiny_models, tmp_path, unfreeze_layers=1, trainable_layers=1)
    with pytest.raises(ConfigError, match="unfreeze_layers"):
        _cfg(tiny_models, tmp_path, unfreeze_layers=-1)
    auto = _cfg(tiny_models, tmp_path)  # "auto": top layers on a GPU only (a CPU layer step costs seconds)
    assert (auto.unfreeze_k(gpu=False), auto.unfreeze_k(gpu=True)) == (0, 1)
    assert _cfg(tiny_models, tmp_path, trainable_layers=1).unfreeze_k(gpu=True) == 0


def test_qkd_step_cap_auto_binds_on_a_cpu_only_and_a_bad_cap_names_its_field(tiny_models, tmp_path):
    auto = _cfg(tiny_models, tmp_path, qkd_max_steps="auto")  # the cap keeps a CPU run within 10 minutes
    assert (auto.qkd_step_cap(gpu=False), auto.qkd_step_cap(gpu=True)) == (CPU_QKD_STEPS, None)
    assert _cfg(tiny_models, tmp_path, qkd_max_steps=7).qkd_step_cap(gpu=True) == 7
    assert _cfg(tiny_models, tmp_path, qkd_max_steps=None).qkd_step_cap(gpu=False) is None
    for bad in (0, "many", True, 2.5):
        with pytest.raises(ConfigError, match="qkd_max_steps"):
            _cfg(tiny_models, tmp_path, qkd_max_steps=bad)


def test_quickstart_checks_its_inputs_before_any_work(tiny_models, tmp_path):
    with pytest.raises(ScalingNoteError, match="no such directory"):
        quickstart(_cfg(tiny_models, tmp_path / "x", data=str(tmp_path / "nonexistent")))
    (tmp_path / "beir" / "qrels").mkdir(parents=True)
    for f in ("corpus.jsonl", "queries.jsonl"):
        (tmp_path / "beir" / f).write_text("")
    with pytest.raises(ScalingNoteError, match="missing qrels/test.tsv"):
        quickstart(_cfg(tiny_models, tmp_path / "x", data=str(tmp_path / "beir")))
    assert not (tmp_path / "x").exists()
    with pytest.raises(ConfigError, match="llm_pooling"):
        _cfg(tiny_models, tmp_path / "bad", llm_pooling="avg")
    with pytest.raises(ConfigError, match="students"):
        _cfg(tiny_models, tmp_path / "bad", students=["gpt:2"])
    with pytest.raises(
        ScalingNoteError, match=r"doc_max_length=8: the llm family's document prompt alone takes \d+ tokens"
    ):
        quickstart(_cfg(tiny_models, tmp_path / "short", doc_max_length=8, families=["llm"]))
    assert not (tmp_path / "short" / "stage1").exists()  # refused before any training
    assert QuickstartConfig().compare == "teacher"
    assert (
        _cfg(tiny_models, tmp_path / "b", compare=True).compare == "all"
        and _cfg(tiny_models, tmp_path / "b", compare=False).compare == "none"
    )
    with pytest.raises(ConfigError, match="compare"):
        _cfg(tiny_models, tmp_path / "bad", compare="some")
    with pytest.raises(ConfigError, match="index_recall"):
        _cfg(tiny_models, tmp_path / "bad", index_recall=1.5)


def test_default_factory_uses_4_bit_codes_below_10k_vectors_and_39_points_per_list():
    assert default_factory(1500, 128) == "IVF38,PQ16x4"  # 4*sqrt(n) = 154 lists would hold ~10 vectors each
    assert default_factory(5183, 128) == "IVF132,PQ16x4"
    assert default_factory(32176, 128) == "IVF717,PQ16x8"


def test_default_factory_keeps_8_dimensions_per_pq_code_at_any_width():
    assert default_factory(32176, 384) == "IVF717,PQ48x8"  # MiniLM's width: 32x, as at 128-d
    assert default_factory(32176, 576) == "IVF717,PQ72x8"  # SmolLM2's width (16 would be 144x)
    assert default_factory(1500, 100) == "IVF38,PQ10x4"  # the largest divisor of the width <= width / 8
    assert default_factory(1500, 7) == "IVF38,PQ1x4"


def test_the_seed_varies_the_training_not_the_embedded_data(tmp_path):
    from scalingnote.quickstart.run_data import prepare_data

    def corpus(name: str, **over) -> bytes:
        cfg = QuickstartConfig(out=str(tmp_path / name), synth_docs=60, synth_queries=30, show_progress=False, **over)
        return Path(prepare_data(cfg, tmp_path / name)["corpus"]).read_bytes()

    assert corpus("s0") == corpus("s1", seed=1) == corpus("s2", seed=2)
    assert corpus("d1", synth_seed=1) != corpus("s0")
