"""AUC over labelled pairs (ScalingNote §4.1.2 AUC-SAT / AUC-REL)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from scalingnote.data import load_qrels
from scalingnote.errors import ScalingNoteError
from scalingnote.evaluation import evaluate, judged_pairs, pair_auc, run_auc


def brute_auc(scores, labels):
    """P(score of a random positive > score of a random negative), ties 1/2 — by enumeration."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_global_auc_hand_computed():
    # positives 0.9, 0.4; negatives 0.5, 0.1 -> pairs: (0.9>0.5) (0.9>0.1) (0.4<0.5) (0.4>0.1) = 3/4
    assert pair_auc([0.9, 0.5, 0.4, 0.1], [1, 0, 1, 0]) == pytest.approx(0.75)
    # a tie counts one half: positive 0.5 vs negative 0.5
    assert pair_auc([0.5, 0.5, 0.2], [1, 0, 0]) == pytest.approx((0.5 + 1) / 2)


def test_graded_labels_and_threshold():
    scores = [3.0, 2.0, 1.0, 0.0]
    grades = [1, 3, 0, 2]
    # threshold 1: positives {3.0, 2.0, 0.0} vs negative {1.0}: 2 of 3 above
    assert pair_auc(scores, grades) == pytest.approx(2 / 3)
    # threshold 2: positives {2.0, 0.0} vs negatives {3.0, 1.0}: only 2.0 > 1.0 -> 1/4
    assert pair_auc(scores, grades, threshold=2) == pytest.approx(1 / 4)


def test_per_query_average():
    qids = ["a", "a", "a", "b", "b", "c"]
    scores = [0.9, 0.1, 0.5, 0.2, 0.8, 0.3]
    labels = [1, 0, 0, 1, 0, 1]  # a: AUC 1.0, b: AUC 0.0, c: single class -> skipped
    assert pair_auc(scores, labels, qids, average="query") == pytest.approx(0.5)
    assert pair_auc(scores, labels) == pytest.approx(brute_auc(scores, labels))


def test_random_matches_enumeration():
    rng = np.random.default_rng(0)
    s = np.round(rng.normal(size=80), 1)  # ties
    y = rng.integers(0, 2, size=80)
    assert pair_auc(s, y) == pytest.approx(brute_auc(s.tolist(), y.tolist()), abs=1e-12)


def test_errors():
    with pytest.raises(ScalingNoteError, match="same label"):
        pair_auc([1.0, 2.0], [1, 1])
    with pytest.raises(ScalingNoteError, match="same length"):
        pair_auc([1.0, 2.0], [1])
    with pytest.raises(ScalingNoteError, match="no query has both"):
        pair_auc([1.0, 2.0], [1, 0], ["a", "b"], average="query")
    with pytest.raises(ScalingNoteError, match="finite"):
        pair_auc([1.0, float("nan")], [1, 0])


def test_run_auc_uses_every_judged_pair():
    qrels = {"q1": {"a": 1, "b": 0}, "q2": {"c": 0, "d": 0}, "q3": {"e": 1}}
    run = {"q1": {"a": 2.0, "b": 3.0}, "q2": {"c": 1.0}, "q3": {"e": 0.5, "x": 9.0}}
    qids, dids, scores, grades = judged_pairs(run, qrels)
    assert list(zip(qids, dids, strict=True)) == [("q1", "a"), ("q1", "b"), ("q2", "c"), ("q2", "d"), ("q3", "e")]
    floor = 0.5 - 1.0  # d was not scored: ranks below everything
    assert scores.tolist() == [2.0, 3.0, 1.0, floor, 0.5]
    # positives a(2.0), e(0.5); negatives b(3.0), c(1.0), d(floor)
    expected = brute_auc([2.0, 0.5, 3.0, 1.0, floor], [1, 1, 0, 0, 0])
    assert run_auc(run, qrels) == pytest.approx(expected)
    assert evaluate(run, qrels, ["auc", "qauc"]) == pytest.approx({"auc": expected, "qauc": 0.0})


@pytest.mark.shared_data
def test_kuake_graded_auc(shared_data):
    """AUC-REL-style evaluation on KUAKE-QTR graded labels: a score correlated with the grade
    gives AUC well above 0.5, a random one about 0.5, and global == enumeration."""
    qrels = load_qrels(shared_data / "kuake_qtr" / "qrels_graded" / "test.tsv")
    rng = np.random.default_rng(0)
    informative = {q: {d: g + rng.normal(scale=1.5) for d, g in j.items()} for q, j in qrels.items()}
    noise = {q: {d: rng.normal() for d in j} for q, j in qrels.items()}
    good = run_auc(informative, qrels, relevance_level=2)
    assert 0.75 < good < 1.0
    assert run_auc(noise, qrels, relevance_level=2) == pytest.approx(0.5, abs=0.03)
    assert 0.6 < run_auc(informative, qrels, relevance_level=2, average="query") <= 1.0
