"""Checkpoints load with ``torch.load(weights_only=True)`` and an allow-list: the states the
trainers write (tensors, optimiser / scheduler states, Python + numpy + torch RNG states,
numpy arrays) round-trip exactly; a file holding anything else is refused without running it."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch

from scalingnote.errors import ScalingNoteError
from scalingnote.training.checkpoint import (
    checkpoint_dir,
    load_latest_checkpoint,
    rng_state,
    safe_torch_load,
    save_checkpoint,
    set_rng_state,
)


def _state():
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return {
        "step": 7,
        "total_steps": 10,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "rng": rng_state(),
        "negatives": [np.arange(5, dtype=np.int64), np.array([], dtype=np.int64)],
        "stats": {"mean": np.float64(1.5), "ids": ["a", "b"], "shape": (3, 4, 8), "none": None},
    }


def test_checkpoint_round_trips_with_weights_only(tmp_path):
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    st = _state()
    save_checkpoint(tmp_path, 7, st)
    step, got = load_latest_checkpoint(tmp_path)
    assert (
        step == 7
        and got["step"] == 7
        and got["stats"]["ids"] == ["a", "b"]
        and tuple(got["stats"]["shape"]) == (3, 4, 8)
    )
    for k, v in st["model"].items():
        assert torch.equal(v, got["model"][k])
    assert got["optimizer"]["param_groups"][0]["lr"] == st["optimizer"]["param_groups"][0]["lr"]
    np.testing.assert_array_equal(got["negatives"][0], st["negatives"][0])
    assert got["stats"]["mean"] == 1.5
    # restoring the RNG states reproduces the same draws (exact resume)
    set_rng_state(got["rng"])
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(st["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


class _Payload:
    """Unpickling this would call ``Path.touch`` on the marker (code execution)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        from pathlib import Path

        return (Path.touch, (Path(self.marker),))


def test_malicious_checkpoint_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    d = checkpoint_dir(tmp_path / "run", 5)
    d.mkdir(parents=True)
    torch.save({"step": 5, "evil": _Payload(str(marker))}, d / "state.pt")
    with pytest.raises(ScalingNoteError, match=r"state\.pt: refused to load: .*allow-list"):
        load_latest_checkpoint(tmp_path / "run")
    assert not marker.exists()
    # the same file with the old, unsafe loader would have run the payload (the test can fail)
    torch.load(d / "state.pt", weights_only=False)
    assert marker.exists()


def test_corrupt_or_foreign_files_name_the_file(tmp_path):
    p = tmp_path / "state.pt"
    p.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ScalingNoteError, match=r"state\.pt: not a readable checkpoint"):
        safe_torch_load(p)
    with open(p, "wb") as fh:
        pickle.dump({"x": 1}, fh)  # a plain pickle, not torch's zip format
    with pytest.raises(ScalingNoteError, match=r"state\.pt"):
        safe_torch_load(p)
    with pytest.raises(ScalingNoteError, match="not found"):
        safe_torch_load(tmp_path / "missing.pt")
