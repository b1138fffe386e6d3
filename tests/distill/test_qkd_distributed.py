"""Stage II (QKD) on two torchrun processes (gloo, CPU):

- two processes == one process on the whole batch: loss, every gradient, grad norm and the
  updated student after two AdamW steps (float64 student, dropout off), with the student
  sharded by FSDP2 (activation checkpointing on) and, slow, replicated under DDP. The head
  is fitted (``head_init: lstsq``) on rank 0 only and broadcast: a rank that kept its random
  head would leave a different model;
- a QKD run (FSDP2, and DDP) killed (SIGKILL) after an unsaved step resumes from its checkpoint
  (validation and best-weights state included) and ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from scalingnote.config import load_config
from scalingnote.distill import DistillConfig
from scalingnote.models import build_tiny_model
from scalingnote.training import TrainConfig, train
from tests.helpers.tiny_data import TOPICS, write_tiny_beir
from tests.helpers.torchrun import assert_kill_resumes, assert_same_steps, torchrun

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from _qkd_worker import run_steps  # noqa: E402

_torchrun = functools.partial(torchrun, HERE / "_qkd_worker.py")


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A tiny Stage I run (the teacher) and 120 distinct training queries (enough for the
    least-squares head of a 32-wide student)."""
    root = tmp_path_factory.mktemp("qkd_dist")
    llm = build_tiny_model(root / "llm", "llm", num_layers=2)
    bert = build_tiny_model(root / "bert", "bert", num_layers=2)
    data = write_tiny_beir(root / "beir")
    cfg = load_config(
        TrainConfig,
        {
            "method": "scaling_dual",
            "output_dir": str(root / "stage1"),
            "query_tower": {"model": str(llm), "max_length": 16},
            "doc_tower": {"model": str(llm), "max_length": 64},
            "dim": 32,
            "data": {"data_dir": str(data), "neg_skip_top": 1, "neg_max_rank": 8},
            "loss": {"dims": [8, 16, 32]},
            "optim": {"batch_size": 8, "epochs": 1.0, "lr": 1e-3, "head_lr": 1e-2},
            "show_progress": False,
        },
    )
    train(cfg)
    rng = np.random.default_rng(0)
    words = [w for ws in TOPICS.values() for w in ws]
    texts: set[str] = set()
    while len(texts) < 120:
        texts.add(" ".join(rng.choice(words, size=4).tolist()))
    qfile = root / "queries.jsonl"
    qfile.write_text("".join(json.dumps({"_id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(sorted(texts))))
    return {"teacher": str(root / "stage1"), "bert": str(bert), "queries": str(qfile)}


@pytest.mark.parametrize("distributed", ["fsdp", pytest.param("ddp", marks=pytest.mark.slow)])
def test_two_processes_equal_one_process(teacher, tmp_path, distributed):
    spec = {**teacher, "distributed": distributed, "cache_dir": str(tmp_path / "teacher_cache")}
    # reference first: one process, the whole batch of 8, no sharding, no activation checkpointing
    ref = run_steps({**spec, "ac": False}, str(tmp_path / "ref"), "ddp")
    out = tmp_path / "two.pt"
    _torchrun("step", json.dumps(spec), str(out))  # reads the teacher cache the reference wrote
    two = torch.load(out, weights_only=False)

    for k, v in ref["start"].items():  # the same starting student (rank 0's head on both ranks)
        torch.testing.assert_close(two["start"][k], v, atol=1e-6, rtol=1e-6, msg=f"start {k}")
    assert_same_steps(two, ref, 2)
    w = two["weights"]
    # TrainLoop's best-weights snapshot / restore works on the shards: a third step moved the
    # weights, restoring the snapshot brought back exactly those after step 2
    assert any(not torch.equal(two["moved_on"][k], w[k]) for k in w)
    for k in w:
        assert torch.equal(two["restored"][k], w[k]), k
    # the steps moved the student (the comparison is not between two untouched models)
    r = ref["weights"]
    moved = [k for k in r if r[k].is_floating_point() and float((r[k] - ref["start"][k]).abs().max()) > 1e-6]
    assert len(moved) >= len(r) // 2


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in (out / "query_tower").glob("*.safetensors") for k, v in load_file(f).items()}


@pytest.mark.slow  # three torchrun launches each
@pytest.mark.parametrize("distributed", ["fsdp", "ddp"])
def test_killed_qkd_run_resumes_bit_identically(teacher, tmp_path, distributed):
    # a random head: on a tiny random BERT the least-squares head is so steep that the first step
    # blows the validation loss up and the start stays the best weights (nothing left to compare)
    spec = {**teacher, "distributed": distributed, "max_steps": 5, "head_init": "orthogonal"}
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert_kill_resumes(
        _torchrun, spec, full, killed, _weights, marker="sharded.json" if distributed == "fsdp" else "state.pt"
    )
    res_a, res_b = (json.loads((p / "run.json").read_text())["metrics"] for p in (full, killed))
    assert res_a["processes"] == res_b["processes"] == 2 and res_a["distributed"] == distributed
    assert res_a["val_curve"] == res_b["val_curve"] and len(res_a["val_curve"]) >= 3  # start, steps 2 and 4, end
    assert res_a["qkd_val_loss"] == res_b["qkd_val_loss"]
    assert res_a["best_step"] == 5 and res_a["val_curve"][-1][1] < res_a["val_curve"][0][1]  # it trained


def test_fsdp_refuses_a_cached_prefix_student(teacher, tmp_path):
    with pytest.raises(ValueError, match="use distributed: ddp"):
        load_config(
            DistillConfig,
            {
                "teacher": teacher["teacher"],
                "queries": [{"path": teacher["queries"]}],
                "student": {"model": teacher["bert"], "trainable_layers": 1},
                "distributed": "fsdp",
            },
        )


def test_the_gpu_qkd_recipe_loads():
    cfg = load_config(
        DistillConfig, Path(__file__).resolve().parents[2] / "configs" / "gpu" / "qkd_from_qwen2.5_7b_fsdp.yaml"
    )
    assert cfg.distributed == "fsdp" and cfg.precision == "bf16" and cfg.optim.batch_size == 40000


def test_fsdp_config_in_one_process_trains_unsharded(teacher, tmp_path, caplog):
    """Without torchrun, `distributed: fsdp` falls back to ordinary training, with a warning."""
    from _qkd_worker import make_cfg

    from scalingnote.distill import distill

    cfg = make_cfg({**teacher, "max_steps": 2}, str(tmp_path / "one"), "fsdp")
    with caplog.at_level("WARNING"):
        res = distill(cfg)
    assert "needs torchrun" in caplog.text
    assert res["processes"] == 1 and res["distributed"] == "none" and res["steps_run"] == 2
    assert (tmp_path / "one" / "query_tower").exists()
