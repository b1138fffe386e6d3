"""The budgeted quick start beside the exhaustive one, per data set, on one machine.

    python -m benchmarks.quickstart_budget [--sets default,scifact,kuake_qtr] [--modes budgeted,full] [--force]
    python -m benchmarks.quickstart_budget --sets scifact --modes recipe_full   # the recipe run as the exhaustive reference

Each (set, mode) runs ``scalingnote quickstart`` in a fresh process, as a user would, in its own
``--out`` under ``.cache/bench/quickstart_budget/`` (so the exhaustive run never reuses the
budgeted run's steps: both are timed from nothing): ``budgeted`` = ``--budget-minutes <target>``
(the issue's target for the set), ``full`` = ``--full``. A row per run: wall minutes of the
pipeline and per phase (``phase_<name>_s``), what the plan expected and skipped, the chosen
teacher / student / width / fusion, the proxy's agreement with the full runs, and test nDCG@10 of
the student and of the served row; and, once both modes of a set are in the file, whether the
budgeted run made the same choices as the exhaustive one or served within 0.005 nDCG@10 of it.

Resumable: rows already in ``benchmarks/results/quickstart_budget.json`` are kept (``--force``
re-measures); an interrupted run resumes its own steps and its row says ``resumed``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO_ROOT, RESULTS_DIR, chosen_student, loadavg, portable, report, shared_data_dir
from benchmarks.recipe import LENGTHS

NAME = "quickstart_budget"
#: the time targets: minutes of pipeline on 2 idle cores
TARGET_MINUTES = {"default": 8.0, "scifact": 10.0, "kuake_qtr": 15.0}
SERVED_TOLERANCE = 0.005


def command(set_name: str, mode: str, out: Path) -> list[str]:
    """The user's command for one run (the CLI, a fresh process)."""
    cmd = [sys.executable, "-m", "scalingnote.cli", "quickstart", "--out", str(out)]
    if set_name != "default":
        q, d = LENGTHS[set_name]  # the recipe's token budgets for the set
        cmd += ["--data", str(shared_data_dir() / set_name), "--set", f"query_max_length={q}", "--set", f"doc_max_length={d}"]
    cmd += ["--full"] if mode == "full" else ["--budget-minutes", f"{TARGET_MINUTES[set_name]:g}"]
    return cmd


def summarize(set_name: str, mode: str, res: dict[str, Any], wall_s: float, resumed: bool | None) -> dict[str, Any]:
    """One flat row from a finished run's ``results.json``."""
    ch = res["choices"]
    rows = res["rows"]
    student = next(r for r in rows if "student" in r["chosen"])
    served = next(r for r in rows if "served" in r["chosen"])
    fam = ch["families"][ch["teacher"]["family"]]
    budget = ch.get("budget") or {}
    proxy = ch.get("proxy") or {}
    row: dict[str, Any] = {
        "set": set_name, "mode": mode, "target_minutes": TARGET_MINUTES[set_name],
        "budget_minutes": budget.get("budget_minutes"), "pipeline_minutes": round(res["elapsed_s"] / 60, 2),
        "process_minutes": round(wall_s / 60, 2), "resumed": resumed, "machine": res.get("machine"),
        "scalingnote_version": (res.get("versions") or {}).get("scalingnote"), "run_created": res.get("created"),
        "planned_minutes": budget.get("planned_minutes"), "planned_before_proxy_minutes": budget.get("planned_before_proxy_minutes"),
        "skipped": "; ".join(budget.get("skipped") or []) or None,
        "teacher": ch["teacher"]["family"], "teacher_depth_choice": fam.get("depth_choice"), "width": fam.get("dim"),
        "teacher_dir": Path(ch["teacher"]["dir"]).name, "student": ch["student"]["chosen"], "fusion": ch["served"]["choice"],
        "fusion_weight": ch["served"].get("weight"), "student_ndcg@10": round(student["ndcg@10"], 4), "served_ndcg@10": round(served["ndcg@10"], 4),
        "proxy_drawn": proxy.get("drawn"), "proxy_docs": (proxy.get("data") or {}).get("docs"),
        "proxy_agreed": all((proxy.get("agreed") or {}).values()) if proxy.get("agreed") else None,
        "proxy_agreement": json.dumps(proxy.get("agreed")) if proxy.get("agreed") else None,
    }
    qkd = chosen_student(ch).get("qkd") or {}
    row.update({"qkd_planned_steps": qkd.get("planned_steps"), "qkd_steps": qkd.get("steps"), "qkd_seconds": qkd.get("train_seconds")})
    for k, v in (res.get("phase_seconds") or {}).items():
        row[f"phase_{k}_s"] = v
    return row


