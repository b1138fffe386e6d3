"""The scaling-law functional forms (pure functions, NumPy).

- model size, Fang et al. *Scaling Laws for Dense Retrieval* Eq. (7) / ScalingNote Eq. (18)::

      L(N) = (A / N)^α + δ

- data size, Fang et al. Eq. (8) / ScalingNote Eq. (19)::

      L(D) = (B / D)^β + δ

- joint, Fang et al. Eq. (9) (Kaplan et al. form) / ScalingNote Eq. (20)::

      L(N, D) = [ (A / N)^(α/β) + B / D ]^β + δ

``N`` is the number of non-embedding parameters, ``D`` the number of annotated
(query, positive passage) training pairs and ``L`` the contrastive perplexity on a fixed
validation set (§3.5, Eq. 6). ScalingNote's Eq. (20) writes the joint law as
``[(A/N)^a + B/D]^b + δ``; with ``a = α/β`` and ``b = β`` it is the same function
(``α = a·b``).

Everything is evaluated in log space (``(A/N)^α = exp(α (log A − log N))``,
``log((A/N)^(α/β) + B/D)`` by ``logaddexp``) so that parameters spanning many orders of
magnitude (A ≈ 1e5–1e7) neither overflow nor lose precision.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Law = Literal["model", "data", "joint"]
LAWS: tuple[str, ...] = ("model", "data", "joint")

#: Parameter names per law, in the order used by the fitter.
PARAM_NAMES: dict[str, tuple[str, ...]] = {
    "model": ("A", "alpha", "delta"),
    "data": ("B", "beta", "delta"),
    "joint": ("A", "alpha", "B", "beta", "delta"),
}

#: The variable(s) each law depends on (column names of a results table).
LAW_VARIABLES: dict[str, tuple[str, ...]] = {"model": ("N",), "data": ("D",), "joint": ("N", "D")}

#: Published fits, for reference and tests.
PAPER_PARAMS: dict[str, dict[str, float]] = {
    # Fang et al. Table 1 / Table 2 (MSMARCO) and Eq. (10)-(11)
    "fang_msmarco_model": {"A": 4.54e4, "alpha": 0.46, "delta": 0.02},
    "fang_msmarco_data": {"B": 2.37e-2, "beta": 0.19, "delta": 0.01},
    "fang_msmarco_joint": {"A": 8.2e5, "alpha": 0.57, "B": 5.2e3, "beta": 1.39, "delta": 0.03},
    # ScalingNote Eq. (18)-(20) (Eq. 20 converted: alpha = 0.12 * 0.770)
    "scalingnote_model": {"A": 3.82e5, "alpha": 0.14, "delta": 0.18},
    "scalingnote_data": {"B": 2.60e3, "beta": 0.14, "delta": 1.4e-7},
    "scalingnote_joint": {"A": 3.15e5, "alpha": 0.12 * 0.770, "B": 1.16e2, "beta": 0.770, "delta": 0.108},
}


def check_law(law: str) -> str:
    if law not in LAWS:
        raise ValueError(f"law must be one of {list(LAWS)}, got {law!r}")
    return law


def power_law(x, C: float, exponent: float, delta: float) -> np.ndarray:
    """``(C / x)^exponent + delta`` — Eq. (7) with (C, exponent) = (A, α), Eq. (8) with (B, β)."""
    x = np.asarray(x, dtype=np.float64)
    return np.exp(exponent * (np.log(C) - np.log(x))) + delta


def joint_law(N, D, A: float, alpha: float, B: float, beta: float, delta: float) -> np.ndarray:
    """``[(A/N)^(α/β) + B/D]^β + δ`` — Fang et al. Eq. (9)."""
    N = np.asarray(N, dtype=np.float64)
    D = np.asarray(D, dtype=np.float64)
    return _joint_log(np.log(N), np.log(D), np.log(A), alpha, np.log(B), beta, delta)


def _joint_log(logN, logD, logA, alpha, logB, beta, delta):
    inner = np.logaddexp((alpha / beta) * (logA - logN), logB - logD)
    return np.exp(beta * inner) + delta


def predict(params: dict[str, float], law: str, N=None, D=None) -> np.ndarray:
    """Predicted loss of ``law`` with ``params`` (names as in :data:`PARAM_NAMES`)."""
    check_law(law)
    missing = [p for p in PARAM_NAMES[law] if p not in params]
    if missing:
        raise ValueError(f"law {law!r} needs parameters {list(PARAM_NAMES[law])}; missing {missing}")
    if law == "model":
        if N is None:
            raise ValueError("the model-size law needs N")
        return power_law(N, params["A"], params["alpha"], params["delta"])
    if law == "data":
        if D is None:
            raise ValueError("the data-size law needs D")
        return power_law(D, params["B"], params["beta"], params["delta"])
    if N is None or D is None:
        raise ValueError("the joint law needs N and D")
    return joint_law(N, D, params["A"], params["alpha"], params["B"], params["beta"], params["delta"])


__all__ = [
    "LAWS",
    "LAW_VARIABLES",
    "PAPER_PARAMS",
    "PARAM_NAMES",
    "Law",
    "check_law",
    "joint_law",
    "power_law",
    "predict",
]
