"""Robust non-linear least-squares fits of the scaling laws (:mod:`scalingnote.scaling.laws`).

Method (Fang et al. §4 fit Eq. 7–9 "with the least squares method"; ScalingNote §4.4
reports R² of the same forms):

- every parameter is fitted through its logarithm (``log A``, ``log α``, ``log B``,
  ``log β``, ``log δ``): all are positive, and A/B span orders of magnitude, so the
  problem is far better conditioned in log space;
- :func:`scipy.optimize.least_squares` (trust-region reflective, bounded log-parameters)
  from many data-informed starting points; the best plain least-squares solutions are
  then refined with a robust loss (``soft_l1`` by default) whose scale ``f_scale`` is
  the robust spread (1.4826·MAD) of the residuals, re-estimated from the robust fit's
  residuals until it settles (an M-estimator with a MAD scale), so one bad grid point
  cannot drag the curve;
- uncertainties: ``cov(θ) = σ² (JᵀJ)⁻¹`` with J the Jacobian of the residuals w.r.t. the
  log-parameters θ at the solution and ``σ² = Σ r² / (n − p)``; the standard error of a
  parameter p = exp(θ) is ``p · se(θ)`` (delta method). Undefined (NaN) when n ≤ p;
- ``R² = 1 − SS_res / SS_tot`` on the fitted points; held-out points get MAE, RMSE
  and mean relative error of the predictions.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.scaling.laws import LAW_VARIABLES, PARAM_NAMES, _joint_log, check_law, predict
from scalingnote.scaling.table import holdout_mask, select_rows

#: Bounds of the log-parameters (natural scale: α, β in [1e-3, 20]; δ >= 1e-12 · max loss).
_EXP_BOUNDS = (math.log(1e-3), math.log(20.0))
_SCALE_BOUNDS = (-60.0, 80.0)


@dataclass
class FitResult:
    """A fitted law. ``params`` / ``stderr`` use the names of :data:`PARAM_NAMES`."""

    law: str
    params: dict[str, float]
    stderr: dict[str, float]
    r2: float
    rmse: float
    n_fit: int
    loss_fn: str
    f_scale: float
    success: bool
    message: str
    n_starts: int
    fixed: dict[str, float] = field(default_factory=dict)
    holdout: dict[str, Any] | None = None
    cov_log: list[list[float]] | None = None  #: covariance of the log-parameters (order of PARAM_NAMES)
    #: every parameter stopped at a search bound (stderr NaN); "delta" here: the law has no floor
    at_bound: list[str] = field(default_factory=list)

    def predict(self, N=None, D=None) -> np.ndarray:
        return predict(self.params, self.law, N=N, D=D)

    def evaluate(self, N=None, D=None, loss=None) -> dict[str, Any]:
        """Prediction errors on held-out points: n, mae, rmse, mape (mean |err| / loss)."""
        y = np.asarray(loss, dtype=np.float64)
        p = np.asarray(self.predict(N=N, D=D), dtype=np.float64)
        err = p - y
        return {
            "n": int(y.size),
            "mae": float(np.mean(np.abs(err))),
            "rmse": float(np.sqrt(np.mean(err**2))),
            "mape": float(np.mean(np.abs(err) / np.abs(y))),
            "predicted": [float(v) for v in p],
            "observed": [float(v) for v in y],
        }

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-ready dict: ``law``, the law's parameters, ``r2`` at the top level;
        NaN becomes None."""
        out: dict[str, Any] = {"law": self.law}
        out.update({k: _clean(v) for k, v in self.params.items()})
        out["r2"] = _clean(self.r2)
        out["rmse"] = _clean(self.rmse)
        out["n_fit"] = self.n_fit
        out["stderr"] = {k: _clean(v) for k, v in self.stderr.items()}
        if self.fixed:
            out["fixed"] = dict(self.fixed)
        if self.holdout is not None:
            out["holdout_n"] = self.holdout["n"]
            out["holdout_mae"] = _clean(self.holdout["mae"])
            out["holdout_rmse"] = _clean(self.holdout["rmse"])
            out["holdout_mape"] = _clean(self.holdout["mape"])
            out["holdout"] = {k: v for k, v in self.holdout.items() if k not in ("mae", "rmse", "mape", "n")}
        out["at_bound"] = list(self.at_bound)  #: every parameter at a search bound ([] when none)
        out["loss_fn"] = self.loss_fn
        out["f_scale"] = _clean(self.f_scale)
        out["success"] = self.success
        out["message"] = self.message
        out["n_starts"] = self.n_starts
        return out


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# ----------------------------------------------------------------------------- models in log space
def _model_fn(law: str):
    """(predict, jacobian) as functions of (theta, logX, logX2) with theta = log-parameters.

    The Jacobians are analytic (d prediction / d log-parameter)."""
    if law in ("model", "data"):

        def f(theta, logx, _unused=None):
            logC, loga, logd = theta
            return np.exp(np.exp(loga) * (logC - logx)) + np.exp(logd)

        def jac(theta, logx, _unused=None):
            logC, loga, logd = theta
            a = np.exp(loga)
            u = a * (logC - logx)
            E = np.exp(u)
            return np.stack([a * E, E * u, np.full_like(E, np.exp(logd))], axis=1)

        return f, jac

    def g(theta, logN, logD):
        logA, loga, logB, logb, logd = theta
        return _joint_log(logN, logD, logA, np.exp(loga), logB, np.exp(logb), np.exp(logd))

    def gjac(theta, logN, logD):
        # f = exp(b w) + d, w = logaddexp(u, v), u = (a/b)(log A - log N), v = log B - log D
        logA, loga, logB, logb, logd = theta
        a, b = np.exp(loga), np.exp(logb)
        u = (a / b) * (logA - logN)
        v = logB - logD
        w = np.logaddexp(u, v)
        su, sv = np.exp(u - w), np.exp(v - w)
        E = np.exp(b * w)
        return np.stack(
            [E * su * a, E * b * su * u, E * b * sv, E * b * (w - su * u), np.full_like(E, np.exp(logd))], axis=1
        )

    return g, gjac


