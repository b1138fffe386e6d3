"""Budget planner (Fang et al. §6, Eq. 12-15): cost factors and the optimum vs brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.scaling.budget import CostModel, loss_along_budget, plan_both, plan_budget
from scalingnote.scaling.laws import PAPER_PARAMS, joint_law

P = PAPER_PARAMS["fang_msmarco_joint"]


def test_default_cost_factors_are_eq_13_to_15():
    c = CostModel()
    assert c.Z_data == 0.6  # Eq. (13)
    assert c.Z_train == pytest.approx(3.22e-8, rel=2e-3)  # Eq. (14)
    assert c.Z_infer == pytest.approx(0.43, rel=1e-2)  # Eq. (15)
    assert c.Z_train_pair == 0.0
    # Eq. (12)
    assert float(c.cost(1e6, 1e4)) == pytest.approx(0.6 * 1e4 + (c.Z_train + c.Z_infer) * 1e6)
    assert float(c.cost(1e6, 1e4, include_inference=False)) == pytest.approx(0.6 * 1e4 + c.Z_train * 1e6)


def test_cost_extensions():
    base = CostModel()
    withq = CostModel(query_volume=1e12)
    # 2N FLOPs per query token on top of the corpus encoding
    assert withq.Z_infer - base.Z_infer == pytest.approx(1e12 * 30 * 2 * base.dollars_per_flop)
    ep = CostModel(train_mode="epochs", train_epochs=3)
    assert ep.Z_train == 0.0
    assert ep.Z_train_pair == pytest.approx(3 * (30 + 120) * 6 * base.dollars_per_flop)
    assert float(ep.cost(1e6, 1e4, include_inference=False)) == pytest.approx(0.6 * 1e4 + ep.Z_train_pair * 1e6 * 1e4)
    assert CostModel(z_infer=0.1).Z_infer == 0.1
    with pytest.raises(ValueError):
        CostModel(utilization=0)


def _brute_force(params, budget, costs, include_inference):
    """Search a dense (N, D) grid of affordable points, then finer grids around the best one."""
    lo_n, hi_n, lo_d, hi_d = math.log(1e4), math.log(1e13), 0.0, math.log(1e10)
    for n in (1500, 400, 400):
        Ns = np.exp(np.linspace(lo_n, hi_n, n))
        Ds = np.exp(np.linspace(lo_d, hi_d, n))
        NN, DD = np.meshgrid(Ns, Ds, indexing="ij")
        ok = costs.cost(NN, DD, include_inference) <= budget
        L = np.where(ok, joint_law(NN, DD, **params), np.inf)
        i, j = np.unravel_index(np.argmin(L), L.shape)
        sn, sd = (hi_n - lo_n) / (n - 1), (hi_d - lo_d) / (n - 1)
        lo_n, hi_n = math.log(Ns[i]) - 20 * sn, math.log(Ns[i]) + 20 * sn
        lo_d, hi_d = math.log(Ds[j]) - 20 * sd, math.log(Ds[j]) + 20 * sd
    return Ns[i], Ds[j], L[i, j]


@pytest.mark.parametrize(
    "costs",
    [CostModel(), CostModel(query_volume=1e13), CostModel(train_mode="epochs", train_epochs=2, corpus_size=1e7)],
    ids=["paper", "query-volume", "epochs"],
)
@pytest.mark.parametrize("budget", [1e4, 1e6])
@pytest.mark.parametrize("include_inference", [False, True])
def test_optimum_agrees_with_brute_force(costs, budget, include_inference):
    plan = plan_budget(P, budget, costs, include_inference=include_inference)
    bN, bD, bL = _brute_force(P, budget, costs, include_inference)
    # the planner is at least as good as any affordable grid point, and close to the grid optimum
    assert plan.loss <= bL + 1e-12
    assert plan.loss == pytest.approx(bL, rel=1e-3)
    assert abs(math.log(plan.N / bN)) < 0.3  # the loss is flat near the optimum: N is less sharp
    # it spends the budget and its loss is the law at (N, D)
    assert plan.cost == pytest.approx(budget, rel=1e-9)
    assert float(costs.cost(plan.N, plan.D, include_inference)) == pytest.approx(budget, rel=1e-9)
    assert plan.loss == pytest.approx(float(joint_law(plan.N, plan.D, **P)), rel=1e-12)


def test_paper_findings_reproduced():
    """Fig. 7/8: without inference cost the optimal model grows past 1e10 parameters;
    counting the corpus encoding it stays at million scale."""
    small, big = plan_both(P, 1e4), plan_both(P, 1e6)
    assert big["without_inference"].N > small["without_inference"].N
    assert big["without_inference"].N > 1e10
    assert big["with_inference"].N < 1e8
    assert big["with_inference"].loss > big["without_inference"].loss


def test_bound_and_infeasible():
    plan = plan_budget(P, 1e7, CostModel(), include_inference=False, n_range=(1e4, 1e8))
    assert plan.at_bound and plan.N == pytest.approx(1e8, rel=1e-6)
    with pytest.raises(ScalingNoteError, match="cannot pay"):
        plan_budget(P, 1.0, CostModel(), n_range=(1e6, 1e8))
    with pytest.raises(ScalingNoteError, match="joint"):
        plan_budget({"A": 1.0, "alpha": 0.5, "delta": 0.1}, 1e4)
    L = loss_along_budget(P, 1e3, CostModel(), np.array([1e3, 1e9]))
    assert np.isfinite(L[0]) and np.isinf(L[1])


def test_the_plan_names_its_law_and_whether_it_has_a_floor():
    from scalingnote.scaling.fit import fit_law

    NJ, DJ = (a.ravel() for a in np.meshgrid(np.geomspace(5e5, 1e8, 5), np.geomspace(1e3, 5e5, 5)))
    p = PAPER_PARAMS["fang_msmarco_joint"]
    with_floor = fit_law((NJ, DJ), joint_law(NJ, DJ, **p), "joint")
    no_floor = fit_law((NJ, DJ), joint_law(NJ, DJ, **dict(p, delta=0.0)), "joint")
    a, b = plan_budget(with_floor, 1e5), plan_budget(no_floor, 1e5)
    assert a.has_floor and a.floor == pytest.approx(p["delta"], rel=1e-4) and a.law.startswith("joint L(N, D)")
    assert "floor (irreducible loss) 0.03" in a.describe()
    assert not b.has_floor and b.floor is None and "no floor" in b.describe()
    assert b.to_dict()["has_floor"] is False and a.to_dict()["floor"] == a.floor
    # parameters without a record of the fit's bounds: the floor is the delta they give
    assert plan_budget(dict(p), 1e5).floor == p["delta"]
    assert plan_budget({**p, "at_bound": ["delta"]}, 1e5).floor is None
