"""Query association matching: ScalingNote §4.1.1, Algorithm 1.

For two queries with planner scores ``S1``, ``S2`` (term -> importance)::

    ClickA_{q1<-q2} = AllAbove(Top2(S1), S2, th_click)
    ClickA_{q2<-q1} = AllAbove(Top2(S2), S1, th_click)
    RelA            = AllAbove(Top4(S1), S2, th_rel) and AllAbove(Top4(S2), S1, th_rel)

``AllAbove(T, S, th)`` is true when every term of ``T`` has ``S[term] > th``
(strict); a term absent from ``S`` scores 0. ``TopK`` returns the ``k`` highest
scoring terms (ties broken by the term string, so results are deterministic), or
all terms when the query has fewer. A query without any scored term is never
associated (the paper leaves ``AllAbove`` over an empty set undefined; "vacuously
true" would associate it with every query).

``ClickA_{q1<-q2}`` is directional: it means q2's click positives/negatives are
also training data for q1. ``RelA`` is symmetric.

Candidate generation (:func:`find_associations`) avoids comparing all n² pairs
by blocking on an inverted index of important terms: ``q2`` can satisfy either
``ClickA_{q1<-q2}`` or ``RelA`` only if both of ``Top2(S1)`` score above
``min(th_click, th_rel) >= 0`` in ``S2`` (``Top2 ⊆ Top4``). So the candidates
of ``q1`` are the intersection of the posting lists of its top-2 terms, where a
posting list holds the queries scoring that term above the lower threshold.
This is exact — it finds the same associations as the brute-force loop — and
costs the sum of the candidate-set sizes instead of n². ``ClickA_{q1<-q2}`` is
evaluated from ``q1``'s side; ``RelA`` once per unordered pair, from the
lexicographically smaller query id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

Scores = Mapping[str, float]


def top_terms(scores: Scores, k: int) -> list[str]:
    """``TopK(Scores)``: the ``k`` highest-scoring terms (ties by term)."""
    return [t for t, _ in sorted(scores.items(), key=lambda x: (-x[1], x[0]))[:k]]


def all_above(terms: Iterable[str], scores: Scores, threshold: float) -> bool:
    """``AllAbove(Terms, Scores, Threshold)``: every term has ``Scores[term] > threshold``
    (strict; absent terms score 0). False for an empty term list."""
    terms = list(terms)
    return bool(terms) and all(scores.get(t, 0.0) > threshold for t in terms)


@dataclass(frozen=True, slots=True)
class Association:
    """The three outputs of Algorithm 1 for a pair (q1, q2)."""

    click_1_from_2: bool  # ClickA_{q1<-q2}: q2's click data is associated with q1
    click_2_from_1: bool  # ClickA_{q2<-q1}: q1's click data is associated with q2
    rel: bool  # RelA: relevance data is shared both ways


def associate_scores(s1: Scores, s2: Scores, th_click: float, th_rel: float) -> Association:
    """Algorithm 1, lines 3-12, given the planner scores of both queries."""
    t1_2 = top_terms(s1, 2)
    click_12 = all_above(t1_2, s2, th_click)  # ClickA_{q1<-q2}
    t2_2 = top_terms(s2, 2)
    click_21 = all_above(t2_2, s1, th_click)  # ClickA_{q2<-q1}
    t1_4 = top_terms(s1, 4)
    t2_4 = top_terms(s2, 4)
    rel = all_above(t1_4, s2, th_rel) and all_above(t2_4, s1, th_rel)
    return Association(click_12, click_21, rel)


def match_queries(
    q1: str, q2: str, planner: Callable[[str], dict[str, float]], th_click: float, th_rel: float
) -> Association:
    """Algorithm 1 (Query Association Matching) on two query texts."""
    return associate_scores(planner(q1), planner(q2), th_click, th_rel)


@dataclass
class AssociationResult:
    """Associations over a query set.

    ``click[q1]`` is the set of q2 with ``ClickA_{q1<-q2}`` (q1 receives q2's click
    data); ``rel[q]`` the set of queries relevance-associated with q (symmetric).
    """

    click: dict[str, set[str]] = field(default_factory=dict)
    rel: dict[str, set[str]] = field(default_factory=dict)
    candidate_pairs: int = 0  # ordered (q1, q2) pairs examined after blocking

    @property
    def num_click(self) -> int:
        return sum(len(v) for v in self.click.values())

    @property
    def num_rel_pairs(self) -> int:
        return sum(len(v) for v in self.rel.values()) // 2


def _check_thresholds(th_click: float, th_rel: float) -> None:
    if th_click < 0 or th_rel < 0:
        raise ValueError(f"association thresholds must be >= 0 (got th_click={th_click}, th_rel={th_rel})")


def find_associations(
    scores: Mapping[str, Scores],
    th_click: float,
    th_rel: float,
    progress: bool = False,
) -> AssociationResult:
    """All associations among ``scores`` (query id -> planner scores), with
    inverted-index blocking (see the module docstring). Exact."""
    _check_thresholds(th_click, th_rel)
    low = min(th_click, th_rel)
    postings: dict[str, set[str]] = {}
    for qid, s in scores.items():
        for term, v in s.items():
            if v > low:
                postings.setdefault(term, set()).add(qid)
    res = AssociationResult()
    items: Iterable = scores.items()
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, total=len(scores), desc="query association", unit="q")
    for q1, s1 in items:
        top2 = top_terms(s1, 2)
        if not top2 or any(t not in postings for t in top2):
            continue
        lists = sorted((postings[t] for t in top2), key=len)
        cands = lists[0].intersection(*lists[1:]) if len(lists) > 1 else lists[0]
        for q2 in cands:
            if q2 == q1:
                continue
            res.candidate_pairs += 1
            s2 = scores[q2]
            if all_above(top2, s2, th_click):  # ClickA_{q1<-q2}
                res.click.setdefault(q1, set()).add(q2)
            if q1 < q2 and all_above(top_terms(s1, 4), s2, th_rel) and all_above(top_terms(s2, 4), s1, th_rel):
                res.rel.setdefault(q1, set()).add(q2)
                res.rel.setdefault(q2, set()).add(q1)
    return res


def find_associations_bruteforce(scores: Mapping[str, Scores], th_click: float, th_rel: float) -> AssociationResult:
    """Reference O(n²) implementation (for tests and small logs)."""
    res = AssociationResult()
    ids = list(scores)
    for i, q1 in enumerate(ids):
        for q2 in ids[i + 1 :]:
            a = associate_scores(scores[q1], scores[q2], th_click, th_rel)
            res.candidate_pairs += 2
            if a.click_1_from_2:
                res.click.setdefault(q1, set()).add(q2)
            if a.click_2_from_1:
                res.click.setdefault(q2, set()).add(q1)
            if a.rel:
                res.rel.setdefault(q1, set()).add(q2)
                res.rel.setdefault(q2, set()).add(q1)
    return res
