"""Does the index step choose the same structure twice? The quick start's structure choice repeated
on the same vectors, judged by each latency rule.

``python -m benchmarks.index_choice --run <quick-start or recipe run> --set kuake_qtr --repeats 3``
takes a finished run's towers (its teacher's document vectors, its chosen student's query vectors:
:func:`benchmarks._ood_towers.from_run`) and runs the index step's choice
(:func:`scalingnote.index.routing.method_tune.choose_method`, every default candidate plus the
query-guided graphs, sized as the quick start sizes them) ``--repeats`` times on the same inputs: only
the machine's timing differs between repeats. Each repeat's report is judged by three rules:

* ``fastest``: the lowest single-query latency timed one method after another (no margin);
* ``band``: latencies within 25% of the fastest tie, the first listed wins (the rule before the head-to-head);
* ``paired``: the contenders within 25% timed again head to head, paired per query, the fastest
  unless an earlier-listed one is not separably slower (what the index step does now).

Rows: one per repeat and method that met the target (its sequential and paired latencies, p), and
one per rule (``rule``: the structures it chose over the repeats, how many distinct). Writes
``benchmarks/results/index_choice.json``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from benchmarks import _ood_towers as towers
from benchmarks._common import Timer, write_results
from scalingnote.index.faiss.methods import default_routing, query_edge_variants
from scalingnote.index.routing.method_tune import (
    DEFAULT_METHODS,
    LATENCY_TIE,
    choose_method,
    eligible,
    fastest_within_tie,
)

NAME = "index_choice"
PAIRED_KEYS = ("latency_ms_paired", "paired_p", "paired_queries")


def _judge(methods: list[dict]) -> dict[str, str]:
    """The structure each rule chooses from one report's method rows."""
    ok = eligible(methods)
    if not ok:
        return {}
    plain = [{k: v for k, v in r.items() if k not in PAIRED_KEYS} for r in ok]
    return {
        "fastest": min(plain, key=lambda r: r["latency_ms_single"])["structure"],
        "band": fastest_within_tie(plain)[0]["structure"],
        "paired": fastest_within_tie(ok)[0]["structure"],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished quick-start or recipe run directory")
    ap.add_argument("--set", default="kuake_qtr", choices=["kuake_qtr", "scifact"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    ts = towers.from_run(args.set, args.run, args.seed)
    n, d = ts.docs.shape
    methods = (*DEFAULT_METHODS, "hnsw_sq_qg", "hnsw_lean")
    routing = {"hnsw_sq_qg": query_edge_variants(default_routing("hnsw_sq_qg", n, d, seed=args.seed))}
    edge = np.concatenate([ts.queries["train"], ts.pseudo])
    rows: list[dict] = []
    chosen: dict[str, list[str]] = {"fastest": [], "band": [], "paired": []}
    seconds = []
    for rep in range(args.repeats):
        with Timer() as t:
            report = choose_method(
                ts.docs,
                ts.queries["val"],
                ts.queries["train"],
                methods=methods,
                routing=routing,
                seed=args.seed,
                edge_queries=edge,
                log=print,
            )
        seconds.append(round(t.seconds, 1))
        picks = _judge(report["methods"])
        for rule, structure in picks.items():
            chosen[rule].append(structure)
        for r in report["methods"]:
            if "skipped" in r or not r["met"]:
                continue
            rows.append(
                {
                    "set": args.set,
                    "repeat": rep,
                    "structure": r["structure"],
                    "recall@10": r["recall"],
                    "share_scanned": r["share_scanned"],
                    "latency_ms_single": r["latency_ms_single"],
                    **{k: r.get(k) for k in PAIRED_KEYS},
                    "memory_ratio": r["memory_ratio"],
                    **{f"chosen_{rule}": structure == r["structure"] for rule, structure in picks.items()},
                }
            )
        print(f"repeat {rep}: {picks} ({t.seconds:.0f} s)", flush=True)
    for rule, picks_of in chosen.items():
        rows.append(
            {
                "set": args.set,
                "rule": rule,
                "repeats": len(picks_of),
                "distinct_choices": len(set(picks_of)),
                "choices": " / ".join(picks_of),
            }
        )
    config = {
        "run": str(args.run),
        "set": args.set,
        "repeats": args.repeats,
        "seed": args.seed,
        "docs": n,
        "dim": d,
        "val_queries": len(ts.queries["val"]),
        "train_queries": len(ts.queries["train"]),
        "edge_queries": len(edge),
        "doc_tower": ts.doc_tower,
        "query_tower": ts.query_tower,
        "methods": list(methods),
        "band": LATENCY_TIE,
        "seconds_per_repeat": seconds,
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "ran_under_bench_lock": os.environ.get("BENCH_LOCK", "unknown"),
    }
    print(f"wrote {write_results(NAME, rows, config)}")


if __name__ == "__main__":
    main()
