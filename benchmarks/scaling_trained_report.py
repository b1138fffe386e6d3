"""Predictions, budget plan and fits of :mod:`benchmarks.scaling_trained` (Fang et al. §4-6).

- :func:`predict`: fits L(N), L(D), L(N, D) on the fitted points only and writes the held-out
  points' predicted losses (``scaling_trained_predictions.json``) — refused once a held-out point
  has been measured, so the file is a prediction made before the measurement;
- :func:`plan`: the joint law of the fitted points picks the (N, D) of least predicted loss
  under a budget (Eq. 12 cost, factors in :func:`cost_model`), rounded to a trainable depth and
  a data size, then trains it;
- :func:`fit_report`: the results files, the held-out checks and the plots;
- :func:`refit`: the fit rows again from the stored points of ``scaling_trained_sweep.json`` (seconds;
  no work directory needed), the check rows kept.

Each law row names every parameter that sits at a search bound (``at_bound``) and whether the law
has a floor (``has_floor``: its irreducible loss is not at its lower bound); the budget plan names the
law it used and its floor.
"""

from __future__ import annotations

import json
import math

from benchmarks._common import REPO_ROOT, RESULTS_DIR, write_results
from benchmarks._scaling_trained import (
    FAMILIES,
    MODEL_D,
    Family,
    family_dir,
    heldout_points,
    laws,
    load,
    rows,
    run,
    session_config,
)
from scalingnote.utils import write_json

#: this machine: 2 cores at the measured ~130 GFLOP/s of a training step (fp32), $0.10 per machine-hour
CPU = {"price_per_hour": 0.10, "flops": 1.3e11}
#: the deployment the planner prices: 1e9 documents of 128 tokens encoded once (Eq. 15)
CORPUS_DOCS, DOC_TOKENS = 1e9, 128
DEFAULT_BUDGET = 1500.0


def result_name(args, what: str) -> str:
    """``scaling_trained[_<tag>]_<what>``: a run with another step budget (``--tag``) keeps its own files."""
    return f"scaling_trained{'_' + args.tag if args.tag else ''}_{what}"


def fitted(rs: list[dict]) -> list[dict]:
    return [r for r in rs if not r["role"].startswith("heldout") and r["role"] != "plan"]


def cost_model(args):
    """Eq. (12)-(15) with this CPU's prices: Z_data = $0.6 per pair (the paper's annotation price,
    charged for every pair of D), Z_train = the fixed-step run (steps x batch x (32 + 128) tokens x
    6 FLOPs per parameter), Z_infer = encoding the deployment corpus (2 FLOPs per token)."""
    from scalingnote.scaling.budget import CostModel

    per_flop = CPU["price_per_hour"] / (CPU["flops"] * 3600)
    return CostModel(
        z_data=0.6, z_train=args.steps * 32 * (32 + 128) * 6 * per_flop, z_infer=CORPUS_DOCS * DOC_TOKENS * 2 * per_flop
    )


def depth_params(args, fam: Family) -> dict[int, int]:
    """N (non-embedding parameters of the query tower + head) of every depth."""
    import torch

    from scalingnote.models.loading import count_non_embedding_params
    from scalingnote.training.towers import build_towers

    out = {}
    for d in fam.depths:
        qt, _ = build_towers(session_config(fam, d, args, args.work / "_n"), torch.device("cpu"))
        out[d] = int(count_non_embedding_params(qt))
    return out


def predict(args, fam: Family) -> None:
    """Predict the family's held-out points from its fitted points; the other families' predictions stay."""
    pool, *_ = load(args)
    held = heldout_points(fam, len(pool), args.axis)
    rs = rows(args, fam)
    measured = {(r["depth"], r["D"]) for r in rs if r["role"].startswith("heldout")}
    if measured:
        raise SystemExit(
            f"{fam.name}: held-out points already measured ({sorted(measured)}): predictions must come first; "
            f"the predictions on record are benchmarks/results/{result_name(args, 'predictions')}.json"
        )
    fr = fitted(rs)
    fits = laws(fr, fam)
    ns = depth_params(args, fam)
    pf = RESULTS_DIR / f"{result_name(args, 'predictions')}.json"
    out = [r for r in (json.loads(pf.read_text())["rows"] if pf.exists() else []) if r.get("family") != fam.name]
    for depth, D, role in held:
        N = ns[depth]
        for law, f in fits.items():
            if (law == "model" and D != MODEL_D) or (law == "data" and depth != fam.data_depth):
                continue
            p = float(f.predict(N=N) if law == "model" else f.predict(D=D) if law == "data" else f.predict(N=N, D=D))
            out.append(
                {
                    "family": fam.name,
                    "point": role,
                    "depth": depth,
                    "N": N,
                    "D": D,
                    "law": law,
                    "predicted_loss": round(p, 5),
                    "fit_points": f.n_fit,
                    "fit_r2": round(f.r2, 4),
                }
            )
    write_results(
        result_name(args, "predictions"),
        out,
        {"note": "each family's rows written from its fitted points before its held-out points were trained"},
    )
    for r in out:
        print(r)


