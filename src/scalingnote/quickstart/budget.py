"""The quick start's time budget: what each phase is expected to cost on this machine,
what the budget cuts when it cannot hold every phase, and the plan printed before any training.

The phases are priced by the cost model (:mod:`scalingnote.quickstart.cost`, each family's work at
this machine's measured speed: :mod:`scalingnote.quickstart.calibrate`). After the proxy,
:attr:`Plan.speed` rescales the rest by how long the proxy really took (a busier machine), and the
plan is made again on the candidates that survived.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, field
from typing import Any

from scalingnote.models.layers import start_candidates
from scalingnote.quickstart.config import Family, QuickstartConfig, family
from scalingnote.quickstart.cost import (
    SMALL_EPOCHS_EST,
    SMALL_STEP_S,
    Candidates,
    Sizes,
    depth_layers,
    family_tokens,
    index_seconds,
    measure_sizes,
    mining_seconds,
    model_layers,
    model_shape,
    qkd_pool,
    qkd_seconds,
    qkd_step_seconds,
    qkd_steps,
    stage1_seconds,
    token_layer_s,
    unit_cost,
    wide_only_pays,
)

#: the phases in run order; ``mining_round``: a second Stage I round on hard negatives
#: mined by the teacher (:mod:`scalingnote.quickstart.mining_round`), planned by :func:`mining_seconds`
PHASES = (
    "data",
    "proxy",
    "stage1_large_towers",
    "mining_round",
    "stage2_students",
    "comparison_runs",
    "index",
    "evaluation",
)
QKD_FLOOR = 200  #: the budget never cuts QKD below this many steps
#: the share of the budget kept in reserve for the cost model's error: the plan fills the rest (on
#: the Xeon the model was priced on, phases ran 0.8-1.1x their model; on the EPYC, calibrated, 0.7-1.4x:
#: SciFact's QKD 1.37x, ``quickstart_budget.json``)
PLAN_RESERVE = 0.05


def proxy_sizes(
    n_docs: int, n_train_queries: int, fraction: float, min_docs: int, min_train_queries: int
) -> tuple[int, int]:
    """The proxy size rule: ``max(min_docs, fraction x corpus)`` documents and
    ``max(min_train_queries, fraction x training queries)`` training queries (each at most all)."""
    docs = min(n_docs, max(min_docs, math.ceil(fraction * n_docs)))
    queries = min(n_train_queries, max(min_train_queries, math.ceil(fraction * n_train_queries)))
    return docs, queries


@dataclass
class Plan:
    """Planned seconds per phase, what the budget cut, and the settings it cut them with."""

    budget_s: float | None
    phases: dict[str, float]
    cands: Candidates
    skipped: list[str] = field(default_factory=list)
    compare: str = "teacher"
    qkd_steps: int | None = None
    proxy: dict[str, Any] | None = None
    speed: float = 1.0
    mining: bool = False  #: the mining round is in the plan
    mining_note: str = ""  #: why it is in or out
    #: the table's zero-shot MiniLM row is made (a budget cuts it only where MiniLM cannot read the data)
    zero_shot_row: bool = True
    unreadable_bert: bool = False  #: MiniLM's family is configured but its tokenizer cannot read the data
    family_speed: dict[str, float] = field(default_factory=dict)  #: :attr:`Sizes.speed_by` the plan was priced with
    #: per family, whether the proxy runs its width run (None: every one; see ``early.proxy_width_runs``)
    proxy_width: dict[str, bool] | None = None

    @property
    def total(self) -> float:
        return sum(self.phases.values())

    def proxy_candidates(self, cfg: QuickstartConfig, fams: dict[str, Family]) -> Candidates:
        """What the proxy runs: every candidate, less the width runs :attr:`proxy_width` rules out."""
        every = Candidates.every(cfg, list(fams.values()))
        return Candidates(
            every.depths, {n: w and (self.proxy_width or {}).get(n, True) for n, w in every.width.items()}
        )

    @property
    def limit_s(self) -> float | None:
        """The seconds the plan may fill: the budget less :data:`PLAN_RESERVE`."""
        return None if self.budget_s is None else self.budget_s * (1 - PLAN_RESERVE)

    def to_json(self) -> dict[str, Any]:
        return {
            "budget_minutes": None if self.budget_s is None else round(self.budget_s / 60, 2),
            "planned_minutes": round(self.total / 60, 2),
            "planned_s": {k: round(v, 1) for k, v in self.phases.items()},
            "skipped": list(self.skipped),
            "compare": self.compare,
            "qkd_steps": self.qkd_steps,
            "speed": round(self.speed, 2),
            "candidates": {f: {str(d): lrs for d, lrs in v.items()} for f, v in self.cands.depths.items()},
            "width": self.cands.width,
            "wide": self.cands.wide,
            "mining_round": {"planned": self.mining, "note": self.mining_note},
            "family_speed": dict(self.family_speed),
        }

    def text(self) -> str:
        """The plan in words (printed before any training)."""
        lines = [
            f"plan: {self.total / 60:.1f} min"
            + (
                f" of a {self.budget_s / 60:g}-minute budget ({PLAN_RESERVE:.0%} kept in reserve)"
                if self.budget_s
                else " (no budget)"
            )
            + (f" (this machine at {self.speed:.2f}x the model's time)" if self.speed != 1.0 else "")
            + (
                " (measured: " + ", ".join(f"{f} {v:.2f}x" for f, v in self.family_speed.items()) + " the model's time)"
                if self.family_speed
                else ""
            )
        ]
        for f, v in self.cands.depths.items():
            lines.append(
                f"  candidates {f}: "
                + ", ".join(f"depth {d or 'all'} lr {'/'.join(f'{x:g}' for x in lrs)}" for d, lrs in v.items())
                + (", width run" if self.cands.width.get(f) else "")
                + (", at the backbone's width" if self.cands.wide.get(f) else "")
            )
        if self.proxy:
            p = self.proxy
            lines.append(
                f"  proxy: {p['docs']} of {p['corpus_docs']} documents, {p['train_queries']} of "
                f"{p['all_train_queries']} "
                f"training queries, every validation query ({p.get('validation_queries', '?')}) with its "
                "judged documents"
            )
        lines.append(
            "  expected minutes: "
            + ", ".join(f"{k} {v / 60:.1f}" for k, v in self.phases.items() if k != "mining_round" or self.mining)
            + ("" if self.mining else f"; mining_round off: {self.mining_note}")
        )
        lines += [f"  skipped (budget): {s}" for s in self.skipped]
        if self.budget_s and self.total > self.budget_s:
            lines.append(
                f"  OVER the budget by {(self.total - self.budget_s) / 60:.1f} min with every cut made "
                "(its floors: one candidate, "
                f"QKD at {QKD_FLOOR} steps, the smallest proxy): a larger --budget-minutes, or expect that much longer"
            )
        return "\n".join(lines)


def _fill_phases(
    plan: Plan,
    cfg: QuickstartConfig,
    fams: dict[str, Family],
    s: Sizes,
    student: tuple[str, int],
    *,
    use_proxy: bool,
    proxy_done: bool,
    pdocs: int,
    pq: int,
    n_students: int,
    spent: dict[str, float],
    speed: float,
) -> None:
    """``plan.phases``: each phase's expected seconds under the plan's current cuts (``spent``: the
    phases already run, at their measured seconds; the rest modelled, times ``speed``)."""
    ph = {"data": 2.0 + 2e-4 * s.docs, "proxy": 0.0}
    if use_proxy and not proxy_done:
        ex = round(s.train_examples * pq / max(1, s.train_queries))
        ph["proxy"] = (
            5
            + 3e-4 * s.docs
            + stage1_seconds(cfg, fams, plan.proxy_candidates(cfg, fams), s, pdocs, ex, ex + s.val_queries)
        )
    ph["stage1_large_towers"] = stage1_seconds(
        cfg,
        fams,
        plan.cands,
        s,
        s.docs,
        s.train_examples,
        s.train_examples + s.val_queries,
        cached=pdocs if use_proxy else 0,
    )
    lead = student[0] if student[0] in plan.cands.depths else next(iter(plan.cands.depths), student[0])
    ph["mining_round"] = (
        mining_seconds(
            cfg,
            fams[lead],
            plan.cands.depths.get(lead, {}),
            bool(plan.cands.width.get(lead) or plan.cands.wide.get(lead)),
            s,
        )
        if plan.mining
        else 0.0
    )
    tfam = fams[student[0]]
    t_layers = max(
        (depth_layers(tfam, d) for d in plan.cands.depths.get(student[0], {})), default=model_layers(tfam.model)
    )
    starts = len(start_candidates(student[1], t_layers)) if cfg.student_layers == "choose" else 1
    ph["stage2_students"] = 25.0 + n_students * qkd_seconds(
        cfg, s, tfam, student[1], plan.qkd_steps or 0, t_layers, starts
    )
    n_cmp = {"teacher": 1, "all": len(plan.cands.depths), "none": 0}[plan.compare]
    u = unit_cost(fams[student[0]]) * s.speed(student[0])
    small = 2 * (
        5
        + SMALL_EPOCHS_EST * math.ceil(s.train_examples / cfg.batch_size) * SMALL_STEP_S * student[1] * u
        + s.docs * s.doc_tok(student[0]) * student[1] * token_layer_s(s, fams[student[0]])
    )
    ph["comparison_runs"] = n_cmp * small
    ph["index"] = index_seconds(s) * s.speed(student[0])
    ph["evaluation"] = 15.0 + 1e-3 * s.docs + (_zero_shot_row_s(cfg, s, plan.cands) if plan.zero_shot_row else 0.0)
    for k in ph:
        ph[k] = spent[k] if k in spent else ph[k] * speed
    plan.phases = {k: ph[k] for k in PHASES}


def make_plan(
    cfg: QuickstartConfig,
    fams: dict[str, Family],
    s: Sizes,
    student: tuple[str, int],
    *,
    cands: Candidates | None = None,
    proxy_done: bool = False,
    spent: dict[str, float] | None = None,
    speed: float = 1.0,
    proxy_width: dict[str, bool] | None = None,
) -> Plan:
    """The plan: ``cands`` = the Stage I candidates still in (None: every one, before the proxy);
    ``spent``: phases already run (their measured seconds); ``speed``: measured / modelled time;
    ``proxy_width``: :attr:`Plan.proxy_width`.
    When the budget cannot hold every phase, cuts in this order until it does: the comparison runs
    (not needed to serve), the mining round (``mining_round: auto``), head learning rates beyond the
    one the proxy's rule chose (the declared default unless another was separated from it), depths
    beyond the shallowest survivor, families beyond the proxy's best, the width run, QKD steps (down
    to :data:`QKD_FLOOR`)."""
    cands = copy.deepcopy(cands) if cands is not None else Candidates.every(cfg, list(fams.values()))
    spent = dict(spent or {})
    pdocs, pq = proxy_sizes(
        s.docs, s.train_queries, cfg.proxy_fraction, cfg.proxy_min_docs, cfg.proxy_min_train_queries
    )
    use_proxy = not cfg.full and pdocs <= 0.6 * s.docs and pq <= 0.6 * max(1, s.train_queries)
    qkd_cap = qkd_steps(cfg, s, cfg.qkd_step_cap(False))
    n_students = len(cfg.students or [student]) * len(cfg.qkd_rank_weights)
    plan = Plan(
        None if cfg.full else (cfg.budget_minutes * 60 if cfg.budget_minutes else None),
        {},
        cands,
        compare=str(cfg.compare),
        qkd_steps=qkd_cap,
        speed=speed,
        mining=cfg.mining_round != "off",
        family_speed=dict(s.speed_by),
        proxy_width=proxy_width,
    )
    plan.mining_note = {
        "off": "mining_round: off in the config",
        "on": "mining_round: on in the config (never cut by the budget)",
        "auto": "--full: always tried" if cfg.full else "held by the budget",
    }[str(cfg.mining_round)]

    fill = functools.partial(
        _fill_phases,
        plan,
        cfg,
        fams,
        s,
        student,
        use_proxy=use_proxy,
        proxy_done=proxy_done,
        pdocs=pdocs,
        pq=pq,
        n_students=n_students,
        spent=spent,
        speed=speed,
    )
    fill()
    limit_s = plan.limit_s
    if limit_s is None:  # no budget
        return plan
    # without a proxy there is no ranking to keep "the best" by: only work that is no choice is cut
    plan.unreadable_bert = "bert" in cfg.families and "bert" not in fams
    for cut in _CUTS if use_proxy else (_cut_unreadable_zero_shot, _cut_compare, _cut_mining, _cut_width):
        if plan.total <= limit_s:
            break
        what = cut(plan, cfg)
        if what:
            plan.skipped.append(what)
            fill()
    if plan.total > limit_s and plan.qkd_steps and "stage2_students" not in spent:
        over = plan.total - limit_s
        per_step = n_students * qkd_step_seconds(cfg, s, fams[student[0]], student[1]) * speed
        new = max(QKD_FLOOR, int(plan.qkd_steps - over / max(per_step, 1e-9)))
        if new < plan.qkd_steps:
            plan.skipped.append(f"QKD steps {plan.qkd_steps} -> {new}")
            plan.qkd_steps = new
            fill()
    return plan


def _zero_shot_row_s(cfg: QuickstartConfig, s: Sizes, cands: Candidates) -> float:
    """The table's zero-shot MiniLM row when Stage I did not encode the corpus with MiniLM (its family
    unreadable, as on KUAKE-QTR's Chinese, or dropped by the proxy): every layer over the corpus."""
    if "bert" not in cfg.families or "bert" in cands.depths:
        return 0.0
    fam = family(cfg, "bert")
    return 4.0 + s.docs * s.doc_tok("bert") * model_layers(fam.model) * token_layer_s(s, fam)


