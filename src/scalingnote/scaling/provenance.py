"""Provenance checks of a scaling sweep's grid points: a point directory is reused only when it
was trained with the same configuration (up to bookkeeping keys) and the same training pairs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from scalingnote.config import config_to_dict
from scalingnote.errors import ScalingNoteError
from scalingnote.training.config import TrainConfig


def _check_same_data(run_dir: Path, data_hash: str, recorded: str | None = None) -> None:
    f = run_dir / "train_data.sha"
    if recorded is None and f.exists():
        recorded = f.read_text(encoding="utf-8").strip()
    if recorded is not None and recorded != data_hash:
        raise ScalingNoteError(
            f"{run_dir} was trained on different training pairs (the training pool, train.seed or the validation "
            "hold-out changed); use a new output_dir or delete that grid point"
        )


_IGNORED_KEYS = ("output_dir", "show_progress", "log_every", "save_every", "keep_checkpoints", "eval_batch_size")


def _comparable(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    d = json.loads(json.dumps(cfg_dict))
    for k in _IGNORED_KEYS:
        d.pop(k, None)
    if "data" in d:
        if d["data"].get("triplets"):
            d["data"]["triplets"] = Path(d["data"]["triplets"]).name
        if d["data"].get("data_dir"):  # the same directory however it is spelled
            d["data"]["data_dir"] = str(Path(d["data"]["data_dir"]).resolve())
    return d


def config_hash(tc: TrainConfig) -> str:
    blob = json.dumps(_comparable(config_to_dict(tc)), sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        a, b = list(a), list(b)
    return [] if a == b else [prefix]


def _check_same_config(run_dir: Path, tc: TrainConfig) -> None:
    import yaml

    saved_path = run_dir / "config.yaml"
    if not saved_path.exists():
        return
    saved = yaml.safe_load(saved_path.read_text(encoding="utf-8")) or {}
    changed = _diff(_comparable(saved), _comparable(config_to_dict(tc)))
    if changed:
        raise ScalingNoteError(
            f"{run_dir} was trained with a different configuration (changed: {', '.join(changed[:8])}); "
            "use a new output_dir or delete that grid point"
        )
