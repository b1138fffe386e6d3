"""Scaling-law benchmark: a real (small) model-size x data-size sweep on SciFact, then fits of
the three laws (Fang et al. Eq. 7, 8, 9; ScalingNote Eq. 18-20) with held-out predictions.

    python benchmarks/scaling_sweep.py [--config configs/scaling_sweep_scifact.yaml] [--set steps=16 ...]

- sweep: ``scalingnote.scaling.run_sweep`` (resumable; grid points under
  .cache/bench/scaling_sweep_scifact/), each point scored by contrastive perplexity on ONE
  fixed validation set (held-out SciFact train queries, W=256 negatives, fixed seed);
- writes benchmarks/results/scaling_sweep.json (one row per grid point: N, D, loss, layers,
  steps, seconds, ...), benchmarks/results/scaling_fit.json (one row per law: parameters,
  R², standard errors, and the error of predicting held-out points: the largest N for the
  model and joint laws, the largest D for the data law), and PNG plots under
  benchmarks/results/plots/.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import REPO_ROOT, RESULTS_DIR, shared_data_dir, write_results  # noqa: E402

HOLDOUT_BY = {"model": "N", "data": "D", "joint": "N"}


def fit_rows(rows, loss_fn: str = "soft_l1"):
    """Full fits (for parameters / R²) and hold-out fits (for prediction error) of each law."""
    from scalingnote.errors import ScalingNoteError
    from scalingnote.scaling.fit import fit_table

    fits, out = {}, []
    for law in ("model", "data", "joint"):
        rec: dict = {"law": law}
        try:
            full = fit_table(rows, law, loss_fn=loss_fn)
        except ScalingNoteError as e:
            rec["error"] = str(e)
            out.append(rec)
            continue
        fits[law] = full
        for k in ("A", "alpha", "B", "beta", "delta"):
            rec[k] = full.params.get(k)
        rec["r2"] = round(full.r2, 6)
        rec["rmse"] = full.rmse
        rec["n_fit"] = full.n_fit
        for k, v in full.stderr.items():
            rec[f"stderr_{k}"] = v if math.isfinite(v) else None
        rec["at_bound"] = ",".join(full.at_bound) or None
        rec["fixed"] = ",".join(f"{k}={v:g}" for k, v in full.fixed.items()) or None
        by = HOLDOUT_BY[law]
        try:
            ho = fit_table(rows, law, holdout_largest=1, holdout_by=by, loss_fn=loss_fn)
            rec["holdout"] = f"largest {by}"
            rec["holdout_n"] = ho.holdout["n"]
            rec["holdout_n_fit"] = ho.n_fit
            rec["holdout_mae"] = ho.holdout["mae"]
            rec["holdout_rmse"] = ho.holdout["rmse"]
            rec["holdout_mape"] = ho.holdout["mape"]
            rec["holdout_fit_r2"] = ho.r2
        except ScalingNoteError as e:
            rec["holdout"] = f"not possible: {e}"
        out.append(rec)
    return fits, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(REPO_ROOT / "configs" / "scaling_sweep_scifact.yaml"))
    ap.add_argument("--set", dest="set_", action="append", default=[], help="Override a SweepConfig key, e.g. steps=16")
    ap.add_argument("--output-dir", default=str(REPO_ROOT / ".cache" / "bench" / "scaling_sweep_scifact"))
    ap.add_argument("--budget", type=float, action="append", default=None, help="Budgets ($) for the budget plot")
    ap.add_argument("--noise-seeds", default="43,44",
                    help="Re-train one grid point (largest N, second-largest D) with these train seeds to measure the seed noise "
                    "of the loss ('' to skip)")
    args = ap.parse_args()

    import torch

    from scalingnote.cli.train import parse_overrides
    from scalingnote.config import config_to_dict
    from scalingnote.scaling.budget import CostModel, plan_both
    from scalingnote.scaling.plots import plot_all
    from scalingnote.scaling.sweep import load_sweep_config, run_sweep

    torch.set_num_threads(2)
    over = parse_overrides(args.set_)
    over.setdefault("output_dir", args.output_dir)
    over.setdefault("train__data__data_dir", str(shared_data_dir() / "scifact"))
    cfg = load_sweep_config(args.config, **over)
    t0 = time.perf_counter()
    res = run_sweep(cfg)
    wall = time.perf_counter() - t0

    # seed noise: the same grid point trained with other seeds (other projection init, data order
    # and D-subset), scored on the same validation set
    noise = None
    seeds = [int(x) for x in args.noise_seeds.split(",") if x.strip()]
    if seeds:
        L, D = max(cfg.layers), sorted(cfg.data_sizes)[-2] if len(cfg.data_sizes) > 1 else cfg.data_sizes[0]
        losses = {cfg.train.seed: next(r["loss"] for r in res.rows if r["layers"] == L and r["D"] == D)}
        for s in seeds:
            o = dict(over, output_dir=f"{over['output_dir']}_seed{s}", layers=[L], data_sizes=[D], train__seed=s)
            r = run_sweep(load_sweep_config(args.config, **o))
            assert r.validation["hash"] == res.validation["hash"], "seed runs must use the same validation set"
            losses[s] = r.rows[0]["loss"]
        vals = list(losses.values())
        noise = {"point": f"layers={L}, D={D}", "loss_by_seed": {str(k): v for k, v in losses.items()},
                 "std": float(statistics.stdev(vals)), "range": max(vals) - min(vals)}

    keep = ("N", "D", "loss", "layers", "steps", "train_examples", "train_seconds", "eval_seconds", "seconds", "final_train_loss")
    rows = [{k: r.get(k) for k in keep} for r in res.rows]
    sweep_config = {
        "sweep": config_to_dict(cfg),
        "validation": res.validation,
        "model": f"{cfg.train.query_tower.model} truncated to {cfg.layers} layers ({cfg.train.method}, both towers)",
        "data": "SciFact train split (nested subsets of the shuffled (query, positive) pairs)",
        "fixed_validation": res.validation["source"] + f"; W={res.validation['num_negatives']} negatives per pair from a fixed pool of "
        f"{res.validation['doc_pool']} docs, seed {res.validation['seed']}, s = cos/{res.validation['temperature']}",
        "sweep_wall_seconds_this_invocation": round(wall, 1),
        "load_average_1_5_15min_at_end": [round(x, 2) for x in os.getloadavg()],
        "sweep_seconds_sum_of_points": round(sum(r["seconds"] for r in res.rows), 1),
        "seed_noise": noise,
    }
    p1 = write_results("scaling_sweep", rows, sweep_config)

    fits, fit_out = fit_rows(rows)
    budgets = args.budget or [1e5, 1e6, 1e7]
    costs = CostModel()
    plan_notes = {}
    if "joint" in fits:
        for b in budgets:
            try:
                both = plan_both(fits["joint"], b, costs, n_range=(1e5, 1e12))
                plan_notes[f"{b:g}"] = {k: {"N": round(v.N), "D": round(v.D), "loss": round(v.loss, 4)} for k, v in both.items()}
            except Exception as e:  # noqa: BLE001 - report, do not fail the benchmark
                plan_notes[f"{b:g}"] = str(e)
    p2 = write_results(
        "scaling_fit",
        fit_out,
        {
            "input": str(p1.relative_to(REPO_ROOT)),
            "method": "scipy least_squares, soft_l1 loss (f_scale = 1.4826 MAD of the residuals, iterated), log-parameters, multi-start",
            "model_law": "L(N) = (A/N)^alpha + delta on the rows at the largest D",
            "data_law": "L(D) = (B/D)^beta + delta on the rows at the largest N",
            "joint_law": "L(N,D) = [(A/N)^(alpha/beta) + B/D]^beta + delta on all rows",
            "holdout": "separate fit without the largest N (model, joint) / largest D (data); error of its predictions there",
            "budget_plans_paper_costs_extrapolated": plan_notes,
        },
    )
    plots = plot_all(rows, fits, RESULTS_DIR / "plots", budgets=budgets, costs=costs, n_range=(1e5, 1e12), prefix="scaling_")
    print(f"wrote {p1}\nwrote {p2}")
    for p in plots:
        print(f"wrote {p}")
    for r in fit_out:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not k.startswith("stderr")})


if __name__ == "__main__":
    main()