def compare_modes(rows: list[dict[str, Any]]) -> None:
    """Per set with both modes: the budgeted row's choices and served nDCG@10 against the exhaustive row's, and its target."""
    by = {(r["set"], r["mode"]): r for r in rows}
    for (s, mode), r in by.items():
        if mode != "budgeted":
            continue
        r["within_time_target"] = r["pipeline_minutes"] <= r["target_minutes"]
        r["minutes_over_target"] = round(max(0.0, r["pipeline_minutes"] - r["target_minutes"]), 2)
        f = by.get((s, "full")) or by.get((s, "recipe_full"))
        if f is None:
            r["same_choices_as_full"] = r["served_delta_vs_full"] = r["meets_target"] = None
            continue
        if (r.get("machine"), r.get("scalingnote_version")) != (f.get("machine"), f.get("scalingnote_version")) or r.get("machine") is None:
            # rows from different machines or code versions are not differenced
            r["same_choices_as_full"] = r["served_delta_vs_full"] = r["meets_target"] = None
            r["compared_with"] = f"none: the {f['mode']} row ran on another machine or code version"
            continue
        keys = ("teacher", "teacher_dir", "width", "student", "fusion")
        r["same_choices_as_full"] = all(r[k] == f[k] for k in keys)
        r["served_delta_vs_full"] = round(r["served_ndcg@10"] - f["served_ndcg@10"], 4)
        # within 0.005 below the exhaustive run's served row, or above it: the budget must not cost quality (a budgeted
        # run that serves better met the quality bar; the row still says its choices differed)
        r["meets_target"] = r["within_time_target"] and (r["same_choices_as_full"] or r["served_delta_vs_full"] >= -SERVED_TOLERANCE)
        r["full_pipeline_minutes"] = f["pipeline_minutes"]
        r["compared_with"] = f["mode"]


def recipe_row(set_name: str, results: Path) -> dict[str, Any]:
    """The exhaustive reference from the recipe's run (``python -m benchmarks.recipe --data <set>``:
    ``full`` + every readable family's comparison rows): the same choices and served row as a
    ``--full`` quick start (the comparison rows choose nothing), a wall time that is an upper bound
    of one (it also trains the other families' matched-cost rows). ``results``: the run's
    ``results.json`` as its first, complete invocation wrote it."""
    res = json.loads(results.read_text())
    if not res.get("config", {}).get("full", True):
        raise SystemExit(f"{results}: not an exhaustive run (full is false)")
    # resumed: not known for a recipe run (the recipe may have resumed an interrupted run of its own)
    return {**summarize(set_name, "recipe_full", res, res["elapsed_s"], None), "source": portable(results)}



def measure(set_name: str, mode: str, root: Path, fresh: bool = False) -> dict[str, Any]:
    """One run as a user types it; ``fresh`` (``--force``): its directory is removed first, so no
    step of an earlier or interrupted run is reused and the wall time is from nothing."""
    out = root / f"{set_name}_{mode}"
    if fresh and out.exists():
        shutil.rmtree(out)
    resumed = out.exists()
    cmd = command(set_name, mode, out)
    print(f"[{NAME}] {' '.join(cmd)}", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO_ROOT, env=env, check=True)
    wall = time.perf_counter() - t0
    return summarize(set_name, mode, json.loads((out / "results.json").read_text()), wall, resumed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="default,scifact,kuake_qtr")
    ap.add_argument("--modes", default="budgeted,full")
    ap.add_argument("--root", type=Path, default=REPO_ROOT / ".cache" / "bench" / NAME)
    ap.add_argument("--force", action="store_true", help="re-measure rows already in the results file, each from nothing (its --out removed first)")
    ap.add_argument("--recipe-results", type=Path, default=None,
                    help="mode recipe_full: the recipe run's results.json (default runs/recipe/<set>/results.json)")
    args = ap.parse_args()
    sets, modes = args.sets.split(","), args.modes.split(",")
    bad = [s for s in sets if s not in TARGET_MINUTES] + [m for m in modes if m not in ("budgeted", "full", "recipe_full")]
    if bad:
        raise SystemExit(f"unknown set or mode: {bad} (sets: {sorted(TARGET_MINUTES)}, modes: budgeted, full)")
    path = RESULTS_DIR / f"{NAME}.json"
    old = json.loads(path.read_text()) if path.exists() else {"rows": [], "config": {}}
    rows = {(r["set"], r["mode"]): r for r in old["rows"]}
    load = dict(old.get("config", {}).get("loadavg", {}))
    for s in sets:
        for m in modes:
            if (s, m) in rows and not args.force:
                print(f"[{NAME}] {s} {m}: in the results file (--force re-measures)")
                continue
            before = os.getloadavg()
            if m == "recipe_full":
                rows[(s, m)] = recipe_row(s, args.recipe_results or REPO_ROOT / "runs" / "recipe" / s / "results.json")
            else:
                rows[(s, m)] = measure(s, m, args.root, fresh=args.force)
            load[f"{s}_{m}"] = loadavg(before)
            out = list(rows.values())
            compare_modes(out)
            report(NAME, out, {"sets": sets, "modes": modes, "targets_minutes": TARGET_MINUTES, "served_tolerance": SERVED_TOLERANCE,
                               "loadavg": load, "cores": os.cpu_count(), "root": portable(args.root),
                               "note": "budgeted = --budget-minutes <target>; full = --full; each in its own --out, from nothing"})


if __name__ == "__main__":
    main()
