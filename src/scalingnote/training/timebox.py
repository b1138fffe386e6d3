"""A time box for the training loop: train for as many steps as fit in a number of seconds.

A step count fixed in advance holds a time budget only as well as the cost model that chose it
(the quick start's QKD ran 1.4x its modelled time on one CPU and 1.0x on another). With a box
(:class:`~scalingnote.training.loop.LoopSettings` ``max_seconds`` — the loop's own time, steps
and validations, earlier interrupted runs included — and/or ``deadline``, a ``time.monotonic()``
instant), the loop measures its pace every :data:`PACE_PROBE` steps and at every validation
(validations paid apart from steps), and re-plans its end: the steps that fit what is left of the box once the
validations still due are paid for, never more than the configured total and never fewer than
``min_steps``. The learning-rate schedule is rebuilt to end at the new total from the step
reached (its warm-up shrunk in proportion, never below the step reached, then a linear decay to 0
at the new end), so a boxed run ends the way a run planned for that many steps would, not cut
mid-schedule. A re-planned total is written to
each checkpoint and re-applied on resume.
"""

from __future__ import annotations

import math
import time
from typing import Any

from scalingnote.errors import ScalingNoteError
from scalingnote.training import distributed
from scalingnote.training.schedule import linear_warmup_decay

PACE_PROBE = 10  #: the pace is read (and the end re-planned) every this many steps of a run
REPLAN_MIN_CHANGE = 0.02  #: re-plan only when the new total differs by more than this share (and one step)


def seconds_left(
    max_seconds: float | None, deadline: float | None, spent: float, now: float | None = None
) -> float | None:
    """What is left of the box: ``max_seconds`` less the loop's time ``spent``, and/or up to the
    monotonic ``deadline``, whichever is less; None without a box."""
    left = None if max_seconds is None else max_seconds - spent
    if deadline is not None:
        d = deadline - (time.monotonic() if now is None else now)
        left = d if left is None else min(left, d)
    return left


def steps_that_fit(
    step: int, left: float, step_s: float, val_s: float, eval_every: int | None, *, floor: int, cap: int
) -> int:
    """The total step count a box with ``left`` seconds holds from ``step``: each further step costs
    ``step_s``; a validation (``val_s``) every ``eval_every`` steps and one at the end. Clamped to
    [``max(floor, step)``, ``cap``]."""
    per_step = step_s + (val_s / eval_every if eval_every else 0.0)
    room = left - val_s  # the last validation
    n = math.floor(room / per_step) if per_step > 0 and room > 0 else 0
    return int(min(cap, max(floor, step, step + n)))


def fit_to_box(loop: Any) -> None:
    """Re-plan ``loop``'s total steps to its box (see the module docstring); a no-op without one,
    before :data:`PACE_PROBE` steps of this run, or when the change is under :data:`REPLAN_MIN_CHANGE`."""
    st = loop.settings
    spent = loop.train_seconds()
    left = seconds_left(st.max_seconds, st.deadline, spent)
    if left is None or loop.steps_done < PACE_PROBE:
        return
    step_s = max(spent - loop.prior_seconds - loop.val_seconds, 0.0) / loop.steps_done  # this run's steps
    val_s = loop.last_val_seconds if loop.has_validation() else 0.0
    new = steps_that_fit(loop.step, left, step_s, val_s, st.eval_every, floor=st.min_steps, cap=loop.planned_steps)
    # under torchrun rank 0's pace decides: the ranks must stop together
    new = int(distributed.broadcast_float(float(new)))
    if abs(new - loop.total_steps) > max(1, REPLAN_MIN_CHANGE * loop.total_steps) or (
        new == loop.step < loop.total_steps
    ):
        replan(loop, new)


def replan(loop: Any, total: int, warm: int | None = None) -> None:
    """End ``loop`` at ``total`` steps: the schedule rebuilt to end there from the step reached. Its
    warm-up shrinks in proportion (a box shorter than the planned warm-up would end still warming
    up), never below the step reached; ``warm``: the warm-up a checkpoint recorded."""
    schedule, warm0 = loop.schedule_args
    if warm is None:
        warm = min(warm0, max(loop.step, math.ceil(warm0 * total / max(loop.planned_steps, 1))))
    loop.total_steps, loop.warmup_steps = int(total), int(warm)
    loop.scheduler = linear_warmup_decay(
        loop.optimizer,
        loop.total_steps,
        0.0,
        schedule=schedule,
        warmup_steps=loop.warmup_steps,
        last_epoch=loop.step - 1,
    )


def check_resumed_total(loop: Any, saved: dict[str, Any], where: Any) -> None:
    """A checkpoint's step plan against this run's: the same planned total (else the config changed);
    a total the time box re-planned is re-applied before the scheduler's state is loaded."""
    planned = saved.get("planned_steps", saved.get("total_steps"))
    if planned != loop.planned_steps:
        raise ScalingNoteError(
            f"{where}: checkpoint was made for {planned} total steps, this run has {loop.planned_steps}: "
            "the config changed; use a new output_dir"
        )
    total = saved.get("total_steps", planned)
    if total != loop.total_steps:
        replan(loop, total, saved.get("warmup_steps"))


__all__ = [
    "PACE_PROBE",
    "REPLAN_MIN_CHANGE",
    "check_resumed_total",
    "fit_to_box",
    "replan",
    "seconds_left",
    "steps_that_fit",
]
