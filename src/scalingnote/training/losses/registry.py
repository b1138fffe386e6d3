"""The Stage I loss table: ``loss.name`` in a :class:`~scalingnote.training.config.TrainConfig`
names an entry (or a dotted path ``"package.module:function"``).

A Stage I loss is a function ``loss(batch: LossBatch, spec: LossSpec) -> (loss, components)``:
``batch`` holds the embeddings of one step (local and gathered across processes), ``spec`` the
``loss:`` block of the config (its ``options`` mapping carries a loss's own settings), and
``components`` is a dict of floats logged with the step (it must hold ``"loss"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import Tensor

from scalingnote.training.losses.batch import LossBatch
from scalingnote.training.losses.infonce import infonce_loss
from scalingnote.training.losses.scalingnote_loss import scalingnote_loss
from scalingnote.utils.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from scalingnote.training.config import LossSpec


StageOneLoss = Callable[[LossBatch, "LossSpec"], tuple[Tensor, dict[str, float]]]


def _scalingnote(batch: LossBatch, spec: LossSpec) -> tuple[Tensor, dict[str, float]]:
    """ScalingNote §3.2, Eq. 12 — see :func:`scalingnote.training.losses.scalingnote_loss.scalingnote_loss`."""
    return scalingnote_loss(batch.q, batch.pos, batch.neg, q_all=batch.q_all, pos_all=batch.pos_all, neg_all=batch.neg_all,
                            offset=batch.offset, dims=spec.dims, weights=spec.weights, hard_weights=spec.hard_weights,
                            tau=spec.tau, margin=spec.margin, alpha=spec.alpha, hard_in_denominator=spec.hard_in_denominator)


def _infonce(batch: LossBatch, spec: LossSpec) -> tuple[Tensor, dict[str, float]]:
    """Single-vector InfoNCE — see :func:`scalingnote.training.losses.infonce.infonce_loss`."""
    return infonce_loss(batch, tau=spec.tau, **dict(spec.options))


#: name -> Stage I loss. ``scalingnote`` (the paper's Eq. 12) is the default.
LOSSES: Registry[StageOneLoss] = Registry("loss", {"scalingnote": _scalingnote, "infonce": _infonce})


def register_loss(name: str, fn: StageOneLoss, *, replace: bool = False) -> StageOneLoss:
    """Add a Stage I loss under ``name`` (then ``loss: {name: <name>}`` selects it)."""
    return LOSSES.register(name, fn, replace=replace)


def get_loss(name: str, option: str = "loss.name") -> StageOneLoss:
    """The loss named ``name`` (a registered name or a dotted path)."""
    fn: Any = LOSSES.get(name, option=option)
    if not callable(fn):
        raise TypeError(f"{option}: {name!r} is not callable")
    return fn


__all__ = ["LOSSES", "LossBatch", "StageOneLoss", "get_loss", "register_loss"]
