"""The Stage I loss table: ``loss.name`` in a :class:`~scalingnote.training.config.TrainConfig`
names an entry (or a dotted path ``"package.module:function"``).

A Stage I loss is a function ``loss(batch: LossBatch, spec: LossSpec) -> (loss, components)``:
``batch`` holds the embeddings of one step (local and gathered across processes), ``spec`` the
``loss:`` block of the config (:class:`~scalingnote.training.losses.spec.LossSpec`; its
``options`` mapping carries a loss's own settings), and ``components`` is a dict of floats logged
with the step (it must hold ``"loss"``). Each loss registers itself in its own file with one
:func:`register_loss` line; this module holds only the table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from scalingnote.training.losses.batch import LossBatch
from scalingnote.utils.registry import Registry

#: ``(batch, spec) -> (loss, components)``; ``spec`` is a ``LossSpec`` (spec.py, which reads this
#: table to check ``loss.name``: named here without importing it)
StageOneLoss = Callable[[LossBatch, Any], tuple[Tensor, dict[str, float]]]

#: name -> Stage I loss. ``scalingnote`` (the paper's Eq. 12) is the default.
LOSSES: Registry[StageOneLoss] = Registry("loss")


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
