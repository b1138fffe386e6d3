"""The budgeted quick start beside the exhaustive one, per data set, seed and machine speed.

    python -m benchmarks.quickstart_budget [--sets default,scifact,kuake_qtr] [--modes budgeted,full]
        [--seeds 0,1,2] [--cores 2,1] [--force]
    # the recipe run as the exhaustive reference:
    python -m benchmarks.quickstart_budget --sets scifact --modes recipe_full

Each (set, mode, seed, cores) runs ``scalingnote quickstart`` in a fresh process, as a user would,
in its own ``--out`` under ``.cache/bench/quickstart_budget/`` (so no run reuses another's steps:
each is timed from nothing): ``budgeted`` = ``--budget-minutes <target>`` (the set's target),
``full`` = ``--full``; ``--cores 1`` runs it under ``taskset -c 0`` (one core: a machine about
twice as slow). A row per run: seed, cores, wall minutes of the pipeline and per phase
(``phase_<name>_s``), what the plan expected and skipped, the chosen teacher / student / width /
served configuration, the proxy's agreement with the full runs, test nDCG@10 of the teacher, the
student and the served row, the student's retention of its teacher (``retention_val``,
``retention_test``: student / teacher nDCG@10; ``retention_val_low`` / ``_high``: the validation
retention's 95% bootstrap interval over the validation queries) and speed-up, and the run directory's size
(``output_mb``), and whether its wall time held the budget + 10% (``within_time_target``: on one core
as on two). Once both modes of a (set, seed, cores) are in, whether the budgeted run made the
same choices as the exhaustive one or served within 0.005 nDCG@10 of it; per set, the spread of
the served configuration and served test nDCG@10 across seeds and machine speeds (``config.stability``).

Every row records the machine and the code it ran (``machine``, ``code``: the commit, ``+changes``
when the working tree differs from it). Rows in the results file from this machine and code are kept
(``--force`` re-measures); rows from another machine or code are dropped, or with ``--carry``
kept as they were, marked ``carried`` with their own machine, code and date, and never compared
with the others. Resumable: an interrupted run resumes its own steps and its row says ``resumed``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REPO_ROOT, RESULTS_DIR, chosen_student, loadavg, report, shared_data_dir
from benchmarks.recipe import LENGTHS
from scalingnote.models.towers.store import dir_bytes
from scalingnote.utils import run_metadata

NAME = "quickstart_budget"
#: the targets: minutes of pipeline on 2 idle cores
TARGET_MINUTES = {"default": 8.0, "scifact": 10.0, "kuake_qtr": 15.0}
SERVED_TOLERANCE = 0.005
#: a budgeted run's wall time may exceed its budget by this share, on two cores and on one alike (a
#: budget is the user's wall time: a slower machine must cut more, not take longer)
TIME_SLACK = 0.10
#: the same served configuration and served test nDCG@10 within this across seeds and machine speeds
STABILITY_TOLERANCE = 0.01
KEY = ("set", "mode", "seed", "cores")


#: what a measured run executes: the package (the quick start runs as the CLI) and the recipe's token
#: lengths its command passes; a commit that touches neither (docs, another benchmark, this file's
#: summaries) measures the same code
CODE_PATHS = ("src", "benchmarks/recipe.py")


def code_version() -> str:
    """The last commit that changed what a run executes (:data:`CODE_PATHS`), with
    ``+changes-<digest>`` when those paths differ from it in the working tree (the digest of the
    differences and of the new files: two runs of the same changes share it). A commit elsewhere (docs,
    another benchmark) keeps the stamp, so the rows measured before it are still this code's."""
    git = lambda *a: subprocess.run(["git", *a], cwd=REPO_ROOT, capture_output=True, text=True).stdout  # noqa: E731
    head = git("log", "-1", "--format=%h", "--", *CODE_PATHS).strip() or "unknown"
    diff = git("diff", "HEAD", "--", *CODE_PATHS)
    new = sorted(git("ls-files", "--others", "--exclude-standard", "--", *CODE_PATHS).split())
    if not diff and not new:
        return head
    h = hashlib.sha256(diff.encode())
    for f in new:
        h.update(f.encode() + (REPO_ROOT / f).read_bytes())
    return f"{head}+changes-{h.hexdigest()[:10]}"


