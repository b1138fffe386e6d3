"""The training loop's time box (scalingnote.training.timebox): the step count re-planned to the
seconds given at the pace measured, the schedule ending at the new end, a floor, and a re-planned
end kept on resume."""

from __future__ import annotations

import time

import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.training.timebox import PACE_PROBE, seconds_left, steps_that_fit
from tests.training.test_loop import Toy


class Slow(Toy):
    """:class:`Toy` whose steps take ~20 ms (a known pace)."""

    def train_step(self, step):
        time.sleep(0.02)
        return super().train_step(step)


def test_steps_that_fit_pays_for_the_validations_and_clamps():
    # 10 s left at 0.1 s a step and a 1 s validation every 10 steps: 0.2 s a step after the last validation's 1 s
    assert steps_that_fit(10, 10.0, 0.1, 1.0, 10, floor=0, cap=1000) == 10 + 45
    assert steps_that_fit(10, 10.0, 0.1, 1.0, 10, floor=0, cap=40) == 40
    assert steps_that_fit(10, 10.0, 0.1, 0.0, 0, floor=0, cap=1000) == 110
    assert steps_that_fit(10, -5.0, 0.1, 1.0, 10, floor=80, cap=1000) == 80  # over the box: the floor
    assert steps_that_fit(30, -5.0, 0.1, 1.0, 10, floor=20, cap=1000) == 30  # never before the step reached


def test_seconds_left_takes_the_tighter_of_box_and_deadline():
    assert seconds_left(None, None, 3.0) is None
    assert seconds_left(10.0, None, 3.0) == 7.0
    assert seconds_left(None, 105.0, 0.0, now=100.0) == 5.0
    assert seconds_left(10.0, 102.0, 3.0, now=100.0) == 2.0


def test_a_box_ends_the_run_at_a_replanned_step_with_the_schedule_finished(tmp_path):
    loop = Slow(tmp_path, total=1000, max_seconds=0.6)
    t0 = time.perf_counter()
    last = loop.run()
    took = time.perf_counter() - t0
    assert last["planned_steps"] == 1000
    assert PACE_PROBE <= last["steps_run"] == loop.total_steps < 100  # ~0.6 s / 20 ms, not 1000 steps (20 s)
    assert took < 3.0
    assert loop.scheduler.get_last_lr()[0] == pytest.approx(0.0)  # the linear decay reached 0 at the new end


def test_the_floor_holds_when_the_box_is_already_spent(tmp_path):
    loop = Slow(tmp_path, total=100, deadline=time.monotonic(), min_steps=15)
    last = loop.run()
    assert last["steps_run"] == 15
    assert loop.scheduler.get_last_lr()[0] == pytest.approx(0.0)


def test_a_replanned_end_is_kept_on_resume(tmp_path):
    a = Slow(tmp_path, total=1000, max_seconds=0.6, interrupt_at=PACE_PROBE + 2)
    with pytest.raises(KeyboardInterrupt):
        a.run()
    assert a.total_steps < 1000
    b = Slow(tmp_path, total=1000, max_seconds=0.6)
    assert b.load_latest()
    assert (b.step, b.total_steps, b.planned_steps) == (a.step, a.total_steps, 1000)
    assert b.scheduler.get_last_lr() == pytest.approx(a.scheduler.get_last_lr())
    with pytest.raises(ScalingNoteError, match="1000 total steps, this run has 999"):
        Slow(tmp_path, total=999, max_seconds=0.6).load_latest()
