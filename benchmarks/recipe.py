"""The quick start's recipe on a shared data set, measured: every choice on validation queries.

    python -m benchmarks.recipe --data scifact|kuake_qtr|synthetic [--llm-depths 2,4] [--student-p99-ms X] [--tag NAME]

Runs the quick-start pipeline (``scalingnote.quickstart``: readable families, large towers with
depth and head learning rate chosen on validation and the zero-shot guard, the teacher, QKD
students, the paper's comparison at matched online cost per family, the served default) on the
full test split and corpus, and writes ``benchmarks/results/recipe_<data>.json`` with one row per
method (columns ``method``, ``large_tower``, ``query_tower``, ``query_layers``, ``ndcg@10``,
``r@100``, ``query_qps``, ``val_ndcg@10``, ``chosen``, ...), the choices and their reasons, and
the acceptance checks of the recipe (``targets``), each computed from the rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks._common import REPO_ROOT, shared_data_dir, write_results
from scalingnote.quickstart.report import BASELINES

#: per data set: query / document lengths (tokens). KUAKE titles are short, but the LLM document prompt (§3.2) adds
#: its template around them: at 64 tokens it crowded the text out (nDCG@10 0.22 vs 0.57 at 256)
LENGTHS = {"scifact": (64, 256), "kuake_qtr": (64, 256), "synthetic": (32, 128)}


def targets(rows: list[dict[str, Any]], ordering: dict[str, bool]) -> dict[str, Any]:
    """The recipe's acceptance checks, from the rows of one run."""
    by = {r["method"]: r for r in rows}
    student = next(r for r in rows if "student" in r["chosen"])
    served = next(r for r in rows if "served" in r["chosen"])
    baselines = [r for r in rows if r["method"].startswith(BASELINES)]
    six = [r for r in rows if r["method"] == "scaling_dual" and r["query_layers"] and r["query_layers"] >= 6]
    zero = next((r for r in rows if r["method"].startswith("zero_shot_")), None)
    t = {
        "student_ndcg@10": student["ndcg@10"],
        "bm25_ndcg@10": by["bm25"]["ndcg@10"],
        "zero_shot_ndcg@10": zero["ndcg@10"] if zero else None,
        "student_ge_bm25": student["ndcg@10"] >= by["bm25"]["ndcg@10"],
        "student_ge_max_bm25_zero_shot": student["ndcg@10"] >= max(r["ndcg@10"] for r in baselines),
        "student_p_vs_best_baseline": student.get("p_vs_best_baseline"),  # paired t-test (runs since 2026-11-26)
        "served": served["method"],
        "served_ndcg@10": served["ndcg@10"],
        "served_ge_every_baseline": all(served["ndcg@10"] >= r["ndcg@10"] for r in baselines),
        "served_p_vs_best_baseline": served.get("p_vs_best_baseline"),
        "served_ge_max_bm25_student": served["ndcg@10"] >= max(by["bm25"]["ndcg@10"], student["ndcg@10"]),
        "ordering_twinbert_small<scaling_doc<scalingnote<=scaling_dual": ordering,
    }
    ivf = by.get("scalingnote+ivfpq")
    if ivf:  # what the compressed index (nprobe / re-rank chosen on validation + training queries) costs the student
        t["ivfpq_ndcg@10"] = ivf["ndcg@10"]
        t["ivfpq_minus_exact_student"] = round(ivf["ndcg@10"] - student["ndcg@10"], 4)
        t["ivfpq_ge_every_baseline"] = all(ivf["ndcg@10"] >= r["ndcg@10"] for r in baselines)
    if six and student.get("query_qps"):
        t["student_speedup_vs_6_layer_tower"] = round(student["query_qps"] / six[0]["query_qps"], 2)
    return t


def results_of_run(name: str, out: Path, note: dict[str, Any] | None = None, timed: bool = False) -> Path:
    """``benchmarks/results/<name>.json`` from a finished quick-start run directory (its
    ``results.json``: rows, choices, resolved config, versions). ``timed``: the run did every step
    (the quick start's 10-minute budget is checked on it); a recipe run may reuse steps, so its
    wall time (``elapsed_s_last_run``) is only what that invocation redid."""
    res = json.loads((out / "results.json").read_text())
    flat = [
        {
            k: (None if isinstance(v, float) and v != v else round(v, 4) if isinstance(v, float) else v)
            for k, v in r.items()
        }
        for r in res["rows"]
    ]  # NaN (no figure) -> null: strict JSON
    config = {
        **res["config"],
        "out": str(out.relative_to(REPO_ROOT)) if out.is_relative_to(REPO_ROOT) else str(out),
        "choices": res["choices"],
        "elapsed_s_last_run": res["elapsed_s"],
        "phase_seconds_last_run": res.get("phase_seconds"),
        "targets": {
            **targets(flat, res["choices"]["ordering"]),
            **(
                {
                    "pipeline_minutes": round(res["elapsed_s"] / 60, 1),
                    "pipeline_within_10_minutes": res["elapsed_s"] <= 600,
                }
                if timed
                else {}
            ),
        },
        "query_qps": "encode_queries, batch 256, 512 queries, torch threads of the machine, best of 3 passes; "
        "every tower of the run timed in the same rounds, taking turns (query_qps_many)",
        "p99_ms": "single-query encode, one intra-op thread, 200 queries one at a time, after 10 warm-up queries",
        **(note or {}),
    }
    return write_results(name, flat, config)


def run(
    data: str,
    llm_depths: list[int],
    student_p99_ms: float | None,
    out: Path | None,
    extra: dict[str, Any],
    name: str | None = None,
) -> Path:
    from scalingnote.quickstart import QuickstartConfig, quickstart

    q_max, d_max = LENGTHS[data]
    out = out or REPO_ROOT / "runs" / "recipe" / data
    # the recipe tables compare every readable family (the quick start: the teacher's) and train every
    # candidate in full: the recipe is the exhaustive reference the budgeted quick start is checked against
    extra = {"compare": "all", "full": True, **extra}
    cfg = QuickstartConfig(
        out=str(out),
        data=None if data == "synthetic" else str(shared_data_dir() / data),
        llm_depths=llm_depths,
        query_max_length=q_max,
        doc_max_length=d_max,
        student_p99_ms=student_p99_ms,
        show_progress=False,
        **extra,
    )
    quickstart(cfg)
    return results_of_run(name or f"recipe_{data}", out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="scifact", choices=sorted(LENGTHS))
    ap.add_argument("--llm-depths", default="2,4")
    ap.add_argument("--student-p99-ms", type=float, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--set", action="append", default=[], help="QuickstartConfig override key=JSON value, e.g. --set qkd_epochs=10"
    )
    ap.add_argument(
        "--from-run", type=Path, default=None, help="write the results file from this finished run directory instead"
    )
    ap.add_argument("--tag", default=None, help="write recipe_<data>_<tag>.json (a variant beside the default table)")
    args = ap.parse_args()
    name = f"recipe_{args.data}" + (f"_{args.tag}" if args.tag else "")
    if args.from_run is not None:
        print(results_of_run(name, args.from_run.resolve()))
        return
    extra = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    print(run(args.data, [int(x) for x in args.llm_depths.split(",")], args.student_p99_ms, args.out, extra, name))


if __name__ == "__main__":
    main()
