"""The quick start's step markers: each step writes a ``DONE`` marker holding the digest of its
inputs and settings; a re-run reuses a step only when they match, and redoes it (saying what
changed) when they do not. Also the console banner of a step and the device the steps train on."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from scalingnote.models import default_device
from scalingnote.utils.steps import changed_keys, mark_step, step_state, with_defaults

log = logging.getLogger(__name__)


def _root(path: Path) -> Path | None:
    """The quick start's output directory above a step (the one holding ``quickstart.yaml``)."""
    for p in (path, *path.parents):
        if (p / "quickstart.yaml").exists():
            return p
    return None


def out_relative(path: Path, inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` as plain JSON with the output directory written as ``$OUT``, so a run directory
    that is moved or copied whole still matches its steps."""
    text = json.dumps(inputs, sort_keys=True, default=str)
    root = _root(path)
    if root is not None:
        text = text.replace(json.dumps(str(root))[1:-1], "$OUT")
    return json.loads(text)


def step_done(path: Path, inputs: dict[str, Any]) -> bool:
    """True when ``path`` finished with these inputs (:mod:`scalingnote.utils.steps`); a step
    finished with other inputs is cleared (its directory removed) and redone, with a message
    naming what changed."""
    canon = out_relative(path, inputs)
    state = step_state(path, canon)
    if state == "done":
        return True
    if state == "changed":
        changed = ", ".join(changed_keys(path, canon)) or "format"
        log.warning("%s was made from other inputs (%s changed): redoing it", path, changed)
        print(f"[quickstart] {path.name}: made from other inputs ({changed} changed): redoing it", flush=True)
        shutil.rmtree(path)
    return False


def step_is_done(path: Path, inputs: dict[str, Any]) -> bool:
    """Whether ``path`` finished with these inputs, touching nothing (:func:`step_done` clears a changed step)."""
    return step_state(path, out_relative(path, inputs)) == "done"


def mark_done(path: Path, inputs: dict[str, Any], info: dict | None = None) -> None:
    """Mark a step finished; a training step's checkpoints go (a finished step is reused, never
    resumed: they would be copies of weights its towers already hold), their record stays."""
    for ck in (path / "checkpoints").glob("step-*"):
        shutil.rmtree(ck, ignore_errors=True)
    mark_step(path, out_relative(path, inputs), info)


def on_gpu() -> bool:
    """Whether this process trains on a GPU (what the ``auto`` settings resolve against): the
    device the towers load on (:func:`scalingnote.models.default_device`)."""
    return default_device().type == "cuda"


def banner(title: str) -> None:
    Console(stderr=True).rule(f"[bold]{title}")


def step_digest(step_dir: Path) -> str | None:
    """The digest of a finished step's inputs (its ``DONE`` marker); None when it is not done."""
    marker = step_dir / "DONE"
    return json.loads(marker.read_text()).get("digest") if marker.exists() else None


#: settings that do not change what a step produces (progress bars, logging, checkpoint cadence)
COSMETIC = ("show_progress", "save_every", "log_every", "keep_checkpoints")


def _config_dict(c) -> dict:
    """A run's config as the inputs of its step, without :data:`COSMETIC` fields."""
    return {k: v for k, v in asdict(c).items() if k not in COSMETIC}


def step_inputs(c, **more: Any) -> dict[str, Any]:
    """A training step's inputs: its config (plain JSON, with its fields' defaults, so a setting a
    later version adds at its default is no change) and ``more``."""
    return with_defaults({"config": json.loads(json.dumps(_config_dict(c), default=str)), **more}, c, "config.")


__all__ = ["COSMETIC", "banner", "mark_done", "on_gpu", "out_relative", "step_digest", "step_done", "step_inputs"]
