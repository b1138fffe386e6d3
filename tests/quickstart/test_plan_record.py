"""The plan a run made, recorded in its output (:mod:`scalingnote.quickstart.plan_record`): read back
field for field, taken as written for the same inputs, made again (and said so) for other ones."""

from __future__ import annotations

import json

from scalingnote.quickstart import plan_record
from scalingnote.quickstart.budget import Plan
from scalingnote.quickstart.cost import Candidates


def _plan(**over) -> Plan:
    base = dict(
        budget_s=480.0,
        phases={"data": 16.4, "proxy": 119.1, "stage2_students": 206.0},
        cands=Candidates(
            {"bert": {None: [1e-3]}, "llm": {2: [1e-3, 3e-3]}}, {"bert": False, "llm": True}, {"bert": True}
        ),
        skipped=["QKD steps 600 -> 200"],
        compare="none",
        qkd_steps=200,
        proxy={
            "docs": 564,
            "corpus_docs": 1500,
            "train_queries": 120,
            "all_train_queries": 640,
            "validation_queries": 62,
        },
        speed=1.31,
        mining=False,
        mining_note="cut to hold the budget",
        family_speed={"bert": 1.68},
        proxy_width={"bert": True, "llm": False},
    )
    base.update(over)
    return Plan(**base)


def test_a_plan_reads_back_field_for_field_through_json():
    plan = _plan()
    back = plan_record.plan_from_json(json.loads(json.dumps(plan_record.plan_json(plan))))
    assert back == plan and back.cands.depths["bert"] == {None: [1e-3]} and 2 in back.cands.depths["llm"]
    assert back.text() == plan.text()


def test_the_recorded_plan_is_taken_for_the_same_inputs_and_made_again_for_others(tmp_path, capsys):
    (tmp_path / "quickstart.yaml").write_text("seed: 0\n")  # the run's root: paths in inputs are $OUT-relative
    key = {"config": {"budget_minutes": 8.0, "out": str(tmp_path)}, "data": {"corpus": [1, "ab"]}}
    made: list[Plan] = []

    def make(**over):
        def f() -> Plan:
            made.append(_plan(**over))
            return made[-1]

        return f

    first = plan_record.recorded_plan(tmp_path, key, make())
    assert made == [first] and (tmp_path / "plan" / "DONE").is_file()
    again = plan_record.recorded_plan(tmp_path, key, make(qkd_steps=239))
    assert len(made) == 1 and again == first and again.qkd_steps == 200
    assert "plan: the one this run made before" in capsys.readouterr().out
    # a cut made late is written into the record; an unchanged plan writes nothing
    stamp = (tmp_path / "plan" / "DONE").stat().st_mtime_ns
    plan_record.keep(tmp_path, key, again)
    assert (tmp_path / "plan" / "DONE").stat().st_mtime_ns == stamp
    again.compare, again.mining = "none", False
    again.skipped.append("comparison runs: the run fell behind")
    plan_record.keep(tmp_path, key, again)
    assert plan_record.recorded_plan(tmp_path, key, make()).skipped[-1] == "comparison runs: the run fell behind"
    # another budget: a new plan, and the run says what changed
    other = {**key, "config": {**key["config"], "budget_minutes": 12.0}}
    capsys.readouterr()
    new = plan_record.recorded_plan(tmp_path, other, make(qkd_steps=400))
    assert new.qkd_steps == 400 and len(made) == 2
    assert "budget_minutes" in capsys.readouterr().out
