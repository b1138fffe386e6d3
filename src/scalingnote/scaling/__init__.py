"""Scaling laws for dense retrieval: sweeps, fits, predictions and budget planning.

Fang et al., *Scaling Laws for Dense Retrieval* §3.5, §4, §6 (Eq. 6–15) and ScalingNote
§4.4 (Eq. 18–20)::

    from scalingnote.scaling import fit_law, predict, plan_budget, CostModel, run_sweep

    fit = fit_law(N, loss, law="model")                 # L(N) = (A/N)^α + δ
    fit = fit_law((N, D), loss, law="joint")            # L(N, D) = [(A/N)^(α/β) + B/D]^β + δ
    fit.params, fit.stderr, fit.r2, fit.predict(N=1e9, D=1e5)
    plan_budget(fit, budget=1e5, costs=CostModel())     # Eq. (12)-(15)

Heavy dependencies (torch, scipy, matplotlib) are imported lazily.
"""

from scalingnote.scaling.budget import BudgetPlan, CostModel, loss_along_budget, plan_both, plan_budget
from scalingnote.scaling.fit import FitResult, fit_law, fit_table
from scalingnote.scaling.laws import LAWS, PAPER_PARAMS, PARAM_NAMES, joint_law, power_law, predict
from scalingnote.scaling.table import read_table, write_table

_SWEEP = ("SweepConfig", "SweepResult", "ValidationSpec", "load_sweep_config", "run_sweep")


def __getattr__(name: str):
    if name in _SWEEP:
        # why: the sweep needs torch (via scalingnote.training); import it only when asked for
        from scalingnote.scaling import sweep

        return getattr(sweep, name)
    raise AttributeError(f"module 'scalingnote.scaling' has no attribute {name!r}")


__all__ = [
    "LAWS",
    "PAPER_PARAMS",
    "PARAM_NAMES",
    "BudgetPlan",
    "CostModel",
    "FitResult",
    "SweepConfig",
    "SweepResult",
    "ValidationSpec",
    "fit_law",
    "fit_table",
    "joint_law",
    "load_sweep_config",
    "loss_along_budget",
    "plan_both",
    "plan_budget",
    "power_law",
    "predict",
    "read_table",
    "run_sweep",
    "write_table",
]
