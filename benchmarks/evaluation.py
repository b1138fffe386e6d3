"""Evaluation code vs the trec_eval reference (pytrec_eval) on real BM25 runs
-> benchmarks/results/evaluation.json.

For each shared dataset (test split, BM25 top-1000 run): every metric of
scalingnote.evaluation, the largest per-query absolute difference to pytrec_eval over
all metrics and queries, and the time each implementation takes to evaluate the run.
"""

from __future__ import annotations

import time

import numpy as np
import pytrec_eval

from benchmarks._common import shared_data_dir, write_results
from scalingnote.data import load_qrels
from scalingnote.evaluation import evaluate, per_query
from scalingnote.sparse.bm25 import bm25_search

# ours -> pytrec_eval measure key
PAIRS = {
    "ndcg@10": "ndcg_cut_10",
    "recall@100": "recall_100",
    "recall@1000": "recall_1000",
    "r@100": "success_100",
    "map": "map",
    "map@100": "map_cut_100",
    "p@10": "P_10",
    "mrr": "recip_rank",
}
MEASURES = {"ndcg_cut.10", "recall.100,1000", "success.100", "map", "map_cut.100", "P.10", "recip_rank"}


def main() -> None:
    rows = []
    for name in ("scifact", "kuake_qtr"):
        root = shared_data_dir() / name
        run, _ = bm25_search(root, "test", k=1000, show_progress=False)
        qrels = load_qrels(root / "qrels" / "test.tsv")
        metrics = list(PAIRS)

        t0 = time.perf_counter()
        ours = per_query(run, qrels, metrics)
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = pytrec_eval.RelevanceEvaluator(qrels, MEASURES).evaluate(run)
        t_ref = time.perf_counter() - t0

        assert ours.keys() == ref.keys(), "query sets differ"
        max_diff = max(abs(ours[q][m] - ref[q][k]) for q in ours for m, k in PAIRS.items())
        means = evaluate(run, qrels, [*metrics, "mrr@10"])
        extra = {}
        graded = root / "qrels_graded" / "test.tsv"
        if graded.exists():  # AUC over the graded judged pairs (grade >= 2 positive), BM25 score per pair
            g = load_qrels(graded)
            extra = {
                k + "_graded": round(v, 4) for k, v in evaluate(run, g, ["auc", "qauc"], relevance_level=2).items()
            }
        rows.append(
            {
                "dataset": name,
                "split": "test",
                "run": "bm25@1000",
                "queries": len(ours),
                **{k: round(v, 4) for k, v in means.items()},
                **extra,
                "ndcg@10_pytrec_eval": round(float(np.mean([v["ndcg_cut_10"] for v in ref.values()])), 4),
                "max_abs_diff_vs_pytrec_eval": float(max_diff),
                "eval_s": round(t_ours, 3),
                "pytrec_eval_s": round(t_ref, 3),
            }
        )
        print(rows[-1])
    path = write_results(
        "evaluation",
        rows,
        {
            "reference": "pytrec_eval (trec_eval 9)",
            "compared_metrics": PAIRS,
            "bm25": "scalingnote.sparse.bm25 defaults, k=1000",
            "auc_graded": "kuake_qtr qrels_graded, grade >= 2 positive, judged pairs not retrieved rank last; "
            "queries outside the run ignored",
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
