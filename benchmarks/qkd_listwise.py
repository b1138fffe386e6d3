"""QKD with and without its listwise term, at the same steps, on the quick start's own teacher.

    python -m benchmarks.qkd_listwise --data scifact --run runs/recipe/scifact [--epochs 12] [--weights 0,1]
    # score saved students:
    python -m benchmarks.qkd_listwise --data scifact --run DIR --students rw0_e12=DIR1 rw1_e12=DIR2 --weights ""
    python -m benchmarks.qkd_listwise --data synthetic --run runs/quickstart --epochs 30 --weights 0
        --students rw1=runs/quickstart/qkd/bert2_from_bert

The quick start's QKD (``scalingnote.quickstart.runs.run_qkd``: the teacher the run chose on
validation, the teacher family's small student, human + ICT queries, normalised targets, patience)
is trained once per ``rank_weight`` (0 = ScalingNote Eq. 15 alone; > 0 adds
``scalingnote.distill.loss.qkd_rank_loss`` over the teacher's top-k documents, not in the paper)
with everything else equal, under ``<run>/qkd/listwise_rw<w>_e<epochs>``. Each student is scored
against the teacher's document embeddings on the teacher's held-out *validation* queries (the
number the quick start chooses with) and on the test split (reported, never chosen on), with a
paired t-test of every variant against the first on both. With ``--students`` saved students
are scored as they are (their training settings are read from their ``run.json``), beside those
trained for ``--weights`` (give ``--weights ""`` to train none).

Every student has the teacher's validation queries held out of its distillation queries (``DistillConfig.
exclude_teacher_validation``): the validation figures are on queries no student imitated.

Writes ``benchmarks/results/qkd_listwise.json`` (rows of every data set measured so far are kept:
a run on one data set replaces only that data set's rows).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks._common import REPO_ROOT, RESULTS_DIR, shared_data_dir, write_results


def train_variants(data: str, run: Path, epochs: float, weights: list[float]) -> dict[str, Path]:
    """Train the quick start's QKD once per weight (resumable steps under ``run/qkd``)."""
    from benchmarks.recipe import LENGTHS
    from scalingnote.quickstart import QuickstartConfig, family, runs

    q_max, d_max = LENGTHS[data]
    res = json.loads((run / "results.json").read_text())
    teacher = res["choices"]["teacher"]
    cfg = QuickstartConfig(
        out=str(run),
        data=None if data == "synthetic" else str(shared_data_dir() / data),
        query_max_length=q_max,
        doc_max_length=d_max,
        qkd_epochs=epochs,
        show_progress=False,
    )
    fam = family(cfg, teacher["family"])
    data_spec = runs.prepare_data(cfg, run)
    pseudo = runs.pseudo_queries(cfg, data_spec, run)
    out = {}
    for w in weights:
        name = f"listwise_rw{w:g}_e{epochs:g}"
        runs.run_qkd(
            cfg,
            name,
            Path(teacher["dir"]),
            fam,
            fam.small_layers,
            data_spec,
            run,
            pseudo,
            rank_weight=w,
            pool=runs.layer_pool(teacher["dir"]),
        )
        out[name] = run / "qkd" / name
    return out


def score_students(data: str, teacher_dir: Path, students: dict[str, Path]) -> list[dict[str, Any]]:
    """Each student against the teacher's document embeddings, on the quick start's own evaluation
    set (:func:`scalingnote.quickstart.scoring.load_eval_set`: test split + the teacher's held-out
    validation queries), with paired t-tests against the first student."""
    from scalingnote.evaluation import evaluate
    from scalingnote.evaluation.significance import paired_ttest
    from scalingnote.quickstart.scoring import TowerPool, load_eval_set, per_query_ndcg, score

    data_dir = Path(json.loads((teacher_dir / "run.json").read_text())["config"]["data"]["data_dir"])
    ev, pool = load_eval_set(data_dir, "test", teacher_dir, None), TowerPool()
    rows, first = [], None
    for label, d in students.items():
        info = json.loads((d / "run.json").read_text())
        m, c = info["metrics"], info["config"]
        sc = score(pool, d / "query_tower", teacher_dir, ev)
        per_q = {"val_": per_query_ndcg(sc.val_run, ev.val_qrels), "": sc.per_query}
        row: dict[str, Any] = {
            "data": data,
            "student": label,
            "rank_weight": c.get("rank_weight", 0.0),
            "epochs": c["optim"]["epochs"],
            "steps_run": m["steps_run"],
            "best_step": m["best_step"],
            "train_queries": m["train_queries"],
            "train_seconds": m["train_seconds"],
            "val_ndcg@10": round(sc.val_ndcg, 4),
            "val_r@100": round(evaluate(sc.val_run, ev.val_qrels, ["r@100"])["r@100"], 4),
            "val_n_queries": len(per_q["val_"]),
            "ndcg@10": round(sc.metrics["ndcg@10"], 4),
            "r@100": round(sc.metrics["r@100"], 4),
            "n_queries": len(per_q[""]),
        }
        for prefix, pq in per_q.items():
            if first is not None:
                keys = sorted(pq)
                row[f"{prefix}p_vs_first"] = round(
                    paired_ttest([pq[k] for k in keys], [first[prefix][k] for k in keys]).pvalue, 4
                )
        first = first or per_q
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, choices=["scifact", "kuake_qtr", "synthetic"])
    ap.add_argument(
        "--run", type=Path, required=True, help="a finished quick-start / recipe run directory (its teacher is used)"
    )
    ap.add_argument("--epochs", type=float, default=12.0)
    ap.add_argument("--weights", default="0,1")
    ap.add_argument(
        "--students",
        nargs="*",
        default=None,
        help="label=DIR: saved students to score (first = the reference of the p-values)",
    )
    args = ap.parse_args()
    run = args.run.resolve()
    teacher_dir = Path(json.loads((run / "results.json").read_text())["choices"]["teacher"]["dir"])
    students = {s.split("=", 1)[0]: Path(s.split("=", 1)[1]).resolve() for s in args.students or []}
    weights = [float(w) for w in args.weights.split(",") if w.strip()]
    students.update(train_variants(args.data, run, args.epochs, weights) if weights else {})
    rows = score_students(args.data, teacher_dir, students)
    old = RESULTS_DIR / "qkd_listwise.json"
    kept = [r for r in json.loads(old.read_text())["rows"] if r["data"] != args.data] if old.exists() else []
    config = json.loads(old.read_text())["config"] if old.exists() else {}
    config[args.data] = {
        "run": str(run.relative_to(REPO_ROOT)) if run.is_relative_to(REPO_ROOT) else str(run),
        "teacher": str(teacher_dir),
        "students": {k: str(v) for k, v in students.items()},
        "trained_here": [f"listwise_rw{w:g}_e{args.epochs:g}" for w in weights],
        "val": "the teacher's held-out training queries (what the quick start chooses on)",
        "test": "test split (never chosen on)",
    }
    print(json.dumps(rows, indent=1))
    print(write_results("qkd_listwise", kept + rows, config))


if __name__ == "__main__":
    main()
