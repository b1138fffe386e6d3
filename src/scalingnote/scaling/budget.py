"""Budget allocation with a fitted joint law — Fang et al. *Scaling Laws for Dense Retrieval* §6.

Cost of the life cycle of a model with N non-embedding parameters trained on D annotated
pairs, Eq. (12)::

    Z(N, D) = Z_data · D + Z_train · N + Z_infer · N

with the cost factors of Eq. (13)–(15):

- ``Z_data``  = price of one annotated (query, passage) pair ($0.6, Althammer et al.);
- ``Z_train`` = steps · (query_tokens + 2 · passage_tokens) · batch · 6 · price_per_hour
  / (peak_FLOPs · 3600 · utilisation)  — 6N FLOPs per trained token, a fixed number of
  steps (10,000 × batch 256, query 30 / passage 60 tokens, A100 at $3.93/h, 312 TFLOPs,
  25 % utilisation ⇒ 3.22e-8 $ per parameter);
- ``Z_infer`` = corpus_size · doc_tokens · 2 · price_per_hour / (peak_FLOPs · 3600 ·
  utilisation) — 2N FLOPs per encoded token, the whole corpus encoded once (30e12 pages
  × 512 tokens ⇒ 0.43 $ per parameter).

Two extensions, both off by default so that the defaults are the paper's model exactly:
``query_volume`` (queries encoded over the model's life, ``query_tokens`` each) adds
``2N`` FLOPs per query token to ``Z_infer``; ``train_mode="epochs"`` replaces the
fixed-step training cost by one proportional to the data, ``Z_train_pair · N · D`` with
``Z_train_pair = epochs · (query_tokens + 2 · passage_tokens) · 6 · price / (...)``.
Each factor can also be given directly (``z_data``, ``z_train``, ``z_infer``,
``z_train_pair``).

The planner minimises the predicted loss L(N, D) (Eq. 9) subject to Z(N, D) ≤ budget.
L decreases in D, so the optimum spends the whole budget: for each N the data size is
``D(N) = (budget − (Z_train + Z_infer) · N) / (Z_data + Z_train_pair · N)``, and the best
N is found on a dense log-spaced grid, then refined by bounded scalar minimisation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.scaling.laws import PARAM_NAMES, joint_law

SECONDS_PER_HOUR = 3600.0


@dataclass
class CostModel:
    """Cost factors of Eq. (12); defaults reproduce Eq. (13)–(15)."""

    annotation_cost_per_pair: float = 0.6  #: Z_data, $ per annotated pair (Eq. 13)
    gpu_price_per_hour: float = 3.93  #: $ per GPU hour (A100 80G)
    peak_flops: float = 312e12  #: peak FLOP/s of the GPU
    utilization: float = 0.25  #: fraction of peak achieved
    train_steps: int = 10_000
    train_batch_size: int = 256
    query_tokens: int = 30
    passage_tokens: int = 60
    corpus_size: float = 30e12  #: documents encoded once by the document encoder
    doc_tokens: int = 512
    query_volume: float = 0.0  #: queries encoded over the model's life (not in the paper: 0)
    train_mode: Literal["fixed_steps", "epochs"] = "fixed_steps"
    train_epochs: float = 1.0  #: train_mode="epochs": passes over the D pairs
    z_data: float | None = None  #: override the derived factors
    z_train: float | None = None
    z_infer: float | None = None
    z_train_pair: float | None = None

    def __post_init__(self) -> None:
        for name in (
            "annotation_cost_per_pair",
            "gpu_price_per_hour",
            "peak_flops",
            "utilization",
            "corpus_size",
            "query_volume",
            "train_epochs",
        ):
            v = getattr(self, name)
            if v < 0 or (name in ("peak_flops", "utilization") and v == 0):
                raise ValueError(
                    f"{name} must be {'> 0' if name in ('peak_flops', 'utilization') else '>= 0'}, got {v}"
                )
        for name in ("z_data", "z_train", "z_infer", "z_train_pair"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0, got {v}")

    @property
    def dollars_per_flop(self) -> float:
        return self.gpu_price_per_hour / (self.peak_flops * SECONDS_PER_HOUR * self.utilization)

    @property
    def Z_data(self) -> float:
        """Eq. (13)."""
        return self.annotation_cost_per_pair if self.z_data is None else self.z_data

    def _train_factor(self, override: float | None, mode: str, passes: float) -> float:
        """$ per parameter of training in ``mode`` (``override`` when given; 0 in the other mode):
        ``passes`` x (query + 2 passages) tokens x 6 FLOPs (Eq. 14)."""
        if override is not None:
            return override
        if self.train_mode != mode:
            return 0.0
        return passes * (self.query_tokens + 2 * self.passage_tokens) * 6 * self.dollars_per_flop

    @property
    def Z_train(self) -> float:
        """Eq. (14): $ per parameter for a fixed-step training run (0 in ``epochs`` mode)."""
        return self._train_factor(self.z_train, "fixed_steps", self.train_steps * self.train_batch_size)

    @property
    def Z_train_pair(self) -> float:
        """$ per parameter per training pair (``epochs`` mode; 0 in the paper's fixed-step mode)."""
        return self._train_factor(self.z_train_pair, "epochs", self.train_epochs)

    @property
    def Z_infer(self) -> float:
        """Eq. (15): $ per parameter to encode the corpus (+ the query volume, an extension)."""
        if self.z_infer is not None:
            return self.z_infer
        tokens = self.corpus_size * self.doc_tokens + self.query_volume * self.query_tokens
        return tokens * 2 * self.dollars_per_flop

    def factors(self) -> dict[str, float]:
        return {
            "Z_data": self.Z_data,
            "Z_train": self.Z_train,
            "Z_train_pair": self.Z_train_pair,
            "Z_infer": self.Z_infer,
        }

    def cost(self, N, D, include_inference: bool = True) -> np.ndarray:
        """Eq. (12): Z(N, D) (plus the optional N·D training term)."""
        N = np.asarray(N, dtype=np.float64)
        D = np.asarray(D, dtype=np.float64)
        z = self.Z_data * D + self.Z_train * N + self.Z_train_pair * N * D
        if include_inference:
            z = z + self.Z_infer * N
        return z

    def breakdown(self, N: float, D: float, include_inference: bool = True) -> dict[str, float]:
        return {
            "cost_data": self.Z_data * D,
            "cost_train": self.Z_train * N + self.Z_train_pair * N * D,
            "cost_infer": self.Z_infer * N if include_inference else 0.0,
        }

    def max_data(self, N, budget: float, include_inference: bool = True) -> np.ndarray:
        """The largest D affordable with model size N (≤ 0: N alone exceeds the budget)."""
        N = np.asarray(N, dtype=np.float64)
        fixed = (self.Z_train + (self.Z_infer if include_inference else 0.0)) * N
        per_pair = self.Z_data + self.Z_train_pair * N
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(per_pair > 0, (budget - fixed) / per_pair, np.inf)


@dataclass
class BudgetPlan:
    """The loss-minimising (N, D) under a budget."""

    budget: float
    include_inference: bool
    N: float
    D: float
    loss: float
    cost: float
    cost_data: float
    cost_train: float
    cost_infer: float
    at_bound: bool  #: the optimum sits on the N search range's edge (widen n_range)
    #: the law the plan minimised: Eq. (9) with its fitted parameters
    law: str = "joint"
    #: its irreducible loss δ, the floor no (N, D) goes below; None when δ sits at its search bound
    #: (the fit found no floor: the predicted loss falls without limit as N and D grow)
    floor: float | None = None

    @property
    def has_floor(self) -> bool:
        return self.floor is not None

    def describe(self) -> str:
        """One line naming the law used and whether it has a floor."""
        floor = (
            f"floor (irreducible loss) {self.floor:.4g}"
            if self.has_floor
            else "no floor (its irreducible loss sits at its lower bound)"
        )
        return f"law used: {self.law}; {floor}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "has_floor": self.has_floor}


def describe_law(params: Any) -> tuple[str, float | None]:
    """(the joint law with its parameters, its floor δ or None when δ sits at its search bound).
    ``params``: a joint :class:`~scalingnote.scaling.fit.FitResult` (its ``at_bound``), or a dict of
    parameters, optionally with ``at_bound`` (a ``scalingnote scaling fit --json`` row)."""
    p = _joint_params(params)
    at_bound = getattr(params, "at_bound", None)
    if at_bound is None and isinstance(params, dict):
        at_bound = params.get("at_bound")
    text = (
        "joint L(N, D) = [(A/N)^(alpha/beta) + B/D]^beta + delta ("
        + ", ".join(f"{k}={v:.4g}" for k, v in p.items())
        + ")"
    )
    if at_bound is None:  # no record of the fit's bounds: the floor is what the parameters say
        return text, p["delta"]
    return text, (None if "delta" in at_bound else p["delta"])


def _joint_params(params: Any) -> dict[str, float]:
    if hasattr(params, "params") and hasattr(params, "law"):
        if params.law != "joint":
            raise ScalingNoteError(f"budget planning needs a joint-law fit, got a {params.law!r} fit")
        params = params.params
    missing = [k for k in PARAM_NAMES["joint"] if k not in params or params[k] is None]
    if missing:
        raise ScalingNoteError(
            f"budget planning needs the joint-law parameters {list(PARAM_NAMES['joint'])}; missing {missing}"
        )
    return {k: float(params[k]) for k in PARAM_NAMES["joint"]}


def loss_along_budget(
    params: Any, budget: float, costs: CostModel, N, include_inference: bool = True, min_data: float = 1.0
) -> np.ndarray:
    """Predicted loss of each model size N when the rest of the budget buys data (Fig. 7/8);
    ``inf`` where fewer than ``min_data`` pairs are affordable."""
    p = _joint_params(params)
    N = np.asarray(N, dtype=np.float64)
    D = costs.max_data(N, budget, include_inference)
    ok = D >= min_data
    out = np.full(N.shape, np.inf)
    if np.any(ok):
        out[ok] = joint_law(N[ok], D[ok], **p)
    return out


def plan_budget(
    params: Any,
    budget: float,
    costs: CostModel | None = None,
    *,
    include_inference: bool = True,
    n_range: tuple[float, float] = (1e4, 1e13),
    grid_points: int = 4001,
    min_data: float = 1.0,
) -> BudgetPlan:
    """Minimise the joint law's loss over N in ``n_range`` with Z(N, D) ≤ ``budget``.

    ``params``: a joint :class:`~scalingnote.scaling.fit.FitResult` or a dict with A, alpha,
    B, beta, delta. Raises if no N in the range leaves budget for ``min_data`` pairs.
    """
    from scipy.optimize import minimize_scalar

    costs = costs or CostModel()
    if not budget > 0:
        raise ScalingNoteError(f"budget must be > 0, got {budget}")
    lo, hi = float(n_range[0]), float(n_range[1])
    if not 0 < lo < hi:
        raise ScalingNoteError(f"n_range must satisfy 0 < min < max, got {n_range}")
    p = _joint_params(params)
    logN = np.linspace(math.log(lo), math.log(hi), grid_points)
    losses = loss_along_budget(p, budget, costs, np.exp(logN), include_inference, min_data)
    if not np.any(np.isfinite(losses)):
        raise ScalingNoteError(
            f"budget {budget:g} cannot pay for N >= {lo:g} parameters and {min_data:g} training pairs "
            f"(cost factors {costs.factors()})"
        )
    i = int(np.argmin(losses))
    a, b = logN[max(0, i - 1)], logN[min(grid_points - 1, i + 1)]
    best_logN, best_loss = logN[i], float(losses[i])
    if b > a:
        res = minimize_scalar(
            lambda t: float(
                loss_along_budget(p, budget, costs, np.array([math.exp(t)]), include_inference, min_data)[0]
            ),
            bounds=(a, b),
            method="bounded",
            options={"xatol": 1e-10},
        )
        if np.isfinite(res.fun) and res.fun <= best_loss:
            best_logN, best_loss = float(res.x), float(res.fun)
    N = math.exp(best_logN)
    D = float(costs.max_data(np.array(N), budget, include_inference))
    parts = costs.breakdown(N, D, include_inference)
    law, floor = describe_law(params)
    return BudgetPlan(
        budget=float(budget),
        include_inference=include_inference,
        N=N,
        D=D,
        loss=best_loss,
        cost=float(sum(parts.values())),
        at_bound=bool(i == 0 or i == grid_points - 1),
        **{k: float(v) for k, v in parts.items()},
        law=law,
        floor=floor,
    )


def plan_both(params: Any, budget: float, costs: CostModel | None = None, **kwargs: Any) -> dict[str, BudgetPlan]:
    """The optimum without (Fig. 7) and with (Fig. 8) the inference cost."""
    return {
        "without_inference": plan_budget(params, budget, costs, include_inference=False, **kwargs),
        "with_inference": plan_budget(params, budget, costs, include_inference=True, **kwargs),
    }


__all__ = ["BudgetPlan", "CostModel", "describe_law", "loss_along_budget", "plan_both", "plan_budget"]