def command(set_name: str, mode: str, out: Path, seed: int = 0, cores: int = 2) -> list[str]:
    """The user's command for one run (the CLI, a fresh process); one core: under ``taskset -c 0``."""
    cmd = (["taskset", "-c", "0"] if cores == 1 else []) + [
        sys.executable,
        "-m",
        "scalingnote.cli",
        "quickstart",
        "--out",
        str(out),
        "--seed",
        str(seed),
    ]
    if set_name != "default":
        q, d = LENGTHS[set_name]  # the recipe's token budgets for the set
        cmd += [
            "--data",
            str(shared_data_dir() / set_name),
            "--set",
            f"query_max_length={q}",
            "--set",
            f"doc_max_length={d}",
        ]
    cmd += ["--full"] if mode == "full" else ["--budget-minutes", f"{TARGET_MINUTES[set_name]:g}"]
    return cmd


def _row_of(rows: list[dict], tag: str) -> dict | None:
    return next((r for r in rows if tag in str(r.get("chosen", "")).split("+")), None)


def summarize(set_name: str, mode: str, res: dict[str, Any], wall_s: float, resumed: bool) -> dict[str, Any]:
    """One flat row from a finished run's ``results.json``."""
    ch, rows = res["choices"], res["rows"]
    student, served, teacher = _row_of(rows, "student"), _row_of(rows, "served"), _row_of(rows, "teacher")
    fam = ch["families"][ch["teacher"]["family"]]
    budget, proxy, kept = ch.get("budget") or {}, ch.get("proxy") or {}, ch.get("retention") or {}
    pick: dict[str, Any] = (ch.get("index") or {}).get("chosen") or {}
    row: dict[str, Any] = {
        "set": set_name,
        "mode": mode,
        "seed": (res.get("config") or {}).get("seed"),
        "target_minutes": TARGET_MINUTES[set_name],
        "budget_minutes": budget.get("budget_minutes"),
        "pipeline_minutes": round(res["elapsed_s"] / 60, 2),
        "process_minutes": round(wall_s / 60, 2),
        "resumed": resumed,
        "planned_minutes": budget.get("planned_minutes"),
        "planned_before_proxy_minutes": budget.get("planned_before_proxy_minutes"),
        "skipped": "; ".join(budget.get("skipped") or []) or None,
        "teacher": ch["teacher"]["family"],
        "teacher_depth_choice": fam.get("depth_choice"),
        "teacher_head_lr": fam.get("head_lr"),
        "head_lr_choice": fam.get("lr_choice"),
        "width": fam.get("dim"),
        "teacher_dir": Path(ch["teacher"]["dir"]).name,
        "student": ch["student"]["chosen"],
        "fusion": ch["served"]["choice"],
        "fusion_weight": ch["served"].get("weight"),
        "fusion_p": ch["served"].get("p"),
        "fusion_reason": ch["served"].get("reason"),
        "served_config": f"{ch['teacher']['family']}/{Path(ch['teacher']['dir']).name} -> "
        f"{ch['student']['chosen']}, {ch['served']['choice']}",
        "teacher_ndcg@10": None if teacher is None else round(teacher["ndcg@10"], 4),
        "teacher_val_ndcg@10": None
        if teacher is None or teacher.get("val_ndcg@10") is None
        else round(teacher["val_ndcg@10"], 4),
        "student_val_ndcg@10": None if student.get("val_ndcg@10") is None else round(student["val_ndcg@10"], 4),
        "student_ndcg@10": round(student["ndcg@10"], 4),
        "served_ndcg@10": round(served["ndcg@10"], 4),
        "retention_val": kept.get("retention_val"),
        "retention_val_low": kept.get("retention_val_low"),
        "retention_val_high": kept.get("retention_val_high"),
        "retention_test": kept.get("retention_test"),
        "speedup": kept.get("speedup"),
        "output_mb": ch.get("output_mb"),
        "feature_cache_dropped_mb": (ch.get("feature_cache") or {}).get("dropped_mb"),
        # the served structure, chosen on validation (recall@10 vs exact, single-query latency)
        "index_structure": pick.get("structure"),
        "index_val_recall@10": pick.get("recall"),
        "index_latency_ms_single": pick.get("latency_ms_single"),
        "index_memory_ratio": pick.get("memory_ratio"),
        "proxy_drawn": proxy.get("drawn"),
        "proxy_docs": (proxy.get("data") or {}).get("docs"),
        "proxy_agreed": all((proxy.get("agreed") or {}).values()) if proxy.get("agreed") else None,
        "proxy_agreement": json.dumps(proxy.get("agreed")) if proxy.get("agreed") else None,
    }
    for r in rows:  # the baselines the targets name
        if r["method"] == "bm25" or r["method"].startswith("zero_shot_"):
            row["bm25_ndcg@10" if r["method"] == "bm25" else "zero_shot_ndcg@10"] = round(r["ndcg@10"], 4)
    qkd = chosen_student(ch).get("qkd") or {}
    row.update(
        {
            "qkd_planned_steps": qkd.get("planned_steps"),
            "qkd_steps": qkd.get("steps"),
            "qkd_seconds": qkd.get("train_seconds"),
        }
    )
    for k, v in (res.get("phase_seconds") or {}).items():
        row[f"phase_{k}_s"] = v
    return row


