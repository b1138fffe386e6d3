"""benchmarks.llm_layers: the rows of the §4.4 depth grid, incl. every layer trained (``--k all``)."""

from __future__ import annotations

import pytest

from benchmarks._llm_layers_report import mark_chosen
from benchmarks.llm_layers import parse_args, row_order, stage1_config


def test_default_order_trains_heads_first_then_every_depth_per_layer_learning_rate():
    args = parse_args(["--depths", "2,4", "--k", "all,0", "--lr", "1e-4,3e-5"])
    assert row_order(args) == [
        (2, 0, 3e-3),
        (4, 0, 3e-3),
        (2, "all", 1e-4),
        (4, "all", 1e-4),
        (2, "all", 3e-5),
        (4, "all", 3e-5),
    ]
    assert row_order(parse_args(["--order", "4:0,4:all:2e-5,4:1"])) == [(4, 0, 1e-4), (4, "all", 2e-5), (4, 1, 1e-4)]
    with pytest.raises(ValueError):
        parse_args(["--k", "0,some"])


def test_k_all_trains_every_layer_of_both_towers_at_its_own_rate_without_a_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALINGNOTE_SHARED_DATA", str(tmp_path))
    args = parse_args(["--depths", "4", "--k", "0,all", "--lr", "1e-4,3e-5", "--precision", "bf16"])
    cfg = stage1_config("scifact", 4, "all", "both", args, tmp_path / "row", 3e-5)
    assert (cfg.query_tower.trainable_layers, cfg.doc_tower.trainable_layers) == ("all", "all")
    assert (cfg.query_tower.num_layers, cfg.doc_tower.num_layers) == (4, 4)
    assert cfg.optim.lr == 3e-5 and cfg.precision == "bf16"
    assert cfg.init_heads_from and cfg.init_heads_from.endswith("d4_k0_heads_lr0.003_e40")  # heads first, then layers
    heads = stage1_config("scifact", 4, 0, "both", args, tmp_path / "heads", 3e-3)
    assert (heads.query_tower.trainable_layers, heads.doc_tower.trainable_layers) == (
        0,
        0,
    ) and heads.init_heads_from is None


def _row(depth, k, lr, val, test):
    return {"depth": depth, "trainable_layers": k, "tower": "both", "lr": lr, "val_ndcg@10": val, "ndcg@10": test}


def test_chosen_row_is_the_validation_best_of_its_depth_and_never_reads_test():
    rows = [
        _row(4, "all", 1e-4, 0.68, 0.60),
        _row(4, "all", 3e-5, 0.64, 0.70),
        _row(8, "all", 1e-4, 0.60, 0.50),
        _row(4, 0, 3e-3, 0.62, 0.58),
    ]
    mark_chosen(rows)
    assert [r["chosen"] for r in rows] == [True, False, True, True]
    rows[0]["ndcg@10"], rows[1]["ndcg@10"] = 0.1, 0.9  # test figures change: the choice does not
    mark_chosen(rows)
    assert [r["chosen"] for r in rows] == [True, False, True, True]


def test_the_twinbert_reference_row_differs_from_the_layer_rows_in_the_model_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALINGNOTE_SHARED_DATA", str(tmp_path))
    args = parse_args(["--depths", "4", "--k", "0,all", "--doc-max", "128", "--twinbert-row"])
    ref = stage1_config("scifact", 6, "all", "both", args, tmp_path / "tb", 1e-4, model="minilm-l6")
    llm = stage1_config("scifact", 4, "all", "both", args, tmp_path / "d4", 1e-4)
    assert (ref.method, ref.query_tower.model, ref.doc_tower.model) == ("twinbert", "minilm-l6", "minilm-l6")
    assert (ref.query_tower.trainable_layers, ref.doc_tower.trainable_layers) == ("all", "all")
    assert ref.init_heads_from is None and ref.evaluate_zero_shot  # from the zero-shot model, its start measured
    assert ref.doc_tower.max_length == llm.doc_tower.max_length == 128
    same = ("data", "optim", "patience", "eval_every", "seed", "dim")
    assert all(getattr(ref, k) == getattr(llm, k) for k in same)
