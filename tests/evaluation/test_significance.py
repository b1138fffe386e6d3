"""Paired t-test and paired bootstrap between two systems."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from scalingnote.data import load_qrels
from scalingnote.errors import ScalingNoteError
from scalingnote.evaluation import TTestResult, compare_runs, evaluate, paired_bootstrap, paired_ttest


def test_ttest_hand_computed():
    a = [1.0, 2.0, 3.0, 4.0]
    b = [0.0, 2.0, 1.0, 3.0]
    # d = [1, 0, 2, 1]: mean 1, sample sd sqrt(2/3), t = 1 / (sd / sqrt(4)) = sqrt(6)
    r = paired_ttest(a, b)
    assert r.statistic == pytest.approx(math.sqrt(6))
    assert r.mean_diff == pytest.approx(1.0) and r.n == 4
    assert r.pvalue == pytest.approx(2 * stats.t.sf(math.sqrt(6), df=3))
    assert r.pvalue == pytest.approx(0.0917, abs=1e-4)
    # antisymmetric
    assert paired_ttest(b, a).statistic == pytest.approx(-math.sqrt(6))


def test_ttest_degenerate_and_alignment():
    assert paired_ttest([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == TTestResult(0.0, 1.0, 3, 0.0)
    const = paired_ttest([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])
    assert const.pvalue == 0.0 and const.statistic == math.inf
    # mappings are aligned by key, not by insertion order
    a = {"x": 1.0, "y": 5.0, "z": 2.0}
    b = {"z": 2.5, "x": 0.0, "y": 4.0}
    assert paired_ttest(a, b).statistic == pytest.approx(stats.ttest_rel([1, 5, 2], [0, 4, 2.5]).statistic)
    with pytest.raises(ScalingNoteError, match="same queries"):
        paired_ttest({"x": 1.0, "y": 2.0}, {"x": 1.0, "z": 2.0})
    with pytest.raises(ScalingNoteError, match="same length"):
        paired_ttest([1.0, 2.0], [1.0])
    with pytest.raises(ScalingNoteError, match="at least 2"):
        paired_ttest([1.0], [1.0])


def test_bootstrap_known_cases():
    # identical systems: CI is exactly [0, 0] and p = 1
    same = paired_bootstrap([0.1, 0.5, 0.9], [0.1, 0.5, 0.9], n_resamples=500)
    assert (same.mean_diff, same.low, same.high, same.pvalue) == (0.0, 0.0, 0.0, 1.0)
    # a constant improvement: CI collapses on it and p is the smallest reachable value
    const = paired_bootstrap([1.0, 2.0, 3.0], [0.5, 1.5, 2.5], n_resamples=999)
    assert const.low == const.high == pytest.approx(0.5)
    assert const.pvalue == pytest.approx(1 / 1000)


def test_bootstrap_matches_normal_theory_and_is_seeded():
    rng = np.random.default_rng(0)
    d = rng.normal(0.3, 1.0, size=400)
    b = rng.uniform(size=400)
    a = b + d
    r = paired_bootstrap(a, b, n_resamples=4000, seed=3)
    assert r == paired_bootstrap(a, b, n_resamples=4000, seed=3)
    assert r != paired_bootstrap(a, b, n_resamples=4000, seed=4)
    se = d.std(ddof=1) / math.sqrt(len(d))
    assert r.mean_diff == pytest.approx(d.mean())
    assert r.low == pytest.approx(d.mean() - 1.96 * se, abs=0.2 * se)
    assert r.high == pytest.approx(d.mean() + 1.96 * se, abs=0.2 * se)
    assert r.pvalue < 0.01
    # no real difference: wide p, interval covers 0
    null = paired_bootstrap(b + rng.normal(0, 1, 400) * 1e-3, b, n_resamples=2000)
    assert null.low < 0 < null.high and null.pvalue > 0.05
    with pytest.raises(ScalingNoteError):
        paired_bootstrap(a, b, confidence=1.5)


def _noisy_run(qrels, noise, seed, n_random=200):
    rng = np.random.default_rng(seed)
    docs = sorted({d for j in qrels.values() for d in j})
    run = {}
    for q, judged in qrels.items():
        cand = set(rng.choice(docs, size=min(n_random, len(docs)), replace=False).tolist()) | set(judged)
        run[q] = {d: (1.0 if judged.get(d, 0) > 0 else 0.0) + rng.normal(scale=noise) for d in cand}
    return run


@pytest.mark.shared_data
def test_compare_runs_on_scifact(shared_data):
    qrels = load_qrels(shared_data / "scifact" / "qrels" / "test.tsv")
    good = _noisy_run(qrels, 0.3, seed=0)
    bad = _noisy_run(qrels, 1.5, seed=1)
    c = compare_runs(good, bad, qrels, "ndcg@10", n_resamples=2000)
    assert c.n == 300
    assert c.mean_a == pytest.approx(evaluate(good, qrels, ["ndcg@10"])["ndcg@10"])
    assert c.mean_a > c.mean_b and c.ttest.pvalue < 1e-6 and c.bootstrap.low > 0
    flat = c.to_dict()
    assert flat["metric"] == "ndcg@10" and all(not isinstance(v, (dict, list)) for v in flat.values())
    same = compare_runs(good, good, qrels, "r@100", n_resamples=200)
    assert same.ttest.pvalue == 1.0 and same.bootstrap.pvalue == 1.0
    # a run missing queries: scored 0 by default, refused with missing="ignore"
    partial = {q: v for i, (q, v) in enumerate(good.items()) if i % 2}
    assert compare_runs(good, partial, qrels, "mrr@10", n_resamples=200).n == 300
    with pytest.raises(ScalingNoteError, match="same queries"):
        compare_runs(good, partial, qrels, "mrr@10", missing="ignore")
    with pytest.raises(ScalingNoteError, match="not a per-query"):
        compare_runs(good, bad, qrels, "auc")


def test_ratio_interval_of_a_retention():
    from scalingnote.evaluation import ratio_interval

    rng = np.random.default_rng(0)
    teacher = rng.uniform(0, 1, 62)
    student = np.clip(teacher - rng.normal(0.03, 0.15, 62), 0, 1)
    ratio, lo, hi = ratio_interval(list(student), list(teacher), seed=3)
    assert ratio == pytest.approx(student.mean() / teacher.mean())
    assert lo < ratio < hi and hi - lo > 0.05  # 62 queries know a retention to a few points, no better
    assert ratio_interval(list(student), list(teacher), seed=3) == (ratio, lo, hi)  # seeded
    # four times the queries (the same draws repeated): a narrower interval around the same ratio
    r4, lo4, hi4 = ratio_interval(list(np.tile(student, 4)), list(np.tile(teacher, 4)), seed=3)
    assert r4 == pytest.approx(ratio) and hi4 - lo4 < 0.7 * (hi - lo)
    # keyed by query: aligned by key, not by order
    a = {f"q{i}": float(v) for i, v in enumerate(student)}
    b = dict(reversed([(f"q{i}", float(v)) for i, v in enumerate(teacher)]))
    assert ratio_interval(a, b, seed=3)[0] == pytest.approx(ratio)
    assert ratio_interval([0.5, 0.5], [1.0, 1.0]) == (0.5, 0.5, 0.5)
    with pytest.raises(ScalingNoteError, match="denominator"):
        ratio_interval([0.5, 0.5], [0.0, 0.0])


def test_ratio_interval_leaves_out_resamples_without_a_ratio():
    from scalingnote.evaluation import ratio_interval

    # one query in four has a teacher score: some resamples have none (no ratio) and are left out
    r, lo, hi = ratio_interval([0.5, 0.0, 0.0, 0.0] * 3, [1.0, 0.0, 0.0, 0.0] * 3, seed=1)  # 3% of resamples
    assert r == 0.5 and lo == hi == 0.5
    # most resamples without one: the interval is not known
    r, lo, hi = ratio_interval([0.5, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], seed=1)
    assert r == 0.5 and math.isnan(lo) and math.isnan(hi)