def _key(r: dict[str, Any]) -> tuple:
    return tuple(r.get(k) for k in KEY)


def compare_modes(rows: list[dict[str, Any]]) -> None:
    """Per (set, seed, cores) with both modes: the budgeted row's choices and served nDCG@10 against
    the exhaustive row's (same machine and code; carried rows are never compared), and its target."""
    live = [r for r in rows if not r.get("carried")]
    by = {_key(r): r for r in live}
    time_targets(live)
    for r in live:
        if r["mode"] != "budgeted":
            continue
        f = by.get((r["set"], "full", r.get("seed"), r.get("cores"))) or by.get(
            (r["set"], "recipe_full", r.get("seed"), None)
        )
        if f is None:
            r["same_choices_as_full"] = r["served_delta_vs_full"] = r["meets_target"] = None
            continue
        if any(
            r.get(k) != f.get(k) for k in ("machine", "code", "scalingnote_version")
        ):  # never differenced across machines or code
            r["same_choices_as_full"] = r["served_delta_vs_full"] = r["meets_target"] = None
            r["compared_with"] = f"none: the {f['mode']} row ran on another machine or code version"
            continue
        keys = ("teacher", "teacher_dir", "width", "student", "fusion")
        r["same_choices_as_full"] = all(r[k] == f[k] for k in keys)
        r["served_delta_vs_full"] = round(r["served_ndcg@10"] - f["served_ndcg@10"], 4)
        # within 0.005 below the exhaustive run's served row, or above it: the budget must not cost quality
        r["meets_target"] = r["within_time_target"] and (
            r["same_choices_as_full"] or r["served_delta_vs_full"] >= -SERVED_TOLERANCE
        )
        r["full_pipeline_minutes"] = f["pipeline_minutes"]
        r["compared_with"] = f["mode"]


def time_targets(rows: list[dict[str, Any]]) -> None:
    """Each budgeted row's time target: its wall minutes within the budget + :data:`TIME_SLACK` on any
    number of cores (``within_time_target``), and the minutes over the budget itself. A function of the
    row alone, so carried rows are judged by the same rule."""
    for r in rows:
        if r.get("mode") == "budgeted" and r.get("pipeline_minutes") is not None:
            r["within_time_target"] = r["pipeline_minutes"] <= round(r["target_minutes"] * (1 + TIME_SLACK), 4)
            r["minutes_over_target"] = round(max(0.0, r["pipeline_minutes"] - r["target_minutes"]), 2)


