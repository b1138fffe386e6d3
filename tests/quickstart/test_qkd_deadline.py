"""Stage II's time box in the quick start: what the budget leaves after the time spent and the
index and evaluation still to pay for, shared by the QKD runs still to go."""

from __future__ import annotations

import time

import pytest

import scalingnote.quickstart.budget as B
from scalingnote.quickstart.config import QuickstartConfig
from scalingnote.quickstart.early import qkd_deadline
from scalingnote.quickstart.pipeline import RUN_AFTER_S, RUN_AFTER_SHARE, run_deadline


def _plan(budget_s):
    return B.Plan(
        budget_s=budget_s,
        phases={"index": 30.0, "evaluation": 20.0, "comparison_runs": 100.0},
        cands=B.Candidates({}, {}),
        qkd_steps=600,
    )


def test_the_box_is_the_budget_left_after_the_index_and_evaluation_at_the_runs_pace(tmp_path):
    cfg = QuickstartConfig(out=str(tmp_path))
    t0 = time.monotonic()
    d = qkd_deadline(cfg, _plan(600.0), elapsed=200.0, ratio=1.5)
    # what the plan may fill - 200 spent - (30 + 20) x 1.5; the comparison runs are not reserved
    assert d - t0 == pytest.approx(_plan(600.0).limit_s - 200.0 - 75.0, abs=1.0)
    assert qkd_deadline(cfg, _plan(None), elapsed=200.0, ratio=1.0) is None
    assert qkd_deadline(QuickstartConfig(out=str(tmp_path), full=True), _plan(600.0), elapsed=200.0, ratio=1.0) is None


def test_each_run_gets_an_equal_share_of_what_is_left():
    assert run_deadline(None, 3) is None
    now = time.monotonic()
    d = run_deadline(now + 300.0, 3)
    share = 100.0
    assert d - now == pytest.approx(share - RUN_AFTER_SHARE * share - RUN_AFTER_S, abs=0.5)
    assert run_deadline(now - 10.0, 2) < now  # already over: the runs fall to their floor
