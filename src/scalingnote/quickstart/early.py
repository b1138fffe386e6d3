"""Decide early, spend on the winner: the plan made before any training, the proxy
comparison that drops the candidates that cannot win, the plan made again on the survivors (at
the speed the proxy measured), and the settings the budget leaves (:mod:`.budget`, :mod:`.proxy`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from scalingnote.quickstart import budget, proxy
from scalingnote.quickstart.config import Family, QuickstartConfig, family
from scalingnote.quickstart.cost import depth_layers


def say(msg: str) -> None:
    print(f"[quickstart] {msg}", flush=True)


def _student(cfg: QuickstartConfig, fams: list[Family], first: str | None = None) -> tuple[str, int]:
    """The student the plan prices: the pinned teacher's, else the (proxy-)best family's small tower."""
    by = {f.name: f for f in fams}
    name = cfg.teacher if cfg.teacher != "auto" and cfg.teacher in by else (first or fams[0].name)
    return name, by[name].small_layers


#: the proxy's share of the budget: a proxy planned above it is drawn smaller (KUAKE-QTR: 25% of 32k
#: titles through SmolLM2's two depths was 6 of 15 minutes before any survivor trained)
PROXY_SHARE = 0.3
MIN_PROXY_FRACTION = 0.05


def proxy_share_s(plan: budget.Plan) -> float:
    """The seconds the proxy may take: :data:`PROXY_SHARE` of the budget, or less — what the plan,
    cut as far as it goes, leaves of the seconds it may fill (a slow machine: on a CPU that runs
    SmolLM2 at 1.6x the model, KUAKE-QTR's one candidate and QKD at its floor left 0.6 of 15 minutes)."""
    assert plan.budget_s is not None and plan.limit_s is not None
    rest = plan.total - plan.phases["proxy"]
    return max(0.0, min(PROXY_SHARE * plan.budget_s, plan.limit_s - rest))


def proxy_width_runs(
    cfg: QuickstartConfig, fams: list[Family], sizes: budget.Sizes, spent: dict[str, float]
) -> dict[str, bool]:
    """Per family, whether the proxy runs its width run: whether the width can still be trained after
    the proxy in the least the proxy can leave — the family alone at its shallowest depth and one head
    learning rate — were the proxy free. When even that plan cuts the width run, no proxy outcome
    brings it back, and its proxy run would be time spent on a candidate that cannot win (KUAKE-QTR's
    576-d proxy run: 2.3 of the proxy's 6.6 minutes on the EPYC). Optimistic on purpose: the cost
    model over-prices some runs (the embedded default's proxy 2x), and a width run cut here is lost."""
    by, ok = {f.name: f for f in fams}, {}
    for f in fams:
        least = budget.Candidates(
            {f.name: {min(f.depths, key=lambda d: d or 10**6): list(cfg.head_lrs)[:1]}}, {f.name: True}
        )
        p = budget.make_plan(
            cfg, by, sizes, _student(cfg, fams, f.name), cands=least, proxy_done=True, spent={**spent, "proxy": 0.0}
        )
        ok[f.name] = bool(cfg.full_dim) and not any(x.startswith("the width run") for x in p.skipped)
    return ok


def sized_proxy(
    cfg: QuickstartConfig, fams: list[Family], sizes: budget.Sizes, spent: dict[str, float]
) -> tuple[QuickstartConfig, budget.Plan]:
    """The first plan, with ``proxy_fraction`` lowered (to at least :data:`MIN_PROXY_FRACTION`) until
    the proxy is planned within its share (:func:`proxy_share_s`); the settings it ran with are the
    ones recorded (``quickstart.yaml`` keeps the user's)."""
    by = {f.name: f for f in fams}
    # priced with a free proxy, so the same at every proxy_fraction: decided once
    width = None if cfg.full or not cfg.budget_minutes else proxy_width_runs(cfg, fams, sizes, spent)
    plan = budget.make_plan(cfg, by, sizes, _student(cfg, fams), spent=spent, proxy_width=width)
    for _ in range(6):  # the proxy's cost is nearly linear in its size; a few rounds absorb its fixed part
        if cfg.full or plan.budget_s is None:
            break
        share = proxy_share_s(plan)
        if plan.phases["proxy"] <= share * 1.02:
            break
        frac = max(MIN_PROXY_FRACTION, round(cfg.proxy_fraction * max(share, 1.0) / plan.phases["proxy"], 3))
        if frac >= cfg.proxy_fraction:
            break
        say(
            f"proxy: {plan.phases['proxy'] / 60:.1f} planned minutes at proxy_fraction {cfg.proxy_fraction:g} > the "
            f"{share / 60:.1f} it may take ({PROXY_SHARE:.0%} of the budget, or what the rest of the "
            f"plan leaves): drawn at {frac:g}"
        )
        cfg = replace(cfg, proxy_fraction=frac)
        plan = budget.make_plan(cfg, by, sizes, _student(cfg, fams), spent=spent, proxy_width=width)
    return cfg, plan


def first_plan(
    cfg: QuickstartConfig, fams: list[Family], data: dict, spent: dict[str, float], report: dict[str, Any] | None = None
) -> tuple[QuickstartConfig, budget.Sizes, budget.Plan]:
    """The plan printed before any training (``spent``: the data phase; ``report``: the families'
    tokenizer report, which prices their tokens): every candidate, the proxy (sized to the budget:
    :func:`sized_proxy`), the expected minutes. Returns the settings the run goes on with."""
    sizes = budget.measure_sizes(cfg, data, report)
    # the proxy's size and width runs follow the seed and the data, not this machine's speed: they
    # are sized with the cost model's nominal speed and the modelled data phase, so every machine
    # compares the same candidates on the same sample; the budget cuts after the proxy follow the speed
    cfg, nominal = sized_proxy(cfg, fams, replace(sizes, speed_by={}), {})
    plan = budget.make_plan(
        cfg, {f.name: f for f in fams}, sizes, _student(cfg, fams), spent=spent, proxy_width=nominal.proxy_width
    )
    if not cfg.full and plan.phases["proxy"] > 0:
        docs, q = budget.proxy_sizes(
            sizes.docs, sizes.train_queries, cfg.proxy_fraction, cfg.proxy_min_docs, cfg.proxy_min_train_queries
        )
        plan.proxy = {
            "docs": docs,
            "corpus_docs": sizes.docs,
            "train_queries": q,
            "all_train_queries": sizes.train_queries,
            "validation_queries": sizes.val_queries,
        }
    head = (
        "exhaustive (--full): every candidate in full, no budget"
        if cfg.full
        else ("before the proxy (every candidate assumed to survive it; the proxy decides what is trained in full)")
    )
    say(f"{head}\n{plan.text()}")
    return cfg, sizes, plan


def decide(
    cfg: QuickstartConfig, fams: list[Family], data: dict, out: Path, plan: budget.Plan | None = None
) -> tuple[budget.Candidates | None, dict[str, Any] | None]:
    """The proxy comparison (None, None with ``--full`` or when the proxy would not be cheaper);
    ``plan``: the first plan (its :attr:`~scalingnote.quickstart.budget.Plan.proxy_width`)."""
    if cfg.full:
        return None, None
    pdata, info = proxy.draw(cfg, data, out)
    if pdata is None:
        say(
            f"proxy: not drawn ({info['docs']} of {info['corpus_docs']} documents, {info['train_queries']} of "
            f"{info['all_train_queries']} training queries would not be cheaper): every candidate runs in full"
        )
        return None, {"drawn": False, "data": info}
    cands, rec = proxy.compare_on_proxy(cfg, fams, pdata, out, plan.proxy_width if plan is not None else None)
    if cfg.teacher != "auto" and cfg.teacher not in cands.depths:  # a pinned teacher is never dropped
        fam = next(f for f in fams if f.name == cfg.teacher)
        cands.depths[fam.name] = {d: list(cfg.head_lrs) for d in fam.depths}
        cands.width[fam.name] = bool(cfg.full_dim)
        rec["reasons"]["families"] += f"; {fam.name} kept: pinned teacher"
    for k, v in rec["reasons"].items():
        say(f"proxy, {k}: {v}")
    return cands, {"drawn": True, "data": info, **rec}


def second_plan(
    cfg: QuickstartConfig,
    fams: list[Family],
    sizes: budget.Sizes,
    first: budget.Plan,
    cands: budget.Candidates | None,
    spent: dict[str, float],
    proxy_rec: dict[str, Any] | None = None,
) -> budget.Plan:
    """The plan on the survivors, the remaining phases scaled by the proxy's measured / modelled
    time when the machine is slower than the model (never below 1: a proxy that ran faster than
    modelled says little about QKD, and a plan that is too short breaks the budget; measured on the
    default: proxy 0.79x its model, then QKD 1.8x on a machine that had become busy). When even the
    survivors' cheapest plan is over the budget, a shallower depth the proxy ran may take the
    survivor's place (:func:`affordable_depth`; ``proxy_rec``: the proxy's record)."""
    speed = 1.0
    if (
        cands is not None and first.phases.get("proxy", 0) > 20 and "proxy" in spent
    ):  # the proxy ran: it measured this machine
        speed = min(3.0, max(1.0, spent["proxy"] / first.phases["proxy"]))
    lead = next(iter(cands.depths)) if cands else None
    by = {f.name: f for f in fams}

    def make(c: budget.Candidates | None) -> budget.Plan:
        return budget.make_plan(
            cfg, by, sizes, _student(cfg, fams, lead), cands=c, proxy_done=True, spent=spent, speed=speed
        )

    plan = make(cands)
    if proxy_rec is not None and lead is not None:
        plan = affordable_depth(cfg, plan, proxy_rec.get("candidates", []), make)
    plan.proxy = first.proxy
    if not cfg.full:
        say(f"after the proxy\n{plan.text()}")
    return plan


def affordable_depth(
    cfg: QuickstartConfig,
    plan: budget.Plan,
    proxy_candidates: list[dict[str, Any]],
    make: Callable[[budget.Candidates], budget.Plan],
) -> budget.Plan:
    """``plan``, or — when it is over the budget with every cut made (one candidate left, QKD at its
    floor) — the plan of a shallower depth of the same family that the proxy ran and dropped: the
    deepest whose plan fits the budget, else the cheapest if it is cheaper. The proxy ranks the
    candidates; the budget decides what it can train: a deeper tower the budget cannot hold costs
    the user the minutes they set (KUAKE-QTR: SmolLM2's depth 4 beat depth 2 on a larger proxy, and
    its full Stage I planned a 15-minute run at 25). ``make``: the plan of given candidates. The
    depth trains at the declared default head learning rate (the first of ``head_lrs``)."""
    limit = plan.limit_s
    if cfg.full or limit is None or plan.total <= limit or len(plan.cands.depths) != 1:
        return plan
    (lead, kept), lr = next(iter(plan.cands.depths.items())), cfg.head_lrs[0]
    fam = family(cfg, lead)
    best = max(kept, key=lambda x: depth_layers(fam, x))  # the survivor the budget cannot hold
    deepest = depth_layers(fam, best)
    val: dict[int | None, float] = {}  # the proxy's best validation nDCG@10 per depth of the family
    for c in proxy_candidates:
        if c["family"] == lead and c["dim"] == cfg.dim:
            val[c["depth"]] = max(val.get(c["depth"], -1.0), float(c["proxy_val"]))
    shallower = sorted((d for d in val if depth_layers(fam, d) < deepest), key=lambda d: -depth_layers(fam, d))
    trials = [
        (d, make(budget.Candidates({lead: {d: [lr]}}, {lead: plan.cands.width.get(lead, False)}))) for d in shallower
    ]
    fits = [(d, p) for d, p in trials if p.total <= limit]
    pick = fits[0] if fits else min(trials, key=lambda t: t[1].total, default=None)
    if pick is None or pick[1].total >= plan.total:
        return plan
    d, new = pick
    new.skipped.append(
        f"{lead} depth {best or 'all'}, the proxy's best: planned {plan.total / 60:.1f} min with every cut, over the "
        f"{limit / 60:.1f} the budget may fill; depth {d or 'all'} (proxy validation nDCG@10 {val[d]:.4f} against "
        f"{val.get(best, float('nan')):.4f}) is "
        + ("the deepest the proxy ran that fits" if fits else "the cheapest the proxy ran (none fits)")
        + "; `--full` or a larger --budget-minutes trains the deeper one"
    )
    return new


def budgeted(cfg: QuickstartConfig, plan: budget.Plan) -> QuickstartConfig:
    """The settings the budget leaves: the comparison runs and the QKD step cap as the plan cut them."""
    if cfg.full:
        return cfg
    over: dict[str, Any] = {}
    if plan.compare != str(cfg.compare):
        over["compare"] = plan.compare
    if any(s.startswith("QKD steps") for s in plan.skipped):
        over["qkd_max_steps"] = plan.qkd_steps
    return replace(cfg, **over) if over else cfg


def late_cut(cfg: QuickstartConfig, plan: budget.Plan, spent: dict[str, float], ratio: float) -> QuickstartConfig:
    """Before the comparison runs (the optional phase at the end): when the time spent and the
    rest of the plan at the pace the run has kept (``ratio``: spent / planned so far) would exceed
    the budget, skip them now and say so."""
    limit_s = plan.limit_s
    if cfg.full or plan.budget_s is None or limit_s is None or cfg.compare == "none":
        return cfg
    rest = sum(plan.phases.get(k, 0.0) for k in ("comparison_runs", "index", "evaluation")) * ratio
    done = sum(spent.values())
    if done + rest <= limit_s:
        return cfg
    why = (
        f"comparison runs (the paper's matched-cost rows): {done / 60:.1f} min spent + "
        f"{rest / 60:.1f} min left at this run's pace "
        f"> the {limit_s / 60:.1f} of the {plan.budget_s / 60:g}-minute budget the plan may fill"
    )
    say(f"skipped (budget): {why}")
    plan.skipped.append(why)
    plan.compare = "none"
    plan.phases["comparison_runs"] = 0.0
    return replace(cfg, compare="none")


def qkd_deadline(cfg: QuickstartConfig, plan: budget.Plan, elapsed: float, ratio: float) -> float | None:
    """Stage II's time box, a ``time.monotonic()`` instant: the seconds the budget leaves after the
    ``elapsed`` ones once the index and the evaluation are paid for at the run's pace (``ratio``).
    Its QKD runs share it and re-plan their steps to it (:mod:`scalingnote.training.timebox`; never
    below :data:`~scalingnote.quickstart.budget.QKD_FLOOR` steps), so the budget holds whatever the
    cost model's error on this machine. The comparison runs are not reserved: :func:`late_cut` skips
    them when QKD took their time. None with ``--full`` or no budget."""
    if cfg.full or plan.budget_s is None or plan.limit_s is None:
        return None
    rest = sum(plan.phases.get(k, 0.0) for k in ("index", "evaluation")) * ratio
    left = plan.limit_s - elapsed - rest
    say(
        f"Stage II time box: {max(left, 0.0) / 60:.1f} min left of the {plan.budget_s / 60:g}-minute budget after "
        f"{elapsed / 60:.1f} spent and {rest / 60:.1f} kept for the index and the evaluation; QKD fits its steps to it "
        f"(planned {plan.qkd_steps or 'all'}, never below {budget.QKD_FLOOR})"
    )
    return time.monotonic() + left


def report(plan0: budget.Plan, plan: budget.Plan, spent: dict[str, float]) -> dict[str, Any]:
    """``choices.budget``: the budget, the plan before and after the proxy, planned vs spent per
    phase, what was skipped."""
    phases: dict[str, dict[str, Any]] = {
        k: {
            "planned_s": round(plan.phases.get(k, 0.0), 1),
            "planned_before_proxy_s": round(plan0.phases.get(k, 0.0), 1),
            "spent_s": spent.get(k),
        }
        for k in budget.PHASES
    }
    phases["mining_round"]["note"] = "planned" if plan.mining else f"off: {plan.mining_note}"
    return {
        **plan.to_json(),
        "phases": phases,
        "planned_before_proxy_minutes": round(plan0.total / 60, 2),
        "spent_minutes": round(sum(spent.values()) / 60, 2),
        "skipped_before_proxy": list(plan0.skipped),
    }


__all__ = [
    "affordable_depth",
    "budgeted",
    "decide",
    "first_plan",
    "late_cut",
    "qkd_deadline",
    "report",
    "second_plan",
    "sized_proxy",
]
