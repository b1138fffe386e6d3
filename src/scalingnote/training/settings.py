"""The settings the training stages' configs share: the run loop's (Stage I :class:`TrainConfig`,
QKD :class:`~scalingnote.distill.config.DistillConfig`, TMJ
:class:`~scalingnote.pq.config.PQTrainConfig`) and the AdamW ones of Table 7 (Stage I and QKD).

The configs inherit these dataclasses, so their fields stay flat: the same YAML keys
(``seed: 7``, ``log_every: 1``, ...), the same step inputs. A config changes a default by
declaring the field again (``save_every: int = 100``). The fields are keyword-only so that a
config's own fields without defaults may follow them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(kw_only=True)
class LoopCadence:
    """How often the training loop logs and checkpoints, how many checkpoints it keeps, and
    whether it shows a progress bar (:class:`scalingnote.training.loop.LoopSettings` has them too)."""

    log_every: int = 10  #: a metrics.jsonl line every ``log_every`` steps
    save_every: int = 50  #: a checkpoint every ``save_every`` steps
    keep_checkpoints: int = 2  #: the newest checkpoints kept (older ones are deleted)
    show_progress: bool = True

    def cadence(self) -> dict[str, Any]:
        """The :class:`LoopCadence` fields of this object, as keywords."""
        return {f.name: getattr(self, f.name) for f in fields(LoopCadence)}


@dataclass(kw_only=True)
class RunSettings(LoopCadence):
    """:class:`LoopCadence` and the run's random seed: the fields every stage's config declares."""

    seed: int = 42


@dataclass(kw_only=True)
class AdamWSettings:
    """The AdamW settings of Table 7 that Stage I and QKD share: betas (0.9, 0.999), eps 1e-8,
    weight decay 1e-3, 10% warm-up, max grad norm 1.0 (each stage's optimizer config inherits
    them and adds its learning rate, batch and length)."""

    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-3
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0


__all__ = ["AdamWSettings", "LoopCadence", "RunSettings"]
