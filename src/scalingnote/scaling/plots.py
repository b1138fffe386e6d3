"""PNG plots of a sweep, its fitted laws and budget curves (matplotlib, Agg backend).

- :func:`plot_loss_vs` — loss vs N (or D) on log axes, one colour per value of the other
  variable, the one-variable fit (Fang et al. Fig. 3/4, ScalingNote Fig. 5a/b) and, when
  given, the joint law's curve for each value of the other variable; held-out points are
  drawn as stars (Fang et al. Fig. 6);
- :func:`plot_joint` — the joint law: loss vs D per model size, and iso-loss lines in the
  (N, D) plane (ScalingNote Fig. 5c);
- :func:`plot_budget` — predicted loss vs N for several budgets without / with the
  inference cost, optimum marked (Fang et al. Fig. 7/8).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.scaling.budget import CostModel, loss_along_budget, plan_budget
from scalingnote.utils.io import atomic_path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=".png") as p:
        fig.savefig(p, format="png", dpi=90, bbox_inches="tight")
    _plt().close(fig)
    return path


def _short(v: float) -> str:
    """2e6 -> "2M", 32 -> "32", 0.15 -> "0.15"."""
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= factor:
            return f"{v / factor:.3g}{suffix}"
    return f"{v:.3g}"


def _log_axes(ax, x: bool = True, y: bool = True) -> None:
    """Log scale; short plain tick labels (2M, 500k) when an axis spans few decades
    (scientific notation otherwise); minor ticks labelled at 2x and 5x on short axes."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    major = FuncFormatter(lambda v, _: _short(v))

    def minor_labels(every: bool):
        def f(v, _):
            m = v / 10 ** np.floor(np.log10(v))
            keep = every or round(m) in (2, 5)
            return _short(v) if keep and abs(m - round(m)) < 1e-6 else ""

        return FuncFormatter(f)

    for on, axis, set_scale, get_lim in (
        (x, ax.xaxis, ax.set_xscale, ax.get_xlim),
        (y, ax.yaxis, ax.set_yscale, ax.get_ylim),
    ):
        if not on:
            continue
        set_scale("log")
        span = _decades(get_lim())
        if span <= 3:
            axis.set_major_formatter(major)
        axis.set_minor_formatter(minor_labels(span < 0.7) if span < 2.0 else NullFormatter())


def _decades(lim) -> float:
    lo, hi = lim
    return float(np.log10(hi / lo)) if lo > 0 and hi > 0 else 99.0


def _span(values, pad: float = 1.6) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    return np.geomspace(v.min() / pad, v.max() * pad, 200)


def _held(fit, var: str) -> set[float]:
    if fit is None or not fit.holdout:
        return set()
    return {float(x) for x in fit.holdout.get(var, []) if x is not None}


def _fmt(params: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.3g}" for k, v in params.items())


def plot_loss_vs(rows: Sequence[dict[str, Any]], var: str, path: str | Path, fit=None, joint=None) -> Path:
    """Loss vs ``var`` ("N" or "D") with the one-variable ``fit`` and the ``joint`` fit."""
    plt = _plt()
    other = "D" if var == "N" else "N"
    fig, ax = plt.subplots(figsize=(6, 4.3))
    groups = sorted({r.get(other) for r in rows}, key=lambda v: (v is None, v))
    cmap = plt.get_cmap("viridis")
    fixed_other = (fit.fixed or {}).get(other) if fit is not None else None
    held_x = _held(fit, var)
    for i, g in enumerate(groups):
        rs = sorted([r for r in rows if r.get(other) == g], key=lambda r: r[var])
        col = cmap(i / max(1, len(groups) - 1))
        label = f"{other}={g:.3g}" if g is not None else "observed"
        x = np.array([r[var] for r in rs])
        y = np.array([r["loss"] for r in rs])
        is_held = np.array([(g == fixed_other or fixed_other is None) and float(v) in held_x for v in x], dtype=bool)
        ax.scatter(x[~is_held], y[~is_held], color=col, label=label, zorder=3)
        if is_held.any():
            ax.scatter(
                x[is_held], y[is_held], color="red", marker="*", s=120, zorder=4, label="held out" if i == 0 else None
            )
        if joint is not None and g is not None:
            xs = _span([r[var] for r in rows])
            kw = {var: xs, other: np.full_like(xs, g)}
            ax.plot(xs, joint.predict(**kw), color=col, ls=":", lw=1)
    if fit is not None:
        xs = _span([r[var] for r in rows])
        ax.plot(
            xs,
            fit.predict(**{var: xs}),
            color="black",
            ls="--",
            lw=1.5,
            label=f"fit ({_fmt(fit.params)}, R²={fit.r2:.3f})",
        )
    # y range: the observations and the fitted values at the observed sizes (an extrapolated
    # curve must not squash the data)
    ys = [r["loss"] for r in rows]
    if fit is not None:
        ys += list(np.atleast_1d(fit.predict(**{var: np.array([r[var] for r in rows])})))
    ys = [v for v in ys if np.isfinite(v) and v > 0]
    ax.set_ylim(min(ys) / 1.25, max(ys) * 1.25)
    _log_axes(ax)
    ax.set_xlabel("N (non-embedding parameters)" if var == "N" else "D (training pairs)")
    ax.set_ylabel("contrastive perplexity (fixed evaluation set)")
    title = f"loss vs {var}"
    if fixed_other is not None:
        title += f" (fit at {other}={fixed_other:.3g})"
    if joint is not None:
        title += "; dotted: joint law"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