def _cut_compare(plan: Plan, cfg: QuickstartConfig) -> str | None:
    if plan.compare == "none":
        return None
    plan.compare = "none"
    return (
        "comparison runs (the paper's matched-cost rows: twinbert_small, scaling_doc); `--full` "
        "or a larger --budget-minutes runs them"
    )


def _cut_mining(plan: Plan, cfg: QuickstartConfig) -> str | None:
    """The mining round goes after the comparison runs (which serve nothing), before any candidate:
    it is kept only when it validates above round 1, and measured (``mined_negatives_<set>.json``,
    test, after the padded negatives) it lifted the teacher +0.024 / +0.011 / +0.018 and the student
    +0.033 / +0.006 / +0.021 on SciFact / KUAKE-QTR / the synthetic log — but it costs a second Stage I
    round (KUAKE-QTR: 7-11 minutes of a 15-minute budget), more than any single candidate."""
    if not plan.mining or cfg.mining_round != "auto":
        return None
    plan.mining = False
    what = (
        f"the mining round (planned {plan.phases.get('mining_round', 0.0) / 60:.1f} min: a second Stage I round on "
        "negatives the teacher mines); `--full`, a larger --budget-minutes or mining_round: on runs it"
    )
    plan.mining_note = "cut to hold the budget"
    return what


