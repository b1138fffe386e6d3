"""How well a finished quick start knows its student's retention of its teacher: the interval its
validation (and test) queries allow.

    python -m benchmarks.retention_interval [--runs DIR,DIR,...] [--name retention_interval]

``--runs`` (default: every output under ``.cache/bench/quickstart_budget/``): finished
quick-start outputs. For each, the chosen teacher and the chosen student are scored again, as the run
scored them (:func:`scalingnote.quickstart.scoring.score`: the student's queries against the teacher's
document embeddings, on the teacher's held-out validation queries and on the reported split), and the
recomputed validation nDCG@10 is checked against the one the run recorded. A row per run: the
retention (student / teacher nDCG@10) on validation and test with its 95% percentile bootstrap
interval over the queries (:func:`scalingnote.evaluation.significance.ratio_interval`, seeded as the
quick start seeds it: a run that recorded its interval must read the same one here), the paired
t-test of student against teacher, and whether the 97% target lies inside the validation interval
(``target_in_interval``: the split cannot tell a miss from a pass).
Nothing is trained; nothing is written into the runs.

Writes ``benchmarks/results/<--name>.json``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import REPO_ROOT, portable, write_results
from scalingnote.evaluation.significance import paired_ttest, ratio_interval
from scalingnote.quickstart.scoring import EvalSet, Scored, TowerPool, load_eval_set, score

NAME = "retention_interval"
TARGET = 0.97  #: the student keeps >= 97% of its teacher's validation nDCG@10
BUDGET_ROOT = REPO_ROOT / ".cache" / "bench" / "quickstart_budget"


def budget_rows_by_out() -> dict[str, dict[str, Any]]:
    """The quickstart_budget row of each run directory (the newest with its name: the output on disk
    is the last run's), for the set, cores, code and machine it ran."""
    path = REPO_ROOT / "benchmarks" / "results" / "quickstart_budget.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    out: dict[str, dict[str, Any]] = {}
    for r in sorted((r for r in rows if r.get("out")), key=lambda r: str(r.get("created"))):
        out[r["out"]] = r
    return out


def _interval(a: dict[str, float], b: dict[str, float]) -> tuple[float, float, float]:
    ratio, lo, hi = ratio_interval(a, b)  # the quick start's own seed for it (0)
    return round(ratio, 4), round(lo, 4), round(hi, 4)


@dataclass
class Rescored:
    """A finished quick start scored again as it scored itself: its results, data, evaluation set and
    the chosen teacher's and student's scores (the student's queries against the teacher's documents)."""

    res: dict[str, Any]
    beir: Path
    ev: EvalSet
    teacher: Scored
    student: Scored


def rescore(run: Path) -> Rescored:
    """Score ``run``'s chosen teacher and student again (:func:`scalingnote.quickstart.scoring.score`)."""
    res = json.loads((run / "results.json").read_text())
    cfg, ch = res["config"], res["choices"]
    teacher_dir = Path(ch["teacher"]["dir"])
    if not teacher_dir.exists():  # the output was moved: its recorded paths are read inside it
        teacher_dir = run / "stage1" / teacher_dir.name
    student_dir = run / "qkd" / ch["student"]["chosen"] / "query_tower"
    beir = Path(cfg["data"]) if cfg.get("data") else run / "data"
    ev = load_eval_set(beir, cfg.get("eval_split") or "test", teacher_dir, cfg.get("max_eval_queries"))
    pool = TowerPool()
    t = score(pool, teacher_dir / "query_tower", teacher_dir, ev)
    return Rescored(res, beir, ev, t, score(pool, student_dir, teacher_dir, ev))


def measure(run: Path) -> dict[str, Any]:
    """One row for the finished quick start ``run``."""
    sc = rescore(run)
    cfg, ch, t, s = sc.res["config"], sc.res["choices"], sc.teacher, sc.student
    kept = ch.get("retention") or {}
    recorded = (kept.get("teacher_val"), kept.get("student_val"))
    if round(t.val_ndcg, 4) != recorded[0] or round(s.val_ndcg, 4) != recorded[1]:
        raise SystemExit(
            f"{run}: re-scored validation nDCG@10 teacher {t.val_ndcg:.4f} / student {s.val_ndcg:.4f} differs "
            f"from the recorded {recorded[0]} / {recorded[1]}: not the run's towers or queries"
        )
    seed = int(cfg.get("seed") or 0)
    rv, rv_lo, rv_hi = _interval(s.val_per_query, t.val_per_query)
    rt, rt_lo, rt_hi = _interval(s.per_query, t.per_query)
    if kept.get("retention_val_low") is not None and (kept["retention_val_low"], kept["retention_val_high"]) != (
        rv_lo,
        rv_hi,
    ):
        raise SystemExit(f"{run}: the interval differs from the one the run recorded ({kept})")
    return {
        "out": run.name,
        "seed": seed,
        "teacher_val_ndcg@10": t.val_ndcg,
        "student_val_ndcg@10": s.val_ndcg,
        "val_queries": len(s.val_per_query),
        "retention_val": rv,
        "retention_val_low": rv_lo,
        "retention_val_high": rv_hi,
        "val_p_student_vs_teacher": round(paired_ttest(s.val_per_query, t.val_per_query).pvalue, 4),
        "meets_target": rv >= TARGET,
        "target_in_interval": rv_lo <= TARGET <= rv_hi,
        "teacher_ndcg@10": round(t.metrics["ndcg@10"], 4),
        "student_ndcg@10": round(s.metrics["ndcg@10"], 4),
        "test_queries": len(s.per_query),
        "retention_test": rt,
        "retention_test_low": rt_lo,
        "retention_test_high": rt_hi,
    }


def parse_args(doc: str, name: str, pattern: str) -> tuple[argparse.Namespace, list[Path]]:
    """``--runs`` (comma-separated finished quick starts; default: those under :data:`BUDGET_ROOT`
    matching ``pattern``) and ``--name`` (the results file)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--runs", default=None, help=f"comma-separated quick-start outputs (default: {pattern})")
    ap.add_argument("--name", default=name)
    args = ap.parse_args()
    if args.runs:
        return args, [Path(p) for p in args.runs.split(",")]
    return args, sorted(p.parent for p in BUDGET_ROOT.glob(f"{pattern}/results.json"))


def main() -> None:
    args, runs = parse_args(__doc__, NAME, "*")
    if not runs:
        raise SystemExit(f"no finished quick start under {BUDGET_ROOT} (run benchmarks.quickstart_budget first)")
    measured = budget_rows_by_out()
    rows = []
    for run in runs:
        row = measure(run)
        b = measured.get(run.name, {})
        row.update({k: b.get(k) for k in ("set", "mode", "cores", "code", "machine")})
        rows.append(row)
        print(
            f"[{NAME}] {run.name}: retention val {row['retention_val']} "
            f"[{row['retention_val_low']}, {row['retention_val_high']}] over {row['val_queries']} queries, "
            f"test {row['retention_test']} [{row['retention_test_low']}, {row['retention_test_high']}]",
            flush=True,
        )
    print(f"wrote {write_results(args.name, rows, {'runs': [portable(r) for r in runs], 'target': TARGET})}")


if __name__ == "__main__":
    main()
