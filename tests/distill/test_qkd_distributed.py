"""Stage II (QKD) on two torchrun processes (gloo, CPU):

- two processes == one process on the whole batch: loss, every gradient, grad norm and the
  updated student after two AdamW steps (float64 student, dropout off), with the student
  sharded by FSDP2 (activation checkpointing on) and, slow, replicated under DDP. The head
  is fitted (``head_init: lstsq``) on rank 0 only and broadcast: a rank that kept its random
  head would leave a different model;
- a sharded QKD run killed (SIGKILL) after an unsaved step resumes from its sharded checkpoint
  (validation and best-weights state included) and ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
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

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from _qkd_worker import run_steps  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1] / "src"), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
        "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(HERE / "_qkd_worker.py"), *args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A tiny Stage I run (the teacher) and 120 distinct training queries (enough for the
    least-squares head of a 32-wide student)."""
    root = tmp_path_factory.mktemp("qkd_dist")
    llm = build_tiny_model(root / "llm", "llm", num_layers=2)
    bert = build_tiny_model(root / "bert", "bert", num_layers=2)
    data = write_tiny_beir(root / "beir")
    cfg = load_config(TrainConfig, {
        "method": "scaling_dual", "output_dir": str(root / "stage1"),
        "query_tower": {"model": str(llm), "max_length": 16}, "doc_tower": {"model": str(llm), "max_length": 64},
        "dim": 32, "data": {"data_dir": str(data), "neg_skip_top": 1, "neg_max_rank": 8}, "loss": {"dims": [8, 16, 32]},
        "optim": {"batch_size": 8, "epochs": 1.0, "lr": 1e-3, "head_lr": 1e-2}, "show_progress": False,
    })
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
    for s in range(2):
        assert abs(two["loss"][s] - ref["loss"][s]) < 1e-5, (s, two["loss"][s], ref["loss"][s])
        assert abs(two["grad_norm"][s] - ref["grad_norm"][s]) < 1e-5 * max(1.0, ref["grad_norm"][s])
        g, r = two["grads"][s], ref["grads"][s]
        assert g.keys() == r.keys() and r
        for k in r:
            torch.testing.assert_close(g[k], r[k], atol=1e-5, rtol=1e-5, msg=f"grad step {s}: {k}")
    w, r = two["weights"], ref["weights"]
    assert w.keys() == r.keys()
    for k in r:
        torch.testing.assert_close(w[k], r[k], atol=1e-5, rtol=1e-5, msg=f"weight {k}")
    # the steps moved the student (the comparison is not between two untouched models)
    moved = [k for k in r if r[k].is_floating_point() and float((r[k] - ref["start"][k]).abs().max()) > 1e-6]
    assert len(moved) >= len(r) // 2


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in (out / "query_tower").glob("*.safetensors") for k, v in load_file(f).items()}


@pytest.mark.slow  # three torchrun launches
def test_killed_sharded_qkd_resumes_bit_identically(teacher, tmp_path):
    spec = {**teacher, "distributed": "fsdp", "max_steps": 5}
    full, killed = tmp_path / "full", tmp_path / "killed"
    _torchrun("train", json.dumps(spec), str(full))
    proc = _torchrun("train", json.dumps({**spec, "kill_at": 3}), str(killed), check=False)
    assert proc.returncode != 0  # rank 0 died by SIGKILL after step 3 (checkpoint at step 2 only)
    ck = killed / "checkpoints"
    assert sorted(p.name for p in ck.iterdir() if not p.name.startswith(".")) == ["step-00000002"]
    assert (ck / "step-00000002" / "sharded.json").exists()
    assert not (killed / "query_tower").exists()
    _torchrun("train", json.dumps(spec), str(killed))
    a, b = _weights(full), _weights(killed)
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.equal(a[k], b[k]), k
    lines = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4, 5]  # step 3 of the killed run was redone, not duplicated
    res_a, res_b = (json.loads((p / "run.json").read_text())["metrics"] for p in (full, killed))
    assert res_a["processes"] == res_b["processes"] == 2 and res_a["distributed"] == "fsdp"
    assert res_a["val_curve"] == res_b["val_curve"] and len(res_a["val_curve"]) >= 3  # start, steps 2 and 4, end
    assert res_a["qkd_val_loss"] == res_b["qkd_val_loss"]


def test_fsdp_refuses_a_cached_prefix_student(teacher, tmp_path):
    with pytest.raises(ValueError, match="use distributed: ddp"):
        load_config(DistillConfig, {"teacher": teacher["teacher"], "queries": [{"path": teacher["queries"]}],
                                    "student": {"model": teacher["bert"], "trainable_layers": 1}, "distributed": "fsdp"})


def test_the_gpu_qkd_recipe_loads():
    cfg = load_config(DistillConfig, Path(__file__).resolve().parents[2] / "configs" / "gpu" / "qkd_from_qwen2.5_7b_fsdp.yaml")
    assert cfg.distributed == "fsdp" and cfg.precision == "bf16" and cfg.optim.batch_size == 40000
