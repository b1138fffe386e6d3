"""Algorithm 1 (query association matching) and its inverted-index blocking."""

from __future__ import annotations

import random

import pytest

from scalingnote.data.association import (
    all_above,
    associate_scores,
    find_associations,
    find_associations_bruteforce,
    match_queries,
    top_terms,
)

TH_CLICK, TH_REL = 0.5, 0.4


def test_top_terms_orders_by_score_then_term():
    s = {"b": 0.9, "a": 0.9, "c": 1.0, "d": 0.1, "e": 0.5}
    assert top_terms(s, 2) == ["c", "a"]
    assert top_terms(s, 4) == ["c", "a", "b", "e"]
    assert top_terms({"x": 1.0}, 4) == ["x"]  # fewer terms than k: all of them


def test_all_above_is_strict_and_missing_terms_score_zero():
    assert all_above(["a"], {"a": 0.51}, 0.5)
    assert not all_above(["a"], {"a": 0.5}, 0.5)  # strict >
    assert not all_above(["a", "b"], {"a": 0.9}, 0.0)  # absent term scores 0, not > 0
    assert not all_above([], {"a": 1.0}, 0.0)  # empty term list never associates


def test_click_association_is_directional():
    # q1's top-2 {apple, pie} are both important in q2; q2's top-2 {recipe, apple} are not both in q1.
    s1 = {"apple": 1.0, "pie": 0.8, "easy": 0.2}
    s2 = {"recipe": 1.0, "apple": 0.9, "pie": 0.7, "crust": 0.3}
    a = associate_scores(s1, s2, TH_CLICK, TH_REL)
    assert a.click_1_from_2 is True  # ClickA_{q1<-q2}
    assert a.click_2_from_1 is False  # 'recipe' absent from q1
    b = associate_scores(s2, s1, TH_CLICK, TH_REL)
    assert (b.click_1_from_2, b.click_2_from_1) == (False, True)


def test_click_threshold_is_strict():
    s1 = {"apple": 1.0, "pie": 0.8}
    at = {"apple": 1.0, "pie": TH_CLICK}  # exactly the threshold: not above
    above = {"apple": 1.0, "pie": TH_CLICK + 1e-9}
    assert associate_scores(s1, at, TH_CLICK, TH_REL).click_1_from_2 is False
    assert associate_scores(s1, above, TH_CLICK, TH_REL).click_1_from_2 is True


def test_relevance_association_uses_top4_both_ways_with_th_rel():
    s1 = {"a": 1.0, "b": 0.9, "c": 0.8, "d": 0.7, "zz": 0.01}  # 5th term ignored by Top4
    s2 = {"a": 0.9, "b": 1.0, "c": 0.6, "d": 0.45, "yy": 0.05}
    a = associate_scores(s1, s2, TH_CLICK, TH_REL)
    assert a.rel is True  # Top4(S1) all > 0.4 in S2 and Top4(S2) = {b,a,c,d} all > 0.4 in S1
    # lower one of q1's top-4 terms in q2 to exactly th_rel: strict > fails
    s2b = dict(s2, d=TH_REL)
    assert associate_scores(s1, s2b, TH_CLICK, TH_REL).rel is False
    # q2's own top-4 includes a term q1 lacks -> not related (both directions required)
    s2c = {"a": 0.9, "b": 1.0, "c": 0.6, "d": 0.45, "new": 0.95}
    a3 = associate_scores(s1, s2c, TH_CLICK, TH_REL)
    assert a3.rel is False
    assert a3.click_1_from_2 is True  # click association only needs q1's top-2


def test_th_click_and_th_rel_are_separate():
    s1 = {"a": 1.0, "b": 0.9}
    s2 = {"a": 1.0, "b": 0.45}
    a = associate_scores(s1, s2, th_click=0.5, th_rel=0.4)
    assert a.click_1_from_2 is False and a.rel is True
    a = associate_scores(s1, s2, th_click=0.4, th_rel=0.5)
    assert a.click_1_from_2 is True and a.rel is False


def test_match_queries_with_a_dict_planner():
    table = {
        "cheap flights paris": {"paris": 1.0, "flights": 0.9, "cheap": 0.3},
        "paris flights deals": {"paris": 1.0, "flights": 0.8, "deals": 0.95},
    }
    a = match_queries("cheap flights paris", "paris flights deals", table.__getitem__, TH_CLICK, TH_REL)
    assert a.click_1_from_2 and not a.click_2_from_1  # q2's top-2 has 'deals', absent from q1
    assert not a.rel


def _random_scores(n: int, vocab: int, seed: int) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    out = {}
    for q in range(n):
        terms = rng.sample(words, rng.randint(0, 6))
        out[f"q{q:03d}"] = {t: round(rng.random(), 2) for t in terms}
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blocking_is_exact(seed):
    scores = _random_scores(150, 12, seed)
    for th_click, th_rel in ((0.5, 0.4), (0.3, 0.6), (0.0, 0.0)):
        fast = find_associations(scores, th_click, th_rel)
        slow = find_associations_bruteforce(scores, th_click, th_rel)
        assert fast.click == slow.click
        assert fast.rel == slow.rel
        assert fast.candidate_pairs <= slow.candidate_pairs


def test_blocking_examines_far_fewer_pairs_than_all():
    scores = {f"q{i}": {f"t{i}": 1.0, f"u{i % 7}": 0.9} for i in range(300)}
    res = find_associations(scores, 0.5, 0.5)
    assert res.candidate_pairs == 0  # no two queries share their top term
    assert res.click == {} and res.rel == {}


def test_negative_thresholds_rejected():
    with pytest.raises(ValueError):
        find_associations({"q": {"a": 1.0}}, -0.1, 0.5)
