"""Scaling laws over towers whose every layer trains.

    python -m benchmarks.scaling_trained --phase points|predict|heldout|plan|fit   (or all, in that order)
    python -m benchmarks.scaling_trained --phase refit   (the fits again from the stored results, seconds)

Protocol (Fang et al., *Scaling Laws for Dense Retrieval* §3.4-3.5, §4-6), at CPU scale:

- model size N = non-embedding parameters of a tower truncated to 1..L layers: MiniLM-L6 at
  1..6 (``--family minilm``, TwinBERT: a query and a document tower) and SmolLM2-135M at 1, 2,
  3, 4, 6 (``--family smollm2``, ScalingDual, mean pooling, the §3.2 document prompt; 128
  document tokens of text in both families); **every** transformer layer, norm and head
  trains, only the ``nn.Embedding`` tables are frozen (N counts exactly what trains);
- data size D = the first D pairs of a pool of SciFact human training pairs (minus dev) + one
  ICT pseudo-query per corpus document, shuffled once (seed 0): nested sets, the same
  human:ICT mix at every size;
- every point: a fixed budget of ``--steps`` (200) steps at batch 32 (Fang et al. train a fixed
  10,000 steps), in-batch negatives, AdamW at a **constant** rate after a 20-step warm-up (so a
  larger D is not also a lower final rate), queries 32 / documents 128 tokens; the dev
  contrastive perplexity (10% of the human training queries, never trained on; W = 256
  negatives from a fixed pool of 768 documents) every 30 steps, stop after 3 validations
  without improvement, best weights restored;
- the loss L = contrastive perplexity (Eq. 6, W = 256 negatives per pair from the whole corpus,
  drawn once, s = cos/0.05) on the 300 SciFact test queries; nDCG@10 / R@100 on the same queries
  over the whole corpus;
- fits (``scalingnote.scaling.fit``): L(N) at D = 4096 per family; for MiniLM also L(D) of the
  2-layer tower and L(N, D) over every fitted point. **Held out before they are measured**: the
  largest N (6 layers, D = 4096), and for MiniLM the largest D (2 layers, the whole pool) and one
  corner (6 layers, D = 256); ``predict`` writes their predictions
  (``scaling_trained_predictions.json``) before ``heldout`` trains them;
- budget planner (§6): the joint law of the fitted points picks the (N, D) of least predicted
  loss under a budget the sweep did not contain (cost factors in the results' config); ``plan``
  trains that pick and records predicted vs measured.

Writes benchmarks/results/scaling_trained_sweep.json (one row per point: role, depth, N, D, loss,
nDCG@10, R@100, start and best dev loss, dev curve, steps, train seconds),
scaling_trained_fit.json and plots/scaling_trained_*.png. Points resume
(``runs/scaling_trained/d<depth>/D<D>/point.json``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from benchmarks._common import REPO_ROOT
from benchmarks._scaling_trained import (
    D_GRID,
    FAMILIES,
    MODEL_D,
    QUERY_MAX,
    Family,
    family_dir,
    fitted_points,
    heldout_points,
    laws,
    load,
    rows,
    run,
    session_config,
    settings,
)
from benchmarks.scaling_trained_report import fit_report, plan, predict, refit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="scifact", choices=["scifact"])
    ap.add_argument("--family", default="minilm", choices=sorted(FAMILIES))
    ap.add_argument(
        "--phase",
        default="all",
        choices=["all", "points", "predict", "heldout", "plan", "fit", "refit"],
        help="refit: the fit rows again from the stored results (scaling_trained_sweep.json), no work directory",
    )
    ap.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "scaling_trained")
    ap.add_argument("--steps", type=int, default=200, help="step budget of every point")
    ap.add_argument("--lr", type=float, default=1e-4, help="constant learning rate of the transformer layers")
    ap.add_argument(
        "--budget", type=float, default=0.0, help="planner budget in $ (0 = the default of the results' config)"
    )
    ap.add_argument("--axis", default="all", choices=["all", "model"], help="model: the model-size axis only (L(N))")
    ap.add_argument(
        "--tag", default="", help="results as scaling_trained_<tag>_*.json (e.g. another --steps); use its own --work"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    fam = FAMILIES[args.family]
    phases = ["points", "predict", "heldout", "plan", "fit"] if args.phase == "all" else [args.phase]
    if (fam.data_depth is None or args.axis == "model") and "plan" in phases:
        phases.remove("plan")  # the planner needs the joint law: a family with a data axis
    for ph in phases:
        if ph == "points":
            run(fam, fitted_points(fam, args.axis), args)
        elif ph == "predict":
            predict(args, fam)
        elif ph == "heldout":
            pool, *_ = load(args)
            run(fam, heldout_points(fam, len(pool), args.axis), args)
        elif ph == "plan":
            plan(args, fam)
        elif ph == "refit":
            refit(args)
        else:
            fit_report(args)


__all__ = [
    "D_GRID",
    "FAMILIES",
    "MODEL_D",
    "QUERY_MAX",
    "Family",
    "family_dir",
    "fitted_points",
    "heldout_points",
    "laws",
    "load",
    "main",
    "rows",
    "run",
    "session_config",
    "settings",
]


if __name__ == "__main__":
    main()
