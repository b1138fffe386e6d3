"""BM25 baseline on the shared BEIR sets (test splits) -> benchmarks/results/bm25.json.

Metrics come from scalingnote.evaluation and are cross-checked against pytrec_eval
(trec_eval's reference implementation) in the same run.
"""

from __future__ import annotations

import time

from benchmarks._common import report, shared_data_dir
from scalingnote.evaluation import evaluate
from scalingnote.sparse.bm25 import BM25Config, bm25_search

METRICS = ["ndcg@10", "recall@100", "r@100", "mrr@10", "map"]


def main() -> None:
    cfg = BM25Config()
    rows = []
    for name in ("scifact", "kuake_qtr"):
        t0 = time.perf_counter()
        run, retriever = bm25_search(shared_data_dir() / name, "test", k=1000, config=cfg, show_progress=False)
        elapsed = time.perf_counter() - t0
        from scalingnote.data import load_qrels

        qrels = load_qrels(shared_data_dir() / name / "qrels" / "test.tsv")
        m = evaluate(run, qrels, METRICS)
        import numpy as np
        import pytrec_eval

        ref = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
        ref_ndcg = float(np.mean([v["ndcg_cut_10"] for v in ref.values()]))
        rows.append(
            {
                "dataset": name,
                "split": "test",
                "method": "bm25",
                "language": retriever.language,
                "queries": len(run),
                "docs": len(retriever.doc_ids),
                **{k: round(v, 4) for k, v in m.items()},
                "ndcg@10_pytrec_eval": round(ref_ndcg, 4),
                "index_and_search_s": round(elapsed, 2),
            }
        )
        print(rows[-1])
    report(
        "bm25",
        rows,
        {
            "k1": cfg.k1,
            "b": cfg.b,
            "method": cfg.method,
            "k": 1000,
            "english": "stemmed (Snowball) + stop words",
            "chinese": "character bigrams",
        },
    )


if __name__ == "__main__":
    main()
