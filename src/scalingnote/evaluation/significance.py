"""Paired significance between two systems on a per-query (or per-seed) metric.

* :func:`paired_ttest` — two-sided paired t-test (:func:`scipy.stats.ttest_rel`), the
  test ScalingNote reports (Table 3: "two-sided t-test with p < 0.05").
* :func:`paired_bootstrap` — seeded percentile bootstrap confidence interval of the mean
  difference (:func:`scipy.stats.bootstrap` over the paired differences) and the
  matching two-sided bootstrap p-value.
* :func:`compare_runs` — both, for two runs on the same qrels and metric.
* :func:`ratio_interval` — seeded percentile bootstrap interval of ``mean(a) / mean(b)`` over the
  same queries (a student's retention of its teacher, read with how far its queries let it be known).

Differences are always ``a - b``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from scalingnote.data.types import Qrels, Run
from scalingnote.errors import ScalingNoteError
from scalingnote.evaluation.metrics import Missing, parse_metric, per_query


def _paired(a, b) -> tuple[np.ndarray, np.ndarray]:
    """Align two per-query mappings (same keys required) or two equal-length sequences."""
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
            raise ScalingNoteError("give two mappings or two sequences, not one of each")
        if a.keys() != b.keys():
            only_a, only_b = len(a.keys() - b.keys()), len(b.keys() - a.keys())
            raise ScalingNoteError(
                f"paired test needs the same queries on both sides: {only_a} only in a, {only_b} only in b"
            )
        keys = sorted(a)
        x = np.asarray([a[k] for k in keys], dtype=np.float64)
        y = np.asarray([b[k] for k in keys], dtype=np.float64)
    else:
        x = np.asarray(a, dtype=np.float64)
        y = np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ScalingNoteError(f"paired samples must be 1-D and the same length, got {x.shape} and {y.shape}")
    if len(x) < 2:
        raise ScalingNoteError(f"paired test needs at least 2 pairs, got {len(x)}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ScalingNoteError("paired samples must be finite")
    return x, y


@dataclass(frozen=True)
class TTestResult:
    statistic: float
    pvalue: float
    n: int
    mean_diff: float


def paired_ttest(a: Mapping[str, float] | Sequence[float], b: Mapping[str, float] | Sequence[float]) -> TTestResult:
    """Two-sided paired t-test of ``a`` vs ``b`` (scipy ``ttest_rel``).

    Identical samples (all differences 0) give statistic 0 and p = 1 instead of scipy's NaN.
    """
    x, y = _paired(a, b)
    d = x - y
    if not d.any():
        return TTestResult(0.0, 1.0, len(d), 0.0)
    from scipy import stats  # lazy: scipy.stats takes ~0.5 s to import

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # constant non-zero differences: t = ±inf, p = 0
        res = stats.ttest_rel(x, y)
    return TTestResult(float(res.statistic), float(res.pvalue), len(d), float(d.mean()))


def separates(
    challenger: Mapping[str, float] | Sequence[float],
    default: Mapping[str, float] | Sequence[float],
    alpha: float = 0.05,
) -> tuple[bool, TTestResult]:
    """The rule a choice between two candidates follows: the ``challenger`` replaces the
    pre-declared ``default`` only when its per-query scores are higher on average **and** a two-sided
    paired t-test over the same queries gives p < ``alpha``; otherwise the evidence does not
    separate them and the default stays. Returns (challenger wins, the test)."""
    t = paired_ttest(challenger, default)
    return bool(t.mean_diff > 0 and t.pvalue < alpha), t


@dataclass(frozen=True)
class BootstrapResult:
    mean_diff: float
    low: float
    high: float
    confidence: float
    pvalue: float
    n: int
    n_resamples: int
    seed: int


def paired_bootstrap(
    a: Mapping[str, float] | Sequence[float],
    b: Mapping[str, float] | Sequence[float],
    *,
    n_resamples: int = 10000,
    confidence: float = 0.95,
    seed: int = 0,
) -> BootstrapResult:
    """Percentile bootstrap CI of mean(a - b), resampling queries (pairs) with replacement.

    ``pvalue`` is two-sided: ``2 * min(#{d* <= 0}, #{d* >= 0}) + 1`` over ``n_resamples + 1``
    (capped at 1), where ``d*`` are the resampled mean differences. Deterministic for a seed.
    """
    if not 0 < confidence < 1:
        raise ScalingNoteError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ScalingNoteError(f"n_resamples must be >= 1, got {n_resamples}")
    x, y = _paired(a, b)
    d = x - y
    mean = float(d.mean())
    if np.ptp(d) == 0:  # every resample has the same mean
        dist = np.full(n_resamples, mean)
        low = high = mean
    else:
        from scipy import stats  # lazy: scipy.stats takes ~0.5 s to import

        res = stats.bootstrap(
            (d,),
            np.mean,
            n_resamples=n_resamples,
            confidence_level=confidence,
            method="percentile",
            vectorized=True,
            rng=np.random.default_rng(seed),
        )
        dist = res.bootstrap_distribution
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    tail = min(int((dist <= 0).sum()), int((dist >= 0).sum()))
    pvalue = min(1.0, (2 * tail + 1) / (n_resamples + 1))
    return BootstrapResult(mean, low, high, confidence, pvalue, len(d), n_resamples, seed)


def ratio_interval(
    a: Mapping[str, float] | Sequence[float],
    b: Mapping[str, float] | Sequence[float],
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(ratio, low, high)``: ``mean(a) / mean(b)`` and its percentile bootstrap interval, resampling
    the queries (pairs) with replacement (:func:`scipy.stats.bootstrap`, ``paired=True``);
    deterministic for a seed. ``b`` must have a positive mean; a resample whose ``b`` is all zero has
    no ratio and is left out (few queries, most of them scored 0); when more than 5% of them are, the
    interval is NaN (not known)."""
    x, y = _paired(a, b)
    if y.mean() <= 0:
        raise ScalingNoteError(f"ratio_interval: the denominator's mean must be positive, got {y.mean():.4g}")
    ratio = float(x.mean() / y.mean())
    if np.ptp(x) == 0 and np.ptp(y) == 0:  # every resample gives the same ratio
        return ratio, ratio, ratio
    from scipy import stats  # lazy: scipy.stats takes ~0.5 s to import

    def _ratio(u: np.ndarray, v: np.ndarray, axis: int = -1) -> np.ndarray:
        den = v.mean(axis=axis)
        return u.mean(axis=axis) / np.where(den > 0, den, np.nan)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns of the NaN resamples handled below
        res = stats.bootstrap(
            (x, y),
            _ratio,
            paired=True,
            n_resamples=n_resamples,
            confidence_level=confidence,
            method="percentile",
            vectorized=True,
            rng=np.random.default_rng(seed),
        )
    dist = np.asarray(res.bootstrap_distribution, dtype=np.float64)
    if np.isnan(dist).mean() > 0.05:
        return ratio, float("nan"), float("nan")
    tail = 100 * (1 - confidence) / 2
    low, high = np.nanpercentile(dist, [tail, 100 - tail])
    return ratio, float(low), float(high)


@dataclass(frozen=True)
class Comparison:
    """Two runs on one metric: means, t-test and bootstrap CI of ``a - b``."""

    metric: str
    n: int
    mean_a: float
    mean_b: float
    ttest: TTestResult
    bootstrap: BootstrapResult

    def to_dict(self) -> dict:
        """Flat dict (for JSON / benchmark rows)."""
        return {
            "metric": self.metric,
            "n": self.n,
            "mean_a": self.mean_a,
            "mean_b": self.mean_b,
            "mean_diff": self.ttest.mean_diff,
            "t_statistic": self.ttest.statistic,
            "t_pvalue": self.ttest.pvalue,
            "ci_low": self.bootstrap.low,
            "ci_high": self.bootstrap.high,
            "confidence": self.bootstrap.confidence,
            "bootstrap_pvalue": self.bootstrap.pvalue,
            "n_resamples": self.bootstrap.n_resamples,
            "seed": self.bootstrap.seed,
        }


def compare_runs(
    run_a: Run,
    run_b: Run,
    qrels: Qrels,
    metric: str = "ndcg@10",
    *,
    relevance_level: int = 1,
    missing: Missing = "zero",
    n_resamples: int = 10000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Comparison:
    """Paired comparison of two runs on a per-query ``metric`` over the same queries.

    ``missing="zero"`` (the default here) scores a qrels query absent from a run as 0, so
    both runs are compared on every query with a relevant document; with ``"ignore"``
    both runs must cover the same queries.
    """
    spec = parse_metric(metric)
    if not spec.per_query:
        raise ScalingNoteError(f"{spec.name} is not a per-query metric; pick e.g. ndcg@10")
    pa = per_query(run_a, qrels, [spec.name], relevance_level=relevance_level, missing=missing)
    pb = per_query(run_b, qrels, [spec.name], relevance_level=relevance_level, missing=missing)
    a = {q: v[spec.name] for q, v in pa.items()}
    b = {q: v[spec.name] for q, v in pb.items()}
    t = paired_ttest(a, b)
    boot = paired_bootstrap(a, b, n_resamples=n_resamples, confidence=confidence, seed=seed)
    return Comparison(spec.name, t.n, float(np.mean(list(a.values()))), float(np.mean(list(b.values()))), t, boot)


__all__ = [
    "separates",
    "BootstrapResult",
    "Comparison",
    "TTestResult",
    "compare_runs",
    "paired_bootstrap",
    "paired_ttest",
    "ratio_interval",
]