def _cut_lrs(plan: Plan, cfg: QuickstartConfig) -> str | None:
    cut = [(f, d) for f, v in plan.cands.depths.items() for d, lrs in v.items() if len(lrs) > 1]
    for f, d in cut:
        plan.cands.depths[f][d] = plan.cands.depths[f][d][:1]
    return f"head learning rates beyond the one the proxy's rule chose ({len(cut)} depth(s))" if cut else None


def _cut_depths(plan: Plan, cfg: QuickstartConfig) -> str | None:
    """One depth per family: the shallowest that survived the proxy. Every survivor validated within
    the proxy's margin of the best, so the proxy cannot tell them apart; when the budget cannot hold
    them all, the cheapest pass over the corpus wins (KUAKE-QTR: SmolLM2 depth 2 at 0.837 vs depth 4 at
    0.855 on the proxy, half the feature pass of a 32k-title corpus)."""
    cut = [f for f, v in plan.cands.depths.items() if len(v) > 1]
    for f in cut:
        keep = min(plan.cands.depths[f], key=lambda d: d if d else 10**6)  # None = every layer: the deepest
        plan.cands.depths[f] = {keep: plan.cands.depths[f][keep]}
    return f"depths beyond the shallowest within the proxy's margin ({', '.join(cut)})" if cut else None


