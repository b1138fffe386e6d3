"""The design of benchmarks.scaling_trained: held-out points are never fitted,
the data axis spans >= 6 sizes over >= 1.5 decades at one constant learning rate, and predictions
cannot be written once a held-out point has been measured."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from benchmarks import scaling_trained as st


@pytest.mark.parametrize("name", sorted(st.FAMILIES))
def test_held_out_points_are_not_fitted(name):
    fam = st.FAMILIES[name]
    fitted = {(d, D) for d, D, _ in st.fitted_points(fam)}
    held = {(d, D) for d, D, _ in st.heldout_points(fam, 6000)}
    assert held and not fitted & held
    assert (
        max(d for d, _ in held) == max(fam.depths) > max(d for d, _ in fitted)
    )  # the largest N is predicted, not fitted


def test_data_axis_spans_the_issue_range():
    fam = st.FAMILIES["minilm"]
    sizes = sorted({D for d, D, _ in st.fitted_points(fam) if d == fam.data_depth})
    assert len(sizes) >= 6 and math.log10(sizes[-1] / sizes[0]) >= 1.5
    s = st.settings(argparse.Namespace(lr=1e-4, steps=200, seed=0), fam)
    assert s.schedule == "constant" and s.warmup_steps is not None  # a larger D is not also a lower final rate


def test_predictions_are_refused_after_a_held_out_point_was_measured(tmp_path):
    from benchmarks._common import shared_data_dir
    from benchmarks.scaling_trained_report import predict

    if not (shared_data_dir() / "scifact" / "corpus.jsonl").exists():
        pytest.skip("needs ../shared/data/scifact")
    args = argparse.Namespace(data="scifact", work=tmp_path, seed=0, steps=200, lr=1e-4, threads=1, axis="all", tag="")
    fam = st.FAMILIES["minilm"]
    p = tmp_path / "d6" / "D4096" / "point.json"
    p.parent.mkdir(parents=True)
    p.write_text(
        json.dumps(
            {
                "key": f"{fam.model}|6|4096|x|{st.settings(args, fam)}",
                "role": "heldout_largest_n",
                "depth": 6,
                "D": 4096,
                "non_embedding_params": {"query": 1},
                "test_contrastive_ppl": 1.0,
                "ndcg@10": 0.0,
                "r@100": 0.0,
                "start_dev_contrastive_ppl": 2.0,
                "dev_contrastive_ppl": 1.0,
                "dev_curve": [[0, 2.0]],
                "human_pairs": 0,
                "steps_run": 0,
                "best_step": 0,
                "train_seconds": 0.0,
                "per_query": {"q1": [0.0, 0.0, 1.0], "q2": [0.0, 0.0, 1.0]},
            }
        )
    )
    with pytest.raises(SystemExit, match="already measured"):
        predict(args, fam)
