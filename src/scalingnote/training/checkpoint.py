"""Training checkpoints: model, optimizer, scheduler and every RNG state, written atomically.

Layout: ``<output_dir>/checkpoints/step-00000050/state.pt``. A checkpoint directory is
created under a temporary name and renamed when complete, so a crash mid-write never
leaves a checkpoint that looks valid.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalingnote.utils.io import atomic_path

_STEP_RE = re.compile(r"^step-(\d+)$")


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step-{step:08d}"


def save_checkpoint(output_dir: str | Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    final = checkpoint_dir(output_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    with atomic_path(tmp / "state.pt") as p:
        torch.save(state, p)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    # prune old checkpoints
    steps = list_checkpoints(output_dir)
    for s in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(checkpoint_dir(output_dir, s), ignore_errors=True)
    return final


def list_checkpoints(output_dir: str | Path) -> list[int]:
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    steps = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and (p / "state.pt").exists():
            steps.append(int(m.group(1)))
    return sorted(steps)


def load_latest_checkpoint(output_dir: str | Path) -> tuple[int, dict[str, Any]] | None:
    steps = list_checkpoints(output_dir)
    if not steps:
        return None
    path = checkpoint_dir(output_dir, steps[-1]) / "state.pt"
    return steps[-1], torch.load(path, map_location="cpu", weights_only=False)
