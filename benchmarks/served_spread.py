"""Whether the served rows of a set's seeds are apart, or only read apart: paired tests between them.

    python -m benchmarks.served_spread [--runs DIR,DIR,...] [--name served_spread]

``--runs`` (default: every budgeted output under ``.cache/bench/quickstart_budget/``): finished quick
starts. For each, the served configuration is computed again from its parts as the run computed its
exact rows (the chosen student's queries against the teacher's document embeddings, fused with BM25 at
the recorded norm and weight when hybrid is served, :func:`scalingnote.index.hybrid.hybrid_search_run`),
and its test nDCG@10 is checked against the run's own exact row of that configuration (the served row
itself goes through the served index; ``served_ndcg@10`` is reported beside it). Then, for every two
runs of the same set and code, the per-query difference on the test queries: its mean, the 95%
percentile bootstrap interval (:func:`scalingnote.evaluation.significance.paired_bootstrap`) and the
paired t-test. ``separated``: the interval leaves out 0 (the two runs serve different quality, not
the same quality read through the same queries' noise).

Rows: ``kind=run`` (one per run) and ``kind=pair`` (one per two runs). Nothing is trained; nothing is
written into the runs. Writes ``benchmarks/results/<--name>.json``.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path
from typing import Any

from benchmarks._common import portable, write_results
from benchmarks.retention_interval import budget_rows_by_out, parse_args, rescore
from scalingnote.data import load_corpus
from scalingnote.evaluation import evaluate
from scalingnote.evaluation.significance import paired_bootstrap, paired_ttest
from scalingnote.index.hybrid import hybrid_search_run
from scalingnote.quickstart.run_data import corpus_file
from scalingnote.quickstart.scoring import per_query_ndcg
from scalingnote.sparse.bm25 import BM25Retriever

NAME = "served_spread"
EXACT_ROW = {"hybrid": "scalingnote+bm25_weighted", "dense": "scalingnote"}


def served_per_query(run: Path, bm25: dict[Path, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """(per-query test nDCG@10 of ``run``'s served configuration, its run row); ``bm25``: fitted
    retrievers by corpus file, shared across runs of one data set."""
    sc = rescore(run)
    served = sc.res["choices"]["served"]
    dense = sc.student.run
    if served["choice"] == "hybrid":
        f = corpus_file({"beir": sc.beir})
        if f not in bm25:
            bm25[f] = BM25Retriever.fit(load_corpus(f).values(), show_progress=False)
        bm_run = bm25[f].search(dict(zip(sc.ev.qids, sc.ev.texts, strict=True)), k=100, show_progress=False)
        fused, _ = hybrid_search_run(dense, bm_run, "weighted", k=100, weight=served["weight"], norm=served["norm"])
    else:
        fused = dense
    ndcg = round(float(evaluate(fused, sc.ev.qrels, ["ndcg@10"])["ndcg@10"]), 4)
    rows = sc.res["rows"]
    exact = next(r for r in rows if r["method"] == EXACT_ROW[served["choice"]])
    if abs(ndcg - exact["ndcg@10"]) > 1e-4:
        raise SystemExit(
            f"{run}: the served configuration re-computed scores {ndcg:.4f}, the run's own exact row "
            f"{exact['method']} {exact['ndcg@10']:.4f}: not the run's parts"
        )
    recorded = next(r for r in rows if "served" in r["chosen"].split("+"))
    row = {
        "kind": "run",
        "out": run.name,
        "seed": int(sc.res["config"].get("seed") or 0),
        "served": served["choice"],
        "exact_served_ndcg@10": ndcg,
        "served_ndcg@10": round(recorded["ndcg@10"], 4),
        "test_queries": len(sc.ev.qids),
    }
    return per_query_ndcg(fused, sc.ev.qrels), row


def pair_row(a: dict[str, Any], b: dict[str, Any], pa: dict[str, float], pb: dict[str, float]) -> dict[str, Any]:
    """The paired comparison of two runs' served rows on the same test queries (``a - b``)."""
    boot = paired_bootstrap(pa, pb, seed=0)
    return {
        "kind": "pair",
        "set": a.get("set"),
        "code": a.get("code"),
        "a": a["out"],
        "b": b["out"],
        "delta": round(boot.mean_diff, 4),
        "delta_low": round(boot.low, 4),
        "delta_high": round(boot.high, 4),
        "p_bootstrap": round(boot.pvalue, 4),
        "p_ttest": round(paired_ttest(pa, pb).pvalue, 4),
        "separated": not boot.low <= 0 <= boot.high,
        "test_queries": boot.n,
    }


def main() -> None:
    args, runs = parse_args(__doc__, NAME, "*_budgeted_*")
    if len(runs) < 2:
        raise SystemExit(f"fewer than two finished quick starts to compare ({runs})")
    measured, bm25 = budget_rows_by_out(), {}
    rows, per_query = [], {}
    for run in runs:
        pq, row = served_per_query(run, bm25)
        b = measured.get(run.name, {})
        row.update({k: b.get(k) for k in ("set", "mode", "cores", "code", "machine")})
        rows.append(row)
        per_query[run.name] = pq
        print(f"[{NAME}] {run.name}: {row['served']} {row['exact_served_ndcg@10']} (served {row['served_ndcg@10']})")
    runs_by = [r for r in rows if r["kind"] == "run"]
    for a, b in combinations(runs_by, 2):
        if (a.get("set"), a.get("code")) == (b.get("set"), b.get("code")):
            rows.append(pair_row(a, b, per_query[a["out"]], per_query[b["out"]]))
            p = rows[-1]
            print(f"[{NAME}] {a['out']} - {b['out']}: {p['delta']} [{p['delta_low']}, {p['delta_high']}]")
    print(f"wrote {write_results(args.name, rows, {'runs': [portable(r) for r in runs]})}")


if __name__ == "__main__":
    main()