def _cut_families(plan: Plan, cfg: QuickstartConfig) -> str | None:
    names = list(plan.cands.depths)
    keep = [n for n in names if n == names[0] or n == cfg.teacher]  # a pinned teacher stays
    if len(keep) == len(names):
        return None
    plan.cands.depths = {n: plan.cands.depths[n] for n in keep}
    plan.cands.width = {n: plan.cands.width.get(n, False) for n in keep}
    plan.cands.wide = {n: plan.cands.wide.get(n, False) for n in keep}
    return f"families beyond the proxy's best ({', '.join(n for n in names if n not in keep)})"


def _cut_width(plan: Plan, cfg: QuickstartConfig) -> str | None:
    """One width instead of two: the candidates train at the backbone's width — the declared default
    (a frozen backbone projected below its width starts below its own zero-shot embeddings; on the
    embedded default's proxy 0.679 at 384 against 0.643 at 128) — and the run at ``dim`` goes."""
    cut = [f for f, w in plan.cands.width.items() if w]
    wide = [f for f in cut if wide_only_pays(cfg, f, sum(len(v) for v in plan.cands.depths.get(f, {}).values()))]
    for f in cut:
        plan.cands.width[f] = False
        plan.cands.wide[f] = f in wide
    if not cut:
        return None
    return f"the width run ({', '.join(cut)})" + (
        f": {', '.join(wide)} trains at the backbone's width (the default) only, not also at {cfg.dim}" if wide else ""
    )


def _cut_unreadable_zero_shot(plan: Plan, cfg: QuickstartConfig) -> str | None:
    """The zero-shot MiniLM row where MiniLM cannot read the data (KUAKE-QTR's Chinese: 78% of its tokens
    unknown): a baseline that reads almost nothing, and a pass over the whole corpus (2 of 15 minutes)."""
    if not plan.unreadable_bert or not plan.zero_shot_row:
        return None
    plan.zero_shot_row = False
    return (
        "the zero-shot MiniLM row (its tokenizer cannot read this data); `--full` or a larger --budget-minutes makes it"
    )


_CUTS = (_cut_unreadable_zero_shot, _cut_compare, _cut_mining, _cut_lrs, _cut_depths, _cut_families, _cut_width)

__all__ = [
    "Candidates",
    "PHASES",
    "Plan",
    "Sizes",
    "family_tokens",
    "make_plan",
    "measure_sizes",
    "mining_seconds",
    "model_layers",
    "model_shape",
    "proxy_sizes",
    "qkd_pool",
    "qkd_seconds",
    "qkd_step_seconds",
    "stage1_seconds",
]