def plan(args, fam: Family) -> None:
    from scalingnote.scaling.budget import plan_budget

    pool, *_ = load(args)
    fr = fitted(rows(args, fam))
    joint = laws(fr, fam)["joint"]
    ns = depth_params(args, fam)
    costs = cost_model(args)
    budget = args.budget or DEFAULT_BUDGET
    p = plan_budget(joint, budget, costs, n_range=(ns[fam.depths[0]], ns[fam.depths[-1]]))
    # the trainable pick: the depth nearest in log N, the rest of the budget buys data (<= the pool)
    depth = min(fam.depths, key=lambda d: abs(math.log(ns[d] / p.N)))
    D = int(min(len(pool), max(1, math.floor(float(costs.max_data(ns[depth], budget))))))
    grid = {(r["depth"], r["D"]) for r in rows(args, fam)}
    pick = {
        "family": fam.name,
        "budget": budget,
        "plan_N": p.N,
        "plan_D": p.D,
        "plan_loss": p.loss,
        "plan_at_bound": p.at_bound,
        "plan_law": p.law,
        "plan_law_floor": p.floor,
        "depth": depth,
        "N": ns[depth],
        "D": D,
        "predicted_loss": float(joint.predict(N=ns[depth], D=D)),
        "in_sweep": (depth, D) in grid,
        **{k: v for k, v in costs.factors().items()},
    }
    write_json(family_dir(args, fam) / "plan.json", pick)
    print(pick, flush=True)
    print(f"{fam.name} budget plan: {p.describe()}", flush=True)
    if (depth, D) not in grid:
        run(fam, [(depth, D, "plan")], args)


def _law_row(name: str, f) -> dict:
    rec = {
        "fit": name,
        "law": f.law,
        "points": f.n_fit,
        "r2": round(f.r2, 4),
        "rmse": f.rmse,
        "at_bound": ",".join(f.at_bound) or None,
        "has_floor": _has_floor(f),
    }
    rec.update({k: v for k, v in f.params.items()})
    return rec


def _has_floor(f) -> bool:
    """The law's irreducible loss is a floor, not its search bound (``at_bound`` lists every parameter at one)."""
    return "delta" not in f.at_bound


def _plan_law(joint) -> dict:
    """What a budget-plan check row says of the law the plan used."""
    return {"plan_law": "joint", "plan_law_has_floor": _has_floor(joint), "plan_law_delta": joint.params["delta"]}


def _check(
    name: str, law: str, family: str, depth: int, N: int, D: int, predicted: float, measured: dict | None, **extra
) -> dict:
    rec = {
        "check": name,
        "family": family,
        "law": law,
        "depth": depth,
        "N": N,
        "D": D,
        **extra,
        "predicted": round(predicted, 5),
    }
    if measured is not None:
        rel = abs(predicted - measured["loss"]) / measured["loss"]
        rec.update({"measured": round(measured["loss"], 5), "rel_err": round(rel, 4), "within_5pct": rel <= 0.05})
    return rec


def add_paired_tests(rs: list[dict]) -> None:
    """Each point of the model axis against the next shallower depth at the same D: the mean
    per-query loss difference and its paired t-test p-value (300 test queries)."""
    from scipy import stats

    for r in rs:
        shallower = [b for b in rs if b["D"] == r["D"] and b["depth"] < r["depth"]]
        if not shallower:
            continue
        b = max(shallower, key=lambda x: x["depth"])
        ks = sorted(set(r["_per_query"]) & set(b["_per_query"]))
        x, y = [r["_per_query"][k] for k in ks], [b["_per_query"][k] for k in ks]
        r["vs_shallower_depth"] = b["depth"]
        r["delta_loss_vs_shallower"] = round(sum(x) / len(x) - sum(y) / len(y), 4)
        r["p_vs_shallower"] = round(float(stats.ttest_rel(x, y).pvalue), 4)


