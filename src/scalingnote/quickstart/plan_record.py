"""The plan a run made, kept in its output so that a re-run goes on with it.

The plan after the proxy (:func:`scalingnote.quickstart.early.second_plan`) follows the time the
run has spent: QKD's step cap, the comparison runs, the width run and the mining round are cut to
what the budget leaves at the pace the machine kept. A re-run of a finished or interrupted run
spends almost nothing on the steps it reuses, so a plan made again would be roomier and would
change what the next steps are (QKD at 239 steps where the run trained 200: the finished student
redone, then its index). The plan is therefore a step of the run like any other: ``plan/plan.json``
beside a ``DONE`` marker holding the settings and data it was made for. A re-run with the same
settings, data and proxy outcome takes it as written; changed settings (another budget, ``--full``)
make a new plan and say what changed. The cuts made later in the run (the mining round or the
comparison runs dropped because the run fell behind) are written into the same record.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from scalingnote.quickstart.budget import Plan
from scalingnote.quickstart.config import QuickstartConfig
from scalingnote.quickstart.cost import Candidates
from scalingnote.quickstart.early import say
from scalingnote.quickstart.run_data import data_fingerprint
from scalingnote.quickstart.step_markers import mark_done, step_done, step_inputs
from scalingnote.utils.io import write_json

PLAN_DIR = "plan"
PLAN_FILE = "plan.json"


def _cands_json(c: Candidates | None) -> dict[str, Any] | None:
    """``c`` as plain JSON (a depth is an int or None: kept as a list of ``[family, depth, lrs]``)."""
    if c is None:
        return None
    return {
        "depths": [[f, d, list(lrs)] for f, v in c.depths.items() for d, lrs in v.items()],
        "width": dict(c.width),
        "wide": dict(c.wide),
    }


def _cands_from(d: dict[str, Any]) -> Candidates:
    depths: dict[str, dict[int | None, list[float]]] = {}
    for f, depth, lrs in d["depths"]:
        depths.setdefault(f, {})[depth] = [float(x) for x in lrs]
    return Candidates(depths, {k: bool(v) for k, v in d["width"].items()}, {k: bool(v) for k, v in d["wide"].items()})


def plan_json(plan: Plan) -> dict[str, Any]:
    """Every field of ``plan`` as plain JSON (:func:`plan_from_json` reads it back): the dataclass's
    own fields, so a field added to :class:`Plan` is recorded without a change here."""
    rec = {f.name: getattr(plan, f.name) for f in fields(Plan)}
    return json.loads(json.dumps({**rec, "cands": _cands_json(plan.cands)}))


def plan_from_json(d: dict[str, Any]) -> Plan:
    """A :class:`Plan` from :func:`plan_json`'s record (a field the record lacks takes its default)."""
    known = {f.name for f in fields(Plan)}
    return Plan(**{k: v for k, v in d.items() if k in known and k != "cands"}, cands=_cands_from(d["cands"]))


def plan_inputs(cfg: QuickstartConfig, data: dict, cands: Candidates | None) -> dict[str, Any]:
    """What a plan is made for: the run's settings (as resolved before the proxy), its data and the
    candidates the proxy kept."""
    return step_inputs(cfg, data=data_fingerprint(data), proxy_kept=_cands_json(cands))


def recorded_plan(out: Path, inputs: dict[str, Any], make: Callable[[], Plan]) -> Plan:
    """The plan recorded in ``out/plan`` for these ``inputs``, else ``make()``'s, recorded."""
    d = out / PLAN_DIR
    if step_done(d, inputs) and (d / PLAN_FILE).is_file():
        plan = plan_from_json(json.loads((d / PLAN_FILE).read_text()))
        say(
            f"plan: the one this run made before (its {PLAN_DIR}/{PLAN_FILE}), so that no finished step is "
            f"redone; other settings make a new one\n{plan.text()}"
        )
        return plan
    plan = make()
    keep(out, inputs, plan)
    return plan


def keep(out: Path, inputs: dict[str, Any], plan: Plan) -> None:
    """Record ``plan`` (again, after a late cut changed it; nothing is written when it did not)."""
    d = out / PLAN_DIR
    now = plan_json(plan)
    f = d / PLAN_FILE
    if f.is_file() and json.loads(f.read_text()) == now:
        return
    d.mkdir(parents=True, exist_ok=True)
    write_json(f, now)
    mark_done(d, inputs)


__all__ = ["PLAN_DIR", "keep", "plan_from_json", "plan_inputs", "plan_json", "recorded_plan"]