def plot_joint(rows: Sequence[dict[str, Any]], joint, path: str | Path) -> Path:
    """Joint law: loss vs D per N (left) and iso-loss lines in the (N, D) plane (right)."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.3))
    Ns = sorted({r["N"] for r in rows})
    cmap = plt.get_cmap("viridis")
    Dspan = _span([r["D"] for r in rows])
    held = (
        {(a, b) for a, b in zip(*(joint.holdout.get(k, []) for k in ("N", "D")), strict=True)}
        if joint.holdout
        else set()
    )
    for i, n in enumerate(Ns):
        col = cmap(i / max(1, len(Ns) - 1))
        rs = sorted([r for r in rows if r["N"] == n], key=lambda r: r["D"])
        for r in rs:
            h = (r["N"], r["D"]) in held
            ax1.scatter(
                r["D"], r["loss"], color="red" if h else col, marker="*" if h else "o", s=120 if h else 30, zorder=3
            )
        ax1.plot(Dspan, joint.predict(N=np.full_like(Dspan, n), D=Dspan), color=col, ls="--", lw=1, label=f"N={n:.3g}")
    _log_axes(ax1)
    ax1.set_xlabel("D (training pairs)")
    ax1.set_ylabel("contrastive perplexity (fixed evaluation set)")
    ax1.set_title(f"joint law, R²={joint.r2:.3f}" + ("; stars: held out" if held else ""), fontsize=10)
    ax1.legend(fontsize=7)
    ax1.grid(True, which="both", alpha=0.3)

    Ng = _span([r["N"] for r in rows], 3.0)
    Dg = _span([r["D"] for r in rows], 3.0)
    NN, DD = np.meshgrid(Ng, Dg)
    LL = joint.predict(N=NN, D=DD)
    lo, hi = float(np.nanmin(LL)), float(np.nanmax(LL))
    levels = np.unique(np.geomspace(lo, hi, 12)[1:-1].round(6)) if hi > lo > 0 else 10
    cs = ax2.contour(NN, DD, LL, levels=levels, cmap="viridis")
    ax2.clabel(cs, fontsize=7, fmt="%.3g")
    ax2.scatter([r["N"] for r in rows], [r["D"] for r in rows], c="k", s=12, zorder=3)
    _log_axes(ax2)
    ax2.set_xlabel("N (non-embedding parameters)")
    ax2.set_ylabel("D (training pairs)")
    ax2.set_title("iso-loss lines of " + _fmt(joint.params), fontsize=8)
    return _save(fig, path)


def plot_budget(
    params: Any, budgets: Sequence[float], costs, path: str | Path, n_range: tuple[float, float] = (1e4, 1e13)
) -> Path:
    """Predicted loss vs N for each budget, without and with the inference cost (Fang et al. Fig. 7/8)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3), sharey=True)
    Ns = np.geomspace(n_range[0], n_range[1], 400)
    cmap = plt.get_cmap("plasma")
    for ax, inf in zip(axes, (False, True), strict=True):
        for i, b in enumerate(sorted(budgets)):
            col = cmap(i / max(1, len(budgets) - 1) * 0.85)
            L = loss_along_budget(params, b, costs, Ns, include_inference=inf)
            ok = np.isfinite(L)
            if not ok.any():
                continue
            ax.plot(Ns[ok], L[ok], color=col, label=f"${b:.3g}")
            try:
                p = plan_budget(params, b, costs, include_inference=inf, n_range=n_range)
                ax.scatter([p.N], [p.loss], color=col, marker="*", s=100, zorder=3)
            except Exception:  # noqa: BLE001 - an unaffordable budget simply has no optimum to mark
                pass
        _log_axes(ax)
        ax.set_xlabel("N (non-embedding parameters)")
        ax.set_title("with inference cost" if inf else "without inference cost", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, title="budget", title_fontsize=7)
    axes[0].set_ylabel("predicted contrastive perplexity")
    return _save(fig, path)


def plot_all(
    rows: Sequence[dict[str, Any]],
    fits: dict[str, Any],
    out_dir: str | Path,
    budgets: Sequence[float] = (),
    costs=None,
    n_range: tuple[float, float] = (1e4, 1e13),
    prefix: str = "",
) -> list[Path]:
    """Every plot the available fits allow (``<prefix>loss_vs_N.png``, ``loss_vs_D.png``,
    ``joint.png``, ``budget.png``); returns the written paths."""
    out = Path(out_dir)
    paths = []
    joint = fits.get("joint")
    if rows and "N" in rows[0]:
        paths.append(plot_loss_vs(rows, "N", out / f"{prefix}loss_vs_N.png", fits.get("model"), joint))
    if rows and "D" in rows[0]:
        paths.append(plot_loss_vs(rows, "D", out / f"{prefix}loss_vs_D.png", fits.get("data"), joint))
    if joint is not None:
        paths.append(plot_joint(rows, joint, out / f"{prefix}joint.png"))
        if budgets:
            paths.append(plot_budget(joint, budgets, costs or CostModel(), out / f"{prefix}budget.png", n_range))
    return paths


__all__ = ["plot_all", "plot_budget", "plot_joint", "plot_loss_vs"]
