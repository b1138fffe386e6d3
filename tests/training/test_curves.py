"""Training curves (TensorBoard event files) of the shared loop, read back with TensorBoard's reader."""

from __future__ import annotations

import json

import pytest

from scalingnote.training import StopTraining, train
from scalingnote.training.curves import Curves, event_files, tensorboard_command
from tests.helpers.curves import read_scalars, steps
from tests.training.test_trainer import _cfg


def test_stage1_curves_survive_a_kill_and_match_the_log(tiny, tmp_path):
    out = tmp_path / "run"
    over = {"eval_every": 2}

    def kill(step):
        if step == 5:  # after the step-4 checkpoint: step 5's events must be purged on resume
            raise StopTraining

    with pytest.raises(StopTraining):
        train(_cfg(tiny, out, "twinbert", **over), on_step=kill)
    assert event_files(out), "the killed run wrote no event files"
    res = train(_cfg(tiny, out, "twinbert", **over), resume=True)
    n = res["total_steps"]

    sc = read_scalars(out)  # the directory of metrics.jsonl
    assert {"train/loss", "train/lr", "train/grad_norm", "throughput/examples_per_s", "val/ndcg@10"} <= set(sc)
    assert steps(sc["train/loss"]) == list(range(1, n + 1))  # every step once: the killed run's step 5 purged
    log = {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert sorted(log) == list(range(1, n + 1))
    for s, v in sc["train/loss"]:
        assert v == pytest.approx(log[s]["loss"], abs=1e-5)
    for s, v in sc["train/lr"]:
        assert v == pytest.approx(log[s]["lr"], abs=1e-6)  # metrics.jsonl rounds to 6 decimals
    assert all(v > 0 for _, v in sc["throughput/examples_per_s"])
    # the validation curve: nDCG@10 at the start and every 2 steps, as run.json records it
    metrics = json.loads((out / "run.json").read_text())["metrics"]
    curve = metrics["val_curve"]
    assert steps(sc["val/ndcg@10"]) == [s for s, _ in curve]
    # the best step's per-query nDCG@10 (for paired tests between runs), kept across the resume
    pq = metrics["best_val_per_query"]
    assert len(pq) >= 2 and sum(pq.values()) / len(pq) == pytest.approx(metrics["best_val_score"], abs=1e-5)
    assert [v for _, v in sc["val/ndcg@10"]] == pytest.approx([v for _, v in curve], abs=1e-6)
    assert steps(sc["val/ndcg@10"])[:3] == [0, 2, 4]


def test_a_fresh_start_clears_old_curves_and_the_command(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pinned in requirements.lock)")
    c = Curves(tmp_path, 0)
    c.scalars("train", {"loss": 2.0, "lr": 0.1, "flag": True}, 1)
    c.close()
    old = event_files(tmp_path)
    c = Curves(tmp_path, 0)  # a run that starts over (new inputs, resume=False)
    c.scalar("train/loss", 1.0, 1)
    c.close()
    assert not set(old) & set(event_files(tmp_path))
    sc = read_scalars(tmp_path)
    assert sc == {"train/loss": [(1, 1.0)]}  # old curve gone; booleans are not scalars
    Curves(tmp_path / "off", 0, enabled=False).scalar("x", 1.0, 1)  # a non-zero rank writes nothing
    assert not (tmp_path / "off").exists()
    assert tensorboard_command(tmp_path) == f"tensorboard --logdir {tmp_path}"