def _bounds(law: str, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    dlo, dhi = math.log(1e-12 * float(y.max())), math.log(float(y.max()))
    if law == "joint":
        lo = [_SCALE_BOUNDS[0], _EXP_BOUNDS[0], _SCALE_BOUNDS[0], _EXP_BOUNDS[0], dlo]
        hi = [_SCALE_BOUNDS[1], _EXP_BOUNDS[1], _SCALE_BOUNDS[1], _EXP_BOUNDS[1], dhi]
    else:
        lo = [_SCALE_BOUNDS[0], _EXP_BOUNDS[0], dlo]
        hi = [_SCALE_BOUNDS[1], _EXP_BOUNDS[1], dhi]
    return np.array(lo), np.array(hi)


def _starts(law: str, logx: np.ndarray, logd2: np.ndarray | None, y: np.ndarray, lo, hi) -> list[np.ndarray]:
    """Data-informed starting points: a grid over exponent(s) and δ (fractions of min loss);
    the scale(s) put the curve through the median loss at the geometric-mean size."""
    ymin, ymed = float(y.min()), float(np.median(y))
    deltas = [0.9 * ymin, 0.5 * ymin, 0.1 * ymin, 1e-3 * ymin]
    out = []
    if law in ("model", "data"):
        xm = float(np.mean(logx))
        for a, d in itertools.product((0.05, 0.2, 0.5, 1.0, 2.0), deltas):
            excess = max(ymed - d, 0.1 * ymed)
            out.append(np.array([xm + math.log(excess) / a, math.log(a), math.log(d)]))
    else:
        assert logd2 is not None  # the joint law has the second variable (D)
        nm, dm = float(np.mean(logx)), float(np.mean(logd2))
        for a, b, d in itertools.product((0.1, 0.4, 1.0), (0.3, 0.8, 1.5), deltas[:3]):
            excess = max(ymed - d, 0.1 * ymed)
            e = excess ** (1.0 / b) / 2.0
            out.append(np.array([nm + (b / a) * math.log(e), math.log(a), dm + math.log(e), math.log(b), math.log(d)]))
    return [np.clip(s, lo + 1e-9, hi - 1e-9) for s in out]


def _as_arrays(law: str, x, loss) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    y = np.asarray(loss, dtype=np.float64).ravel()
    if law == "joint":
        if isinstance(x, np.ndarray) and x.ndim == 2:
            if x.shape[1] != 2:
                raise ScalingNoteError(f"joint law: x must be (n, 2) = (N, D) columns, got shape {x.shape}")
            N, D = x[:, 0], x[:, 1]
        else:
            try:
                N, D = x
            except (TypeError, ValueError):
                raise ScalingNoteError("joint law: x must be a pair (N, D) of arrays or an (n, 2) array") from None
        N = np.asarray(N, dtype=np.float64).ravel()
        D = np.asarray(D, dtype=np.float64).ravel()
        arrays = {"N": N, "D": D}
    else:
        X = np.asarray(x, dtype=np.float64).ravel()
        arrays = {LAW_VARIABLES[law][0]: X}
    for name, a in arrays.items():
        if a.size != y.size:
            raise ScalingNoteError(f"{name} has {a.size} values but loss has {y.size}")
        if not np.all(np.isfinite(a)) or np.any(a <= 0):
            raise ScalingNoteError(f"{name} must be finite and > 0")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ScalingNoteError("loss must be finite and > 0 (contrastive perplexity is a positive NLL)")
    if law == "joint":
        return arrays["N"], arrays["D"], y
    return next(iter(arrays.values())), None, y


def _robust_refine(lin: list, solve, loss_fn: str, f_scale: float | None, n_refine: int, floor: float):
    """Refine the best distinct least-squares optima ``lin`` (sorted by cost) with the robust
    ``loss_fn``; the residual scale is ``f_scale`` or 1.4826·MAD, re-estimated from the robust
    residuals until it settles (an outlier inflates the least-squares MAD). Returns (best, scale)."""

    def mad_scale(r):
        return max(1.4826 * float(np.median(np.abs(r - np.median(r)))), floor)

    best = lin[0]
    seeds: list[np.ndarray] = []
    for r in lin:
        if all(np.max(np.abs(r.x - s)) > 1e-6 for s in seeds):
            seeds.append(r.x)
        if len(seeds) >= n_refine:
            break
    used_scale = float(f_scale) if f_scale is not None else mad_scale(best.fun)
    robust = [r for r in (solve(s, loss_fn, used_scale) for s in seeds) if r is not None and np.all(np.isfinite(r.fun))]
    if not robust:
        return best, used_scale
    best = min(robust, key=lambda r: r.cost)
    for _ in range(5 if f_scale is None else 0):
        new_scale = mad_scale(best.fun)
        if abs(new_scale - used_scale) <= 0.05 * used_scale:
            break
        again = solve(best.x, loss_fn, new_scale)
        if again is None or not np.all(np.isfinite(again.fun)):
            break
        best, used_scale = again, new_scale
    return best, used_scale


#: a parameter sits at a search bound when moving it onto the bound changes no prediction by more
#: than this share of the largest one: the data cannot tell it from the bound (an irreducible loss of
#: 1.2 x its lower bound, 1e-12 x the largest loss, is no floor at all)
AT_BOUND_RTOL = 1e-9


def params_at_bound(theta, names, lo, hi, predict=None) -> list[str]:
    """Every parameter (log-value ``theta``) on its bound ``lo`` / ``hi`` (within 1e-6 in log space),
    or, with ``predict(theta)``, so near it that the predictions on the bound are the same within
    :data:`AT_BOUND_RTOL`."""
    theta = np.asarray(theta, dtype=np.float64)
    base = predict(theta) if predict is not None else None
    out = []
    for i, (k, t, low, high) in enumerate(zip(names, theta, lo, hi, strict=True)):
        b = low if t - low <= high - t else high
        if abs(t - b) <= 1e-6:
            out.append(k)
        elif base is not None:
            moved = theta.copy()
            moved[i] = b
            with np.errstate(over="ignore", invalid="ignore"):
                diff = np.abs(predict(moved) - base)
            if np.all(np.isfinite(diff)) and float(diff.max()) <= AT_BOUND_RTOL * float(np.abs(base).max()):
                out.append(k)
    return out


def _uncertainty(theta, jac, ss_fit: float, n: int, names, params: dict[str, float], lo, hi, predict=None):
    """cov(theta) = s^2 (J^T J)^-1 on the log parameters, standard errors by the delta method
    on the natural scale; a parameter pinned at its bound has no meaningful standard error."""
    p = len(names)
    dof = n - p
    cov = np.full((p, p), np.nan)
    if dof > 0:
        J = jac(theta)
        cov = (ss_fit / dof) * np.linalg.pinv(J.T @ J)
    se_log = np.sqrt(np.clip(np.diag(cov), 0, None)) if dof > 0 else np.full(p, np.nan)
    at_bound = params_at_bound(theta, names, lo, hi, predict)
    stderr = {k: (float("nan") if k in at_bound else float(params[k] * s)) for k, s in zip(names, se_log, strict=True)}
    return cov, stderr, at_bound


class _Residuals:
    """The residuals of ``law`` at log-parameters ``theta`` and their Jacobian: prediction − loss
    (``"linear"``) or log(prediction) − log(loss) (``"log"``)."""

    def __init__(self, law: str, X: np.ndarray, X2: np.ndarray | None, y: np.ndarray, kind: str):
        if kind not in ("linear", "log"):
            raise ScalingNoteError(f"residuals must be 'linear' or 'log', got {kind!r}")
        self.f, self.fjac = _model_fn(law)
        self.logx, self.logx2 = np.log(X), (np.log(X2) if X2 is not None else None)
        self.y, self.logy, self.kind = y, np.log(y), kind

    def predict(self, theta) -> np.ndarray:
        return self.f(theta, self.logx, self.logx2)

    def __call__(self, theta) -> np.ndarray:
        if self.kind == "log":
            return np.log(self.predict(theta)) - self.logy
        return self.predict(theta) - self.y

    def jac(self, theta) -> np.ndarray:
        if self.kind == "log":
            return self.fjac(theta, self.logx, self.logx2) / self.predict(theta)[:, None]
        return self.fjac(theta, self.logx, self.logx2)


def _solver(res: _Residuals, lo, hi, nfev: int):
    """``solve(theta0, loss_name, scale)``: one bounded trust-region fit (None when the
    residuals are not finite at the start)."""
    from scipy.optimize import least_squares  # scipy: loaded on the first fit, not with the package

    def solve(theta0, loss_name, scale):
        with np.errstate(over="ignore", invalid="ignore"):
            try:
                return least_squares(
                    res,
                    theta0,
                    jac=res.jac,
                    bounds=(lo, hi),
                    loss=loss_name,
                    f_scale=scale,
                    x_scale="jac",
                    max_nfev=nfev,
                    xtol=1e-12,
                    ftol=1e-12,
                    gtol=1e-12,
                    method="trf",
                )
            except ValueError:  # residuals not finite at the start
                return None

    return solve


def _best_fit(law: str, starts, solve, res: _Residuals, loss_fn: str, f_scale: float | None, n_refine: int):
    """The least-squares fit from every start, the best ones refined with the robust ``loss_fn``.
    Returns (best solution, the robust loss's residual scale or NaN)."""
    lin = [r for r in (solve(s, "linear", 1.0) for s in starts) if r is not None and np.all(np.isfinite(r.fun))]
    if not lin:
        raise ScalingNoteError(f"{law} law: the fit failed from every starting point")
    lin.sort(key=lambda r: r.cost)
    if loss_fn == "linear":
        return lin[0], float("nan")
    floor = 1e-9 * (1.0 if res.kind == "log" else float(np.abs(res.y).max()))
    return _robust_refine(lin, solve, loss_fn, f_scale, n_refine, floor)


def fit_law(
    x,
    loss: Sequence[float] | np.ndarray,
    law: str = "model",
    *,
    loss_fn: str = "soft_l1",
    f_scale: float | None = None,
    residuals: str = "linear",
    n_refine: int = 3,
    max_nfev: int | None = None,
) -> FitResult:
    """Fit ``law`` to (x, loss).

    ``x``: the model sizes N (law "model"), the data sizes D (law "data"), or a pair
    ``(N, D)`` / an ``(n, 2)`` array (law "joint"). ``loss_fn``: a
    :func:`scipy.optimize.least_squares` loss ("linear", "soft_l1", "huber", "cauchy",
    "arctan"); ``f_scale``: its residual scale (default: 1.4826·MAD of the residuals,
    iterated from the least-squares to the robust fit). ``residuals="log"`` fits log(prediction) −
    log(loss) (relative errors, for losses spanning orders of magnitude); R² is always computed on
    the loss itself.
    ``at_bound`` of the result lists every parameter that sits at a search bound
    (:func:`params_at_bound`). Deterministic (fixed starting grid, no random restarts).
    """
    check_law(law)
    X, X2, y = _as_arrays(law, x, loss)
    names = PARAM_NAMES[law]
    p, n = len(names), y.size
    if n < p:
        raise ScalingNoteError(f"the {law} law has {p} parameters: need at least {p} points, got {n}")
    res = _Residuals(law, X, X2, y, residuals)
    lo, hi = _bounds(law, y)
    starts = _starts(law, res.logx, res.logx2, y, lo, hi)
    best, used_scale = _best_fit(
        law, starts, _solver(res, lo, hi, max_nfev or 400 * p), res, loss_fn, f_scale, n_refine
    )
    theta = best.x
    ss_fit = float(np.sum(res(theta) ** 2))
    err = res.predict(theta) - y  # R² and RMSE on the loss scale whatever the residuals
    ss_res = float(np.sum(err**2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    params = {k: float(np.exp(t)) for k, t in zip(names, theta, strict=True)}
    cov, stderr, at_bound = _uncertainty(theta, res.jac, ss_fit, n, names, params, lo, hi, res.predict)
    return FitResult(
        law=law,
        params=params,
        stderr=stderr,
        r2=float(r2),
        rmse=float(math.sqrt(ss_res / n)),
        n_fit=int(n),
        loss_fn=loss_fn if residuals == "linear" else f"{loss_fn} (log residuals)",
        f_scale=used_scale,
        success=bool(best.success),
        message=str(best.message),
        n_starts=len(starts),
        cov_log=[[_clean(float(v)) for v in row] for row in cov],
        at_bound=at_bound,
    )


def fit_table(
    rows: Sequence[dict[str, Any]],
    law: str,
    *,
    at: float | None = None,
    holdout_largest: int | None = None,
    holdout_frac: float | None = None,
    holdout_by: str | None = None,
    seed: int = 0,
    **fit_kwargs: Any,
) -> FitResult:
    """Fit ``law`` to the rows of a results table (:func:`scalingnote.scaling.table.read_table`).

    One-variable laws use the rows at the largest value of the other variable (or ``at``),
    see :func:`~scalingnote.scaling.table.select_rows`. Held-out rows (the
    ``holdout_largest`` largest distinct values of ``holdout_by`` — default the law's
    variable, N for the joint law — or a random ``holdout_frac``) are left out of the fit
    and scored with its predictions.
    """
    check_law(law)
    for var in LAW_VARIABLES[law]:
        if rows and var not in rows[0]:
            raise ScalingNoteError(f"the {law} law needs a {var} column")
    sel, fixed = select_rows(rows, law, at)
    by = holdout_by or LAW_VARIABLES[law][0]
    mask = holdout_mask(sel, by, largest=holdout_largest, frac=holdout_frac, seed=seed) if sel else np.zeros(0, bool)
    fit_rows = [r for r, m in zip(sel, mask, strict=True) if not m]
    held = [r for r, m in zip(sel, mask, strict=True) if m]

    def xs(rs):
        if law == "joint":
            return (np.array([r["N"] for r in rs]), np.array([r["D"] for r in rs]))
        return np.array([r[LAW_VARIABLES[law][0]] for r in rs])

    res = fit_law(xs(fit_rows), np.array([r["loss"] for r in fit_rows]), law, **fit_kwargs)
    res.fixed = fixed
    if held:
        kw = {"N": xs(held)[0], "D": xs(held)[1]} if law == "joint" else {LAW_VARIABLES[law][0]: xs(held)}
        ev = res.evaluate(loss=np.array([r["loss"] for r in held]), **kw)
        ev["by"] = by
        ev["N"] = [r.get("N") for r in held]
        ev["D"] = [r.get("D") for r in held]
        res.holdout = ev
    return res


def read_fit_params(path, law: str | None = "joint", *, with_bounds: bool = False) -> dict[str, Any]:
    """Parameters from a ``scalingnote scaling fit --json`` file (or any JSON object holding
    the law's parameter names at the top level). Errors name the file and the field.
    ``with_bounds``: also the fit's ``at_bound`` (the parameters it left at a search bound), when
    the file records it (the budget planner reads from it whether the law has a floor)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ScalingNoteError(f"{path}: cannot read fit: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise DataError(path, e.lineno, None, f"invalid JSON: {e.msg}") from None
    if isinstance(doc, list):  # a results file with one row per law
        doc = next((r for r in doc if isinstance(r, dict) and r.get("law") == law), None)
        if doc is None:
            raise DataError(path, None, "law", f"no {law!r} row")
    if isinstance(doc, dict) and "rows" in doc and isinstance(doc["rows"], list):
        doc = next((r for r in doc["rows"] if r.get("law") == law), None)
        if doc is None:
            raise DataError(path, None, "law", f"no row with law {law!r}")
    if not isinstance(doc, dict):
        raise DataError(path, None, None, "expected a JSON object")
    if law is not None and doc.get("law", law) != law:
        raise DataError(path, None, "law", f"expected a {law!r} fit, got {doc.get('law')!r}")
    names = PARAM_NAMES[law or doc.get("law", "joint")]
    out = {}
    for k in names:
        v = doc.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise DataError(path, None, k, f"expected a positive number, got {v!r}")
        out[k] = float(v)
    if with_bounds and doc.get("at_bound") is not None:
        out["at_bound"] = doc["at_bound"]
    return out


__all__ = ["AT_BOUND_RTOL", "FitResult", "fit_law", "fit_table", "params_at_bound", "read_fit_params"]