def _family_report(args, fam: Family, preds: list[dict]) -> tuple[list[dict], list[dict]]:
    """(points, fit and check rows) of one family; its plots."""
    from scalingnote.scaling.plots import plot_joint, plot_loss_vs

    rs = rows(args, fam)
    if not rs:
        return [], []
    add_paired_tests(rs)
    fits = laws(fitted(rs), fam)
    out = [{**_law_row(f"{law}_{fam.name}", f), "family": fam.name} for law, f in fits.items()]
    by_point = {(r["depth"], r["D"]): r for r in rs}
    out += [
        _check(
            p["point"],
            p["law"],
            fam.name,
            p["depth"],
            p["N"],
            p["D"],
            p["predicted_loss"],
            by_point.get((p["depth"], p["D"])),
        )
        for p in preds
        if p.get("family") == fam.name
    ]
    pj = family_dir(args, fam) / "plan.json"
    if pj.exists():
        pl = json.loads(pj.read_text())
        out.append(
            _check(
                "budget_plan",
                "joint",
                fam.name,
                pl["depth"],
                pl["N"],
                pl["D"],
                pl["predicted_loss"],
                by_point.get((pl["depth"], pl["D"])),
                budget=pl["budget"],
                plan_N=round(pl["plan_N"]),
                plan_D=round(pl["plan_D"]),
                **_plan_law(fits["joint"]),
            )
        )
    plots = RESULTS_DIR / "plots"
    plot_loss_vs(
        [r for r in rs if r["D"] == MODEL_D],
        "N",
        plots / f"{result_name(args, 'model')}_{fam.name}.png",
        fit=fits["model"],
    )
    if "data" in fits:
        plot_loss_vs(
            [r for r in rs if r["depth"] == fam.data_depth],
            "D",
            plots / f"{result_name(args, 'data')}_{fam.name}.png",
            fit=fits["data"],
        )
        plot_joint(rs, fits["joint"], plots / f"{result_name(args, 'joint')}_{fam.name}.png")
    return rs, out


def fit_report(args) -> None:
    pf = RESULTS_DIR / f"{result_name(args, 'predictions')}.json"
    preds = json.loads(pf.read_text())["rows"] if pf.exists() else []
    points, out = [], []
    for fam in FAMILIES.values():
        rs, fr = _family_report(args, fam, preds)
        points += rs
        out += fr
    if not points:
        raise SystemExit(f"no finished points under {args.work}")
    plots = sorted(
        p.relative_to(REPO_ROOT).as_posix() for p in (RESULTS_DIR / "plots").glob(f"{result_name(args, '')}*.png")
    )
    cfg = {
        "data": args.data,
        "families": {
            f.name: {
                "model": f.model,
                "method": f.method,
                "depths": list(f.depths),
                "doc_max_length": f.doc_max,
                "pooling": f.pooling,
                "data_depth": f.data_depth,
                "eval_every": f.eval_every,
            }
            for f in FAMILIES.values()
        },
        "training": "every transformer layer, norm and head trained; nn.Embedding tables frozen",
        "steps": args.steps,
        "axis": args.axis,
        "batch_size": 32,
        "lr": args.lr,
        "head_lr": 1e-3,
        "schedule": "constant after a 20-step warm-up",
        "query_max_length": 32,
        "loss": "test contrastive perplexity (Fang et al. Eq. 6, W=256 corpus negatives drawn once, "
        "s=cos/0.05), 300 SciFact test queries",
        "dev": "10% of the human training queries, W=256 negatives from a fixed 768-document pool, every "
        "eval_every steps (per family), "
        "patience 3 validations, best weights restored",
        "pool": "SciFact human training pairs (minus dev) + one ICT pseudo-query per corpus document, shuffled "
        "once (seed 0); D = first D pairs",
        "heldout": "largest N (the deepest tower, D=4096); MiniLM also the largest D (2 layers, whole pool) and "
        "a corner "
        f"(6 layers, D=256): predicted in benchmarks/results/{result_name(args, 'predictions')}.json before "
        "they were trained",
        "cost_model": {**cost_model(args).factors(), "cpu": CPU, "corpus_docs": CORPUS_DOCS, "doc_tokens": DOC_TOKENS},
        "plots": plots,
        "targets": "L(N) R^2 >= 0.9; held-out largest-N and largest-D within 5%; budget pick within 5% of its "
        "prediction",
    }
    write_results(
        result_name(args, "sweep"), [{k: v for k, v in r.items() if not k.startswith("_")} for r in points], cfg
    )
    write_results(result_name(args, "fit"), out, cfg)
    for r in out:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})


def refit(args) -> None:
    """The law rows of ``scaling_trained_fit.json`` fitted again from the points stored in
    ``scaling_trained_sweep.json`` (the same fits :func:`fit_report` makes from the work directory),
    with their bounds and floors; the held-out check rows are kept, the budget-plan rows say which
    law they used and whether it has a floor."""
    sweep = json.loads((RESULTS_DIR / f"{result_name(args, 'sweep')}.json").read_text())["rows"]
    doc = json.loads((RESULTS_DIR / f"{result_name(args, 'fit')}.json").read_text())
    fits = {
        fam.name: laws(fitted([r for r in sweep if r["family"] == fam.name]), fam)
        for fam in FAMILIES.values()
        if any(r["family"] == fam.name for r in sweep)
    }
    out = []
    for r in doc["rows"]:
        if "fit" in r:
            r = {**_law_row(r["fit"], fits[r["family"]][r["law"]]), "family": r["family"]}
        elif r.get("check") == "budget_plan":
            r = {**r, **_plan_law(fits[r["family"]]["joint"])}
        out.append(r)
    write_results(result_name(args, "fit"), out, doc["config"])
    for r in out:
        if "fit" in r or r.get("check") == "budget_plan":
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})


__all__ = ["cost_model", "fit_report", "plan", "predict", "refit"]
