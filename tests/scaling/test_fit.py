"""The scaling-law fitter recovers known parameters from synthetic data of each law."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.scaling.fit import _model_fn, fit_law, fit_table, read_fit_params
from scalingnote.scaling.laws import PAPER_PARAMS, joint_law, power_law, predict
from scalingnote.scaling.table import holdout_mask, read_table, select_rows, write_table

N_GRID = np.geomspace(5e5, 1e8, 10)
D_GRID = np.geomspace(1e3, 5e5, 10)
NJ, DJ = (a.ravel() for a in np.meshgrid(np.geomspace(5e5, 1e8, 5), np.geomspace(1e3, 5e5, 5)))

TRUE = {
    "model": PAPER_PARAMS["fang_msmarco_model"],  # A 4.54e4, alpha 0.46, delta 0.02
    "data": {"B": 6.04e4 / 100, "beta": 0.5, "delta": 0.15},  # T2Ranking-like exponent
    "joint": PAPER_PARAMS["fang_msmarco_joint"],  # A 8.2e5, alpha 0.57, B 5.2e3, beta 1.39, delta 0.03
}


def _x(law):
    return {"model": N_GRID, "data": D_GRID, "joint": (NJ, DJ)}[law]


def _y(law, params=None):
    p = params or TRUE[law]
    return predict(p, law, N=NJ if law == "joint" else N_GRID, D=DJ if law == "joint" else D_GRID)


def test_law_forms_match_the_papers():
    # Eq. (7): (A/N)^alpha + delta; Eq. (9): [(A/N)^(alpha/beta) + B/D]^beta + delta
    assert power_law(4.54e4, 4.54e4, 0.46, 0.02) == pytest.approx(1.02)
    A, a, B, b, d = 8.2e5, 0.57, 5.2e3, 1.39, 0.03
    N, D = 2e6, 4e4
    assert joint_law(N, D, A, a, B, b, d) == pytest.approx(((A / N) ** (a / b) + B / D) ** b + d, rel=1e-12)
    # ScalingNote Eq. (20) written as [(3.15e5/N)^0.12 + 116/D]^0.770 + 0.108
    sn = PAPER_PARAMS["scalingnote_joint"]
    assert predict(sn, "joint", N=7e9, D=1e6) == pytest.approx(
        ((3.15e5 / 7e9) ** 0.12 + 116 / 1e6) ** 0.770 + 0.108, rel=1e-12
    )
    # no overflow for huge / tiny arguments
    assert np.isfinite(joint_law(1e15, 1e12, 1e7, 2.0, 1e5, 3.0, 0.1))


@pytest.mark.parametrize("law", ["model", "data", "joint"])
def test_exact_recovery_and_r2_on_perfect_data(law):
    res = fit_law(_x(law), _y(law), law)
    assert res.r2 > 1 - 1e-10
    assert res.success
    for k, v in TRUE[law].items():
        assert res.params[k] == pytest.approx(v, rel=1e-4), k
    # predictions reproduce the data
    np.testing.assert_allclose(
        res.predict(N=NJ if law == "joint" else N_GRID, D=DJ if law == "joint" else D_GRID), _y(law), rtol=1e-6
    )


@pytest.mark.parametrize("law", ["model", "data", "joint"])
def test_recovery_from_noisy_data(law):
    rng = np.random.default_rng(7)
    y = _y(law)
    noisy = y + 0.004 * rng.standard_normal(y.size) * y.mean()
    res = fit_law(_x(law), noisy, law)
    assert res.r2 > 0.99
    for k, v in TRUE[law].items():
        se = res.stderr[k]
        assert math.isfinite(se) and se > 0, k
        # within tolerance of the truth, and the reported uncertainty covers the error
        assert abs(res.params[k] - v) <= max(4 * se, 1e-9), (k, res.params[k], v, se)
        tol = 0.6 if k == "delta" else 0.25
        assert res.params[k] == pytest.approx(v, rel=tol), k


def test_robust_loss_resists_an_outlier():
    y = _y("model").copy()
    y[3] *= 1.8  # one broken grid point
    robust = fit_law(N_GRID, y, "model", loss_fn="soft_l1")
    plain = fit_law(N_GRID, y, "model", loss_fn="linear")
    err = lambda r: max(abs(math.log(r.params[k] / TRUE["model"][k])) for k in ("A", "alpha"))  # noqa: E731
    assert err(robust) < 0.05
    assert err(plain) > 2 * err(robust)


@pytest.mark.parametrize("law", ["model", "joint"])
def test_standard_errors_equal_curve_fit_covariance(law):
    """σ²(JᵀJ)⁻¹ in log-parameter space, carried to the natural scale, equals scipy's
    curve_fit covariance in natural parameters at the same optimum."""
    from scipy.optimize import curve_fit

    rng = np.random.default_rng(3)
    y = _y(law) * (1 + 0.01 * rng.standard_normal(_y(law).size))
    res = fit_law(_x(law), y, law, loss_fn="linear")
    names = list(TRUE[law])
    p0 = [res.params[k] for k in names]
    if law == "model":
        f = lambda x, A, a, d: power_law(x, A, a, d)  # noqa: E731
        xdata = N_GRID
    else:
        f = lambda x, A, a, B, b, d: joint_law(x[0], x[1], A, a, B, b, d)  # noqa: E731
        xdata = np.vstack([NJ, DJ])
    popt, pcov = curve_fit(f, xdata, y, p0=p0, x_scale=np.abs(p0), method="trf", xtol=1e-14, ftol=1e-14, gtol=1e-14)
    np.testing.assert_allclose(popt, p0, rtol=1e-4)
    np.testing.assert_allclose([res.stderr[k] for k in names], np.sqrt(np.diag(pcov)), rtol=2e-2)


@pytest.mark.parametrize("law", ["model", "data", "joint"])
def test_analytic_jacobian(law):
    f, jac = _model_fn(law)
    theta = np.log(np.array(list(TRUE[law].values())))
    lx = np.log(NJ if law == "joint" else _x(law))
    lx2 = np.log(DJ) if law == "joint" else None
    J = jac(theta, lx, lx2)
    for i in range(theta.size):
        e = np.zeros_like(theta)
        e[i] = 1e-6
        num = (f(theta + e, lx, lx2) - f(theta - e, lx, lx2)) / 2e-6
        np.testing.assert_allclose(J[:, i], num, rtol=1e-5, atol=1e-9)


def test_log_residuals_fit_relative_errors():
    y = _y("joint") * np.exp(0.01 * np.random.default_rng(0).standard_normal(NJ.size))
    res = fit_law((NJ, DJ), y, "joint", residuals="log")
    assert res.params["beta"] == pytest.approx(1.39, rel=0.1)
    assert res.r2 > 0.99


def test_too_few_points_and_bad_input():
    with pytest.raises(ScalingNoteError, match="at least 5 points"):
        fit_law((NJ[:4], DJ[:4]), _y("joint")[:4], "joint")
    with pytest.raises(ScalingNoteError, match="> 0"):
        fit_law(N_GRID, -_y("model"), "model")
    with pytest.raises(ScalingNoteError, match="N has"):
        fit_law((NJ[:3], DJ), _y("joint"), "joint")
    with pytest.raises(ValueError):
        fit_law(N_GRID, _y("model"), "cubic")
    # exactly p points: a fit, but no uncertainty
    res = fit_law(N_GRID[:3], _y("model")[:3], "model")
    assert all(math.isnan(v) for v in res.stderr.values())
    assert res.to_dict()["stderr"]["A"] is None


def _table(tmp_path, law="joint"):
    rows = [
        {"N": float(n), "D": float(d), "loss": float(v), "layers": i}
        for i, (n, d, v) in enumerate(zip(NJ, DJ, _y("joint"), strict=True))
    ]
    return write_table(tmp_path / "results.csv", rows), rows


def test_table_roundtrip_selection_and_holdout(tmp_path):
    path, rows = _table(tmp_path)
    assert path.read_text().splitlines()[0] == "N,D,loss,layers"
    back = read_table(path, required=("N", "D", "loss"))
    assert [r["loss"] for r in back] == pytest.approx([r["loss"] for r in rows])
    sel, fixed = select_rows(back, "model")
    assert fixed == {"D": max(DJ)} and len(sel) == 5 and all(r["D"] == max(DJ) for r in sel)
    sel, fixed = select_rows(back, "data", at=float(NJ[0]))
    assert fixed == {"N": NJ[0]} and len(sel) == 5
    m = holdout_mask(back, "N", largest=1)
    assert m.sum() == 5 and all(back[i]["N"] == max(NJ) for i in np.flatnonzero(m))
    assert holdout_mask(back, "N", frac=0.2, seed=1).sum() == 5

    res = fit_table(back, "joint", holdout_largest=1)
    assert res.n_fit == 20 and res.holdout["n"] == 5
    assert res.holdout["mae"] < 1e-6  # perfect data extrapolate exactly
    res = fit_table(back, "model")  # rows at the largest D
    assert res.fixed == {"D": max(DJ)}
    # the model law at fixed D is a different function: check it fits its own 5 points
    assert res.r2 > 0.999


def test_table_errors_name_line_and_field(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("N,D,loss\n1e6,100,2.5\n2e6,abc,2.1\n")
    with pytest.raises(DataError) as e:
        read_table(p)
    assert e.value.line == 3 and e.value.field == "D"
    p.write_text("N,D,loss\n1e6,100,-1\n")
    with pytest.raises(DataError, match="> 0"):
        read_table(p)
    p.write_text("N,D\n1e6,100\n")
    with pytest.raises(DataError, match="loss"):
        read_table(p)


def test_read_fit_params(tmp_path):
    import json

    good = tmp_path / "fit.json"
    good.write_text(json.dumps({"law": "joint", **TRUE["joint"], "r2": 0.99}))
    assert read_fit_params(good) == TRUE["joint"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"law": "joint", **{**TRUE["joint"], "beta": "x"}}))
    with pytest.raises(DataError, match="beta"):
        read_fit_params(bad)
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"law": "model", **TRUE["model"]}))
    with pytest.raises(DataError, match="law"):
        read_fit_params(model, "joint")


def test_every_parameter_at_a_bound_is_reported_and_a_real_floor_is_not():
    # a joint law with no irreducible loss: delta runs to its lower bound (1e-12 x the largest loss)
    no_floor = dict(TRUE["joint"], delta=0.0)
    y = joint_law(NJ, DJ, **no_floor)
    res = fit_law((NJ, DJ), y, "joint")
    assert res.at_bound == ["delta"] and res.params["delta"] < 1e-9 * y.min()
    assert res.to_dict()["at_bound"] == ["delta"] and math.isnan(res.stderr["delta"])
    # the same law with its floor: nothing at a bound, and the dict says so (an empty list, not a missing key)
    held = fit_law((NJ, DJ), _y("joint"), "joint")
    assert held.at_bound == [] and held.to_dict()["at_bound"] == []
    assert held.params["delta"] == pytest.approx(TRUE["joint"]["delta"], rel=1e-4)


def test_a_parameter_near_its_bound_counts_as_at_it_only_when_the_predictions_cannot_tell():
    from scalingnote.scaling.fit import params_at_bound

    lo, hi = np.log([1e-12, 1e-3]), np.log([10.0, 20.0])
    x = np.geomspace(1, 100, 5)
    predict = lambda th: x ** -np.exp(th[1]) + np.exp(th[0])  # noqa: E731 - a floor delta and an exponent
    assert params_at_bound(np.log([1e-12, 0.5]), ["delta", "alpha"], lo, hi) == ["delta"]  # on the bound
    assert (
        params_at_bound(np.log([1.2e-12, 0.5]), ["delta", "alpha"], lo, hi) == []
    )  # near it, no predictions to compare
    assert params_at_bound(np.log([1.2e-12, 0.5]), ["delta", "alpha"], lo, hi, predict) == [
        "delta"
    ]  # near it: the same predictions
    assert (
        params_at_bound(np.log([5.0, 0.5]), ["delta", "alpha"], lo, hi, predict) == []
    )  # a real floor, half the upper bound
