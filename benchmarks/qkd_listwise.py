"""QKD with and without its listwise term, at the same steps, on the quick start's own teacher.

    python -m benchmarks.qkd_listwise --data scifact --run runs/recipe/scifact [--epochs 12] [--weights 0,1]
    python -m benchmarks.qkd_listwise --data scifact --run DIR --students rw0_e12=DIR1 rw1_e12=DIR2 --weights ""  # score saved students
    python -m benchmarks.qkd_listwise --data synthetic --run runs/quickstart --epochs 30 --weights 0 --students rw1=runs/quickstart/qkd/bert2_from_bert

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


def _per_query(student_dir: Path, teacher_dir: Path, queries: dict[str, str], qrels) -> tuple[dict[str, float], dict[str, float]]:
    """(metrics, per-query nDCG@10) of a saved student against the teacher's document embeddings."""
    import numpy as np

    from scalingnote.evaluation.dense import truncate_normalize
    from scalingnote.evaluation.metrics import evaluate, per_query
    from scalingnote.models import load_tower

    s = load_tower(student_dir / "query_tower")
    s.eval()
    d_emb = truncate_normalize(np.load(teacher_dir / "doc_embeddings.npy", mmap_mode="r"))
    doc_ids = json.loads((teacher_dir / "doc_ids.json").read_text(encoding="utf-8"))
    qids = [q for q in queries if q in qrels]
    q = truncate_normalize(s.encode_queries([queries[x] for x in qids], batch_size=256, show_progress=False))
    scores = q @ d_emb.T
    top = np.argsort(-scores, axis=1)[:, :100]
    run = {qid: {doc_ids[j]: float(scores[i, j]) for j in top[i]} for i, qid in enumerate(qids)}
    qrels = {k: qrels[k] for k in qids}
    res = evaluate(run, qrels, ("ndcg@10", "r@100"))
    return {"ndcg@10": res["ndcg@10"], "r@100": res["r@100"]}, {q: float(v["ndcg@10"]) for q, v in per_query(run, qrels, ["ndcg@10"]).items()}


def _eval_sets(data_dir: Path, teacher_dir: Path) -> dict[str, tuple[dict[str, str], Any]]:
    from scalingnote.data import load_qrels, load_queries
    from scalingnote.data.beir import qrels_path
    from scalingnote.training.evaluate import heldout_queries

    val_q, val_qrels = heldout_queries(teacher_dir)
    qs = load_queries(data_dir / "queries.jsonl")
    test_qrels = load_qrels(qrels_path(data_dir, "test"), qs.keys())
    return {"val": (val_q, val_qrels), "test": ({q: qs[q].text for q in test_qrels}, test_qrels)}


def train_variants(data: str, run: Path, epochs: float, weights: list[float]) -> dict[str, Path]:
    """Train the quick start's QKD once per weight (resumable steps under ``run/qkd``)."""
    from benchmarks.recipe import LENGTHS
    from scalingnote.quickstart import QuickstartConfig, family
    from scalingnote.quickstart import runs as R

    q_max, d_max = LENGTHS[data]
    res = json.loads((run / "results.json").read_text())
    teacher = res["choices"]["teacher"]
    cfg = QuickstartConfig(out=str(run), data=None if data == "synthetic" else str(shared_data_dir() / data), query_max_length=q_max,
                           doc_max_length=d_max, qkd_epochs=epochs, show_progress=False)
    fam = family(cfg, teacher["family"])
    data_spec = R.prepare_data(cfg, run)
    pseudo = R.pseudo_queries(cfg, data_spec, run)
    out = {}
    for w in weights:
        name = f"listwise_rw{w:g}_e{epochs:g}"
        R.run_qkd(cfg, name, Path(teacher["dir"]), fam, fam.small_layers, data_spec, run, pseudo, rank_weight=w)
        out[name] = run / "qkd" / name
    return out


def score_students(data: str, teacher_dir: Path, students: dict[str, Path]) -> list[dict[str, Any]]:
    from scalingnote.evaluation.significance import paired_ttest

    data_dir = Path(json.loads((teacher_dir / "run.json").read_text())["config"]["data"]["data_dir"])
    sets = _eval_sets(data_dir, teacher_dir)
    rows, first = [], {}
    for label, d in students.items():
        info = json.loads((d / "run.json").read_text())
        m, c = info["metrics"], info["config"]
        row: dict[str, Any] = {"data": data, "student": label, "rank_weight": c.get("rank_weight", 0.0), "epochs": c["optim"]["epochs"],
                               "steps_run": m["steps_run"], "best_step": m["best_step"], "train_queries": m["train_queries"],
                               "train_seconds": m["train_seconds"]}
        for split, (queries, qrels) in sets.items():
            metrics, per_q = _per_query(d, teacher_dir, queries, qrels)
            prefix = "val_" if split == "val" else ""
            row.update({f"{prefix}{k}": round(v, 4) for k, v in metrics.items()}, **{f"{prefix}n_queries": len(per_q)})
            if split in first:
                keys = sorted(per_q)
                row[f"{prefix}p_vs_first"] = round(paired_ttest([per_q[k] for k in keys], [first[split][k] for k in keys]).pvalue, 4)
            else:
                first[split] = per_q
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, choices=["scifact", "kuake_qtr", "synthetic"])
    ap.add_argument("--run", type=Path, required=True, help="a finished quick-start / recipe run directory (its teacher is used)")
    ap.add_argument("--epochs", type=float, default=12.0)
    ap.add_argument("--weights", default="0,1")
    ap.add_argument("--students", nargs="*", default=None, help="label=DIR: saved students to score (first = the reference of the p-values)")
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
    config[args.data] = {"run": str(run.relative_to(REPO_ROOT)) if run.is_relative_to(REPO_ROOT) else str(run), "teacher": str(teacher_dir),
                         "students": {k: str(v) for k, v in students.items()}, "trained_here": [f"listwise_rw{w:g}_e{args.epochs:g}" for w in weights],
                         "val": "the teacher's held-out training queries (what the quick start chooses on)", "test": "test split (never chosen on)"}
    print(json.dumps(rows, indent=1))
    print(write_results("qkd_listwise", kept + rows, config))


if __name__ == "__main__":
    main()
