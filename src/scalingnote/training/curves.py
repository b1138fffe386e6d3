"""Training curves as TensorBoard event files, written by the shared loop of every stage.

:class:`~scalingnote.training.loop.TrainLoop` (Stage I, QKD and the TMJ learned-PQ phases) opens
one :class:`Curves` per run in its own directory — beside ``metrics.jsonl`` for Stage I and QKD,
``<out>/<phase>/`` for a TMJ phase, so ``tensorboard --logdir <run dir>`` shows one run per stage
or phase — and writes every step's scalars there:

* ``train/loss`` and the other loss components, ``train/lr``, ``train/grad_norm``;
* ``throughput/examples_per_s`` (this step's batch over this step's wall time; ``steps_per_s``
  where the loop does not know its batch size);
* the validation metric at every validation, under the stage's own name
  (``val/ndcg@10`` for Stage I, ``val/loss`` for QKD).

The writer is PyTorch's ``torch.utils.tensorboard.SummaryWriter``. A resumed run reopens the
directory with ``purge_step`` = the checkpoint's step + 1, so the steps it redoes replace the
ones logged after that checkpoint (the ``metrics.jsonl`` lines are truncated the same way); a run
that starts over removes the old event files. Without the ``tensorboard`` package installed the
curves are skipped with one warning (``metrics.jsonl`` holds the same numbers).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

EVENT_PREFIX = "events.out.tfevents."


def event_files(log_dir: str | Path) -> list[Path]:
    """The TensorBoard event files directly under ``log_dir``, oldest first."""
    d = Path(log_dir)
    return sorted(d.glob(EVENT_PREFIX + "*")) if d.is_dir() else []


def tensorboard_command(run_dir: str | Path) -> str:
    """The command that shows a run directory's curves (every stage below it)."""
    return f"tensorboard --logdir {Path(run_dir)}"


class Curves:
    """The event files of one run directory (see the module docstring). ``start_step`` is the step
    the run starts from: 0 clears earlier event files, a resumed step purges the later ones.
    ``enabled`` False (e.g. a non-zero rank under torchrun) writes nothing."""

    def __init__(self, log_dir: str | Path, start_step: int = 0, *, enabled: bool = True):
        self.log_dir = Path(log_dir)
        self._writer: Any = None
        if not enabled:
            return
        try:  # optional dependency: torch's writer needs the tensorboard package
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            log.warning(
                "%s: no training curves (TensorBoard event files): %s; install tensorboard "
                "(pip install 'scalingnote[tensorboard]'); metrics.jsonl has the same numbers",
                self.log_dir,
                e,
            )
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if start_step <= 0:
            for p in event_files(self.log_dir):
                p.unlink()
        purge = start_step + 1 if start_step > 0 else None
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge, flush_secs=30)

    @property
    def active(self) -> bool:
        return self._writer is not None

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self._writer is not None and value is not None:  # NaN / inf too: a diverging loss is a curve to see
            self._writer.add_scalar(tag, float(value), global_step=int(step))

    def scalars(self, prefix: str, values: Mapping[str, Any], step: int) -> None:
        """``<prefix>/<key>`` for every numeric value."""
        for k, v in values.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.scalar(f"{prefix}/{k}", v, step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


__all__ = ["Curves", "EVENT_PREFIX", "event_files", "tensorboard_command"]
