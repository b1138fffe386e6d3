"""FSDP2 (``distributed: fsdp``) on two torchrun processes (gloo, CPU):

- two sharded processes == one process on the concatenated batch: loss, every gradient,
  grad norm and the updated weights after two AdamW steps (float64 towers; gradient caching
  and activation checkpointing on in the sharded run, off-by-construction in the reference),
  with and without LoRA;
- a sharded run killed (SIGKILL) after an unsaved step resumes from its sharded checkpoint
  and ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import pytest
import torch

from scalingnote.models import build_tiny_model
from tests.helpers.tiny_data import write_tiny_beir
from tests.helpers.torchrun import assert_kill_resumes, assert_same_steps, torchrun

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from _fsdp_worker import run_steps  # noqa: E402

_torchrun = functools.partial(torchrun, HERE / "_fsdp_worker.py")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_fsdp")
    return {
        "llm": str(build_tiny_model(root / "llm", "llm", num_layers=2)),
        "data": str(write_tiny_beir(root / "beir")),
    }


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["full", "lora"])
def test_two_sharded_processes_equal_one_process(tiny, tmp_path, lora):
    spec = {**tiny, "lora": lora, "ac": True, "micro": 2}
    out = tmp_path / "fsdp.pt"
    _torchrun("step", json.dumps(spec), str(out))
    sharded = torch.load(out, weights_only=False)
    # reference: one process, the whole batch of 8, no sharding and no activation checkpointing
    ref = run_steps({**spec, "ac": False}, str(tmp_path / "ref"), "ddp")

    assert_same_steps(sharded, ref, 2)
    if lora:  # only the adapters and the heads train
        r = ref["grads"][0]
        assert not any("base_layer" in k for k in r) and any("lora_A" in k for k in r)
    # the steps did something (the comparison is not between two untouched models)
    first = ref["grads"][0]
    moved = sum(1 for k in first if float(first[k].abs().max()) > 0)
    assert moved >= len(first) // 2


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {
        f"{t}/{k}": v
        for t in ("query_tower", "doc_tower")
        for f in (out / t).glob("*.safetensors")
        for k, v in load_file(f).items()
    }


@pytest.mark.slow  # three torchrun launches, ~45 s on 2 shared cores
def test_killed_sharded_run_resumes_bit_identically(tiny, tmp_path):
    spec = {**tiny, "max_steps": 5, "lora": False, "micro": 4, "eval_every": 2}
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert_kill_resumes(_torchrun, spec, full, killed, _weights)
    res_a, res_b = (json.loads((p / "run.json").read_text())["metrics"] for p in (full, killed))
    assert res_a["final_loss"] == res_b["final_loss"]
    assert res_a["val_curve"] == res_b["val_curve"] and len(res_a["val_curve"]) >= 3  # start, steps 2 and 4, end
    assert res_a["best_step"] == res_b["best_step"]
