"""The quick start's served row measured through the service, as a user runs it.

    python -m benchmarks.served_http --run runs/recipe/scifact --set scifact
    python -m benchmarks.served_http --run /tmp/qs --set synthetic

Starts the ``scalingnote serve`` command the quick start prints for ``--run`` (its index directory
as built and tuned, the chosen student, the ``fusion.json`` beside the index: no other flag), sends
every test query of the run's table over HTTP (``POST /search``, k=100, the service's default mode)
and scores the answers with the run's qrels. One row per set (merged into
``benchmarks/results/served_http.json``): the table's served nDCG@10, the HTTP one and their
difference (target: <= 1e-4), the served structure and setting from the index manifest, and whether
the HTTP-measured served row is >= every baseline row of the table (BM25, zero-shot).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks._common import RESULTS_DIR, ServeProcess, chosen_student, portable, write_results
from scalingnote.config import load_config
from scalingnote.evaluation import evaluate
from scalingnote.quickstart import QuickstartConfig
from scalingnote.quickstart import runs as qs_runs
from scalingnote.quickstart.report import BASELINES
from scalingnote.quickstart.scoring import load_eval_set


def serve_args(out: Path) -> list[str]:
    """The arguments of the serve command the quick start printed for ``out`` (main.py's last lines)."""
    ch = json.loads((out / "results.json").read_text(encoding="utf-8"))["choices"]
    student = chosen_student(ch)["dir"]
    return ["--index", str(out / "index" / "ivfpq"), "--query-tower", str(student)]


def measure(out: Path) -> dict[str, Any]:
    res = json.loads((out / "results.json").read_text(encoding="utf-8"))
    cfg = load_config(QuickstartConfig, out / "quickstart.yaml")
    data = qs_runs.prepare_data(cfg, out)  # a finished step: read back, not redone
    ev = load_eval_set(Path(data["beir"]), cfg.eval_split, Path(res["choices"]["teacher"]["dir"]), cfg.max_eval_queries)
    qrels = ev.qrels
    args = serve_args(out)
    svc = ServeProcess([*args, "--log-level", "warning"])
    try:
        health = svc.wait_ready(timeout=900)
        run: dict[str, dict[str, float]] = {}
        t0 = time.perf_counter()
        with httpx.Client(trust_env=False, timeout=120) as client:
            for qid, text in zip(ev.qids, ev.texts, strict=True):
                r = client.post(svc.url + "/search", json={"query": text, "k": 100})
                r.raise_for_status()
                run[qid] = {h["doc_id"]: float(h["score"]) for h in r.json()["results"]}
        wall = time.perf_counter() - t0
    finally:
        svc.stop()
    http = evaluate(run, qrels, ["ndcg@10"])["ndcg@10"]
    rows = res["rows"]
    served = next(r for r in rows if r.get("chosen") and "served" in r["chosen"])
    baselines = [r for r in rows if r["method"].startswith(BASELINES) and r.get("ndcg@10") is not None]
    best = max(baselines, key=lambda r: r["ndcg@10"])
    man = json.loads((out / "index" / "ivfpq" / "manifest.json").read_text(encoding="utf-8"))
    chosen = (man.get("search_tuning") or {}).get("chosen") or {}
    return {
        "served_method": served["method"],
        "table_ndcg@10": round(served["ndcg@10"], 4),
        "http_ndcg@10": round(http, 4),
        "abs_diff": round(abs(http - served["ndcg@10"]), 6),
        "equal_to_1e-4": abs(http - served["ndcg@10"]) <= 1e-4,
        "test_queries": len(run),
        "best_baseline": best["method"],
        "best_baseline_ndcg@10": round(best["ndcg@10"], 4),
        "http_ge_every_baseline": all(http >= r["ndcg@10"] for r in baselines),
        "structure": chosen.get("structure") or health.get("index", {}).get("factory"),
        "setting": " ".join(f"{k}={chosen[k]}" for k in ("nprobe", "ef_search", "rerank") if chosen.get(k) is not None),
        "share_scanned": chosen.get("share_scanned"),
        "val_recall@10_vs_exact": chosen.get("recall"),
        "http_queries_per_s": round(len(run) / wall, 1),
        "serve_command": "scalingnote serve " + " ".join(_in_run(a, out) for a in args),
    }


def _in_run(arg: str, out: Path) -> str:
    """A serve argument as the results file records it: a path inside the run as ``<run>/...``."""
    try:
        return str(Path("<run>") / Path(arg).resolve().relative_to(out.resolve()))
    except ValueError:
        return arg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished quick-start (or recipe) run directory")
    ap.add_argument("--set", required=True, help="the data set's name in the results file")
    args = ap.parse_args()
    out = args.run.resolve()
    row = {"set": args.set, **measure(out), "run": portable(args.run)}
    path = RESULTS_DIR / "served_http.json"
    old = json.loads(path.read_text(encoding="utf-8"))["rows"] if path.exists() else []
    rows = [r for r in old if r["set"] != args.set] + [row]  # one row per set: a set measured again replaces its row
    print(json.dumps(row, indent=1))
    print(
        write_results("served_http", sorted(rows, key=lambda r: r["set"]), {"runs": {r["set"]: r["run"] for r in rows}})
    )


if __name__ == "__main__":
    main()