def stability(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per set (budgeted runs of this machine and code): the served configurations seen, the spread
    of served test nDCG@10 across seeds and machine speeds, and whether both hold the target (None
    for a set with a single run)."""
    out = {}
    for s in sorted({r["set"] for r in rows}):
        rs = [r for r in rows if r["set"] == s and r["mode"] == "budgeted" and not r.get("carried")]
        if rs:
            out[s] = _spread(rs)
    return out


def carried_stability(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`stability` of the carried rows, one entry per (set, machine, code): what that code showed
    on that machine, never mixed with another's."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("carried") and r["mode"] == "budgeted":
            groups.setdefault((r["set"], r.get("machine"), r.get("code")), []).append(r)
    return [{"set": s, "machine": m, "code": c, **_spread(rs)} for (s, m, c), rs in sorted(groups.items(), key=str)]


def _spread(rs: list[dict[str, Any]]) -> dict[str, Any]:
    served = [r["served_ndcg@10"] for r in rs]
    configs = sorted({r["served_config"] for r in rs})
    return {
        "runs": len(rs),
        "seeds": sorted({r["seed"] for r in rs}),
        "cores": sorted({r["cores"] for r in rs}),
        "served_configs": configs,
        "served_min": min(served),
        "served_max": max(served),
        "served_spread": round(max(served) - min(served), 4),
        "retention_val_min": min((r["retention_val"] for r in rs if r.get("retention_val") is not None), default=None),
        "output_mb_max": max((r["output_mb"] for r in rs if r.get("output_mb") is not None), default=None),
        # one run shows nothing about stability: not measured (None), not met
        "meets_stability_target": None
        if len(rs) < 2
        else len(configs) == 1 and max(served) - min(served) <= STABILITY_TOLERANCE,
    }


def recipe_row(set_name: str, results: Path) -> dict[str, Any]:
    """The exhaustive reference from the recipe's run (``python -m benchmarks.recipe --data <set>``:
    ``full`` + every readable family's comparison rows): the same choices and served row as a
    ``--full`` quick start (the comparison rows choose nothing), a wall time that is an upper bound
    of one (it also trains the other families' matched-cost rows). ``results``: the run's
    ``results.json`` as its first, complete invocation wrote it."""
    res = json.loads(results.read_text())
    if not res.get("config", {}).get("full", True):
        raise SystemExit(f"{results}: not an exhaustive run (full is false)")
    return {**summarize(set_name, "recipe_full", res, res["elapsed_s"], False), "cores": None, "source": str(results)}


def measure(set_name: str, mode: str, root: Path, seed: int, cores: int, fresh: bool = False) -> dict[str, Any]:
    """One run as a user types it; ``fresh`` (``--force``): its directory is removed first, so no
    step of an earlier or interrupted run is reused and the wall time is from nothing."""
    out = root / f"{set_name}_{mode}_s{seed}_c{cores}"
    if fresh and out.exists():
        shutil.rmtree(out)
    resumed = out.exists()
    cmd = command(set_name, mode, out, seed, cores)
    print(f"[{NAME}] {' '.join(cmd)}", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO_ROOT, env=env, check=True)
    wall = time.perf_counter() - t0
    row = summarize(set_name, mode, json.loads((out / "results.json").read_text()), wall, resumed)
    row.update(cores=cores, output_mb=round(dir_bytes(out) / 2**20, 1), out=out.name)
    return row


def _old_rows(path: Path, machine: str, code: str, carry: bool) -> list[dict[str, Any]]:
    """The results file's rows that stay: this machine's and code's (resumable), and with ``carry``
    the others, marked as carried with their own machine, code and date."""
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    keep = []
    for r in old.get("rows", []):
        same = r.get("machine") == machine and r.get("code") == code and not r.get("carried")
        if same:
            keep.append(r)
        elif carry:
            keep.append(
                {
                    **r,
                    "carried": True,
                    "machine": r.get("machine") or old.get("machine"),
                    "code": r.get("code") or "unknown",
                    "created": r.get("created") or old.get("created"),
                }
            )
    return keep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="default,scifact,kuake_qtr")
    ap.add_argument("--modes", default="budgeted,full")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (each a run from nothing)")
    ap.add_argument("--cores", default="2", help="comma-separated: 2 = as the machine is, 1 = under taskset -c 0")
    ap.add_argument("--root", type=Path, default=REPO_ROOT / ".cache" / "bench" / NAME)
    ap.add_argument(
        "--force",
        action="store_true",
        help="re-measure rows already in the results file, each from nothing (its --out removed first)",
    )
    ap.add_argument(
        "--carry", action="store_true", help="keep rows of another machine or code, marked carried (never compared)"
    )
    ap.add_argument(
        "--recipe-results",
        type=Path,
        default=None,
        help="mode recipe_full: the recipe run's results.json (default runs/recipe/<set>/results.json)",
    )
    args = ap.parse_args()
    sets, modes = args.sets.split(","), args.modes.split(",")
    seeds, cores = [int(x) for x in args.seeds.split(",")], [int(x) for x in args.cores.split(",")]
    bad = [s for s in sets if s not in TARGET_MINUTES] + [
        m for m in modes if m not in ("budgeted", "full", "recipe_full")
    ]
    bad += [c for c in cores if c not in (1, 2)]
    if bad:
        raise SystemExit(
            f"unknown set, mode or cores: {bad} (sets: {sorted(TARGET_MINUTES)}, modes: budgeted, full, "
            "recipe_full; cores: 1, 2)"
        )
    path = RESULTS_DIR / f"{NAME}.json"
    machine, code = run_metadata({})["machine"], code_version()
    rows = {_key(r): r for r in _old_rows(path, machine, code, args.carry) if not r.get("carried")}
    carried = [r for r in _old_rows(path, machine, code, args.carry) if r.get("carried")]
    for s in sets:
        for m in modes:
            for seed in seeds:
                for c in cores if m != "recipe_full" else [None]:
                    k = (s, m, seed, c)
                    if k in rows and not args.force:
                        print(f"[{NAME}] {k}: in the results file (--force re-measures)")
                        continue
                    before = os.getloadavg()
                    if m == "recipe_full":
                        r = recipe_row(s, args.recipe_results or REPO_ROOT / "runs" / "recipe" / s / "results.json")
                    else:
                        r = measure(s, m, args.root, seed, c, fresh=args.force)
                    r.update(
                        machine=machine,
                        code=code,
                        created=run_metadata({})["created"],
                        **{k2: " ".join(map(str, v)) for k2, v in loadavg(before).items()},
                    )
                    rows[k] = r
                    out = list(rows.values())
                    compare_modes(out)
                    time_targets(carried)
                    report(
                        NAME,
                        out + carried,
                        {
                            "sets": sets,
                            "modes": modes,
                            "seeds": seeds,
                            "cores": cores,
                            "targets_minutes": TARGET_MINUTES,
                            "served_tolerance": SERVED_TOLERANCE,
                            "time_slack": TIME_SLACK,
                            "stability_tolerance": STABILITY_TOLERANCE,
                            "stability": stability(out),
                            "stability_carried": carried_stability(carried),
                            "cpu_count": os.cpu_count(),
                            "root": os.path.relpath(args.root, REPO_ROOT),
                            "note": "budgeted = --budget-minutes <target>; full = --full; each in its own "
                            "--out, from nothing; "
                            "cores 1 = taskset -c 0",
                        },
                    )


if __name__ == "__main__":
    main()
