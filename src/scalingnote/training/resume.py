"""Resume only from checkpoints made from the same inputs (Stage I and QKD).

A training run records its inputs (:func:`scalingnote.utils.steps.check_step`) in
``<output_dir>/checkpoints/STEP_INPUTS.json``: the resolved config without the keys that
do not change the result (output location, logging / checkpoint periods, progress bars),
with the data files and local model directories fingerprinted. Resuming over checkpoints
made from other inputs (another ``--data``, another learning rate, an edited corpus) is
refused with a message naming the keys that differ (``on_change="refuse"``, the default), or
the old checkpoints and training log are cleared and the run starts over
(``on_change="redo"``). ``<output_dir>/checkpoints/DONE`` marks a finished run.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path
from typing import Any, Literal

from scalingnote.training import distributed
from scalingnote.utils.steps import RECORD, changed_keys, check_step, mark_step, with_defaults

log = logging.getLogger(__name__)

#: config keys that do not change what a run computes (where it writes, how often it logs /
#: checkpoints, progress bars, where feature caches live, evaluation batch size)
NON_INPUT_KEYS = (
    "output_dir",
    "show_progress",
    "save_every",
    "keep_checkpoints",
    "log_every",
    "feature_cache_dir",
    "eval_batch_size",
)

OnChange = Literal["redo", "refuse"]


def as_input_path(value: str | None) -> Path | str | None:
    """A config string naming an existing local file or directory as a :class:`~pathlib.Path`
    (fingerprinted by :func:`~scalingnote.utils.steps.input_digest`); anything else (a packaged
    model name, a hub id) stays text."""
    if not value:
        return value
    p = Path(value).expanduser()
    return p if p.exists() else value


def config_inputs(cfg: Any, paths: dict[str, Any] | None = None) -> dict[str, Any]:
    """``cfg`` (a dataclass) as step inputs: :data:`NON_INPUT_KEYS` dropped, ``paths`` (dotted
    key -> value) put in place as fingerprinted paths."""
    out = dataclasses.asdict(cfg)
    for k in NON_INPUT_KEYS:
        out.pop(k, None)
    for dotted, value in (paths or {}).items():
        *parents, last = dotted.split(".")
        node = out
        for p in parents:
            node = node[p]
        node[last] = as_input_path(value) if isinstance(value, str) else value
    return with_defaults(out, cfg)  # a setting added later at its default does not redo older runs


def begin_run(
    out: str | Path, inputs: dict[str, Any], *, resume: bool, on_change: OnChange, stale: tuple[str, ...] = ()
) -> None:
    """Before a run loads anything: check ``out``'s checkpoints against ``inputs``. Same inputs
    (or none recorded): resume as before. Other inputs: refuse (every rank raises the same
    :class:`~scalingnote.utils.steps.StepChangedError`) or, with ``on_change="redo"`` or
    ``resume=False``, clear the old checkpoints and the training log (rank 0) and start over;
    the run's own caches ``stale`` (names under ``out``) are cleared when the inputs changed."""
    ck = Path(out) / "checkpoints"
    keys = changed_keys(ck, inputs)
    if keys and resume and on_change == "refuse":
        check_step(ck, inputs, on_change="refuse")  # raises, naming the keys
    if distributed.rank() == 0:
        check_step(ck, inputs, on_change="redo")  # logs the change (one line), records the inputs
        if keys or not resume:
            for p in ck.iterdir():
                if p.name != RECORD:
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
            (Path(out) / "metrics.jsonl").unlink(missing_ok=True)
        for name in stale if keys else ():  # built from the old inputs
            shutil.rmtree(Path(out) / name, ignore_errors=True)
    distributed.barrier()


def finish_run(out: str | Path, inputs: dict[str, Any], info: dict[str, Any] | None = None) -> None:
    """Mark the run's checkpoints complete for ``inputs`` (rank 0)."""
    if distributed.rank() == 0:
        mark_step(Path(out) / "checkpoints", inputs, info)


__all__ = ["NON_INPUT_KEYS", "as_input_path", "begin_run", "config_inputs", "finish_run"]
