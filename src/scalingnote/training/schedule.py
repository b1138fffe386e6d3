"""The learning-rate schedule of every training loop (Table 7): linear warm-up, then linear decay
to 0 (or a constant rate); taken up mid-run when a time box re-plans the end."""

from __future__ import annotations

import math

import torch

from scalingnote.errors import ScalingNoteError


def linear_warmup_decay(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_ratio: float,
    *,
    schedule: str = "linear",
    warmup_steps: int | None = None,
    last_epoch: int = -1,
):
    """Table 7: linear warm-up over ``warmup_ratio`` of the steps (or ``warmup_steps``), then linear
    decay to 0; ``schedule="constant"``: the same warm-up, then a constant rate. ``last_epoch``: the
    schedule taken up at step ``last_epoch + 1`` (a time-boxed loop's re-planned end)."""
    from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

    warm = warmup_steps if warmup_steps is not None else math.ceil(warmup_ratio * total_steps)
    if schedule == "constant":
        return get_constant_schedule_with_warmup(optimizer, warm, last_epoch=last_epoch)
    if schedule != "linear":
        raise ScalingNoteError(f"unknown learning-rate schedule {schedule!r} (expected 'linear' or 'constant')")
    return get_linear_schedule_with_warmup(optimizer, warm, total_steps, last_epoch=last_epoch)


__all__ = ["linear_warmup_decay"]
