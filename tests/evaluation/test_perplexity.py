"""Contrastive perplexity (Scaling Laws for Dense Retrieval §3.5, Eq. 6)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from scalingnote.errors import ScalingNoteError
from scalingnote.evaluation import (
    PAPER_NUM_NEGATIVES,
    contrastive_perplexity,
    contrastive_perplexity_from_scorer,
    sample_contrastive_set,
)


def test_hand_computed_small_case():
    # one query, positive p, the only two non-relevant docs n1, n2 must be the W=2 negatives
    q = np.array([[1.0, 0.0]])
    docs = np.array([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    doc_ids = ["p", "n1", "n2"]
    qrels = {"q": {"p": 1}}
    # s(q,p)=2, s(q,n1)=0, s(q,n2)=1
    expected = -math.log(math.exp(2) / (math.exp(2) + math.exp(0) + math.exp(1)))
    got = contrastive_perplexity(q, ["q"], docs, doc_ids, qrels=qrels, num_negatives=2)
    assert got == pytest.approx(expected, rel=1e-12)
    # temperature divides the scores
    t = 0.5
    expected_t = -math.log(math.exp(2 / t) / (math.exp(2 / t) + math.exp(0 / t) + math.exp(1 / t)))
    got_t = contrastive_perplexity(q, ["q"], docs, doc_ids, qrels=qrels, num_negatives=2, temperature=t)
    assert got_t == pytest.approx(expected_t, rel=1e-12)


def test_mean_over_pairs_and_matches_cross_entropy():
    rng = np.random.default_rng(0)
    doc_ids = [f"d{i}" for i in range(300)]
    qids = [f"q{i}" for i in range(20)]
    qrels = {q: {doc_ids[int(j)]: 1 for j in rng.choice(300, size=rng.integers(1, 4), replace=False)} for q in qids}
    q_emb = rng.normal(size=(20, 8)).astype(np.float32)
    d_emb = rng.normal(size=(300, 8)).astype(np.float32)
    cset = sample_contrastive_set(qrels, doc_ids, num_negatives=16, seed=1)
    assert cset.num_pairs == sum(len(v) for v in qrels.values())
    per_pair = contrastive_perplexity(
        q_emb, qids, d_emb, doc_ids, cset, temperature=0.05, return_per_pair=True, batch_size=7
    )
    # independent computation: cross-entropy with the positive as class 0
    qi = [qids.index(q) for q in cset.query_ids]
    scores = np.einsum("pd,pkd->pk", q_emb[qi].astype(np.float64), d_emb[cset.candidates()].astype(np.float64)) / 0.05
    ce = torch.nn.functional.cross_entropy(
        torch.from_numpy(scores), torch.zeros(len(qi), dtype=torch.long), reduction="none"
    )
    np.testing.assert_allclose(per_pair, ce.numpy(), rtol=1e-5)  # fp32 dot products
    mean = contrastive_perplexity(q_emb, qids, d_emb, doc_ids, cset, temperature=0.05)
    assert mean == pytest.approx(float(ce.mean()), rel=1e-5)
    # torch tensors give the same value; so does a scoring callable
    mean_t = contrastive_perplexity(
        torch.from_numpy(q_emb), qids, torch.from_numpy(d_emb), doc_ids, cset, temperature=0.05
    )
    assert mean_t == pytest.approx(mean, rel=1e-6)
    qix = {q: i for i, q in enumerate(qids)}
    dix = {d: i for i, d in enumerate(doc_ids)}

    def score_fn(batch_q, batch_docs):
        return np.stack(
            [d_emb[[dix[d] for d in docs]] @ q_emb[qix[q]] for q, docs in zip(batch_q, batch_docs, strict=True)]
        )

    assert contrastive_perplexity_from_scorer(score_fn, cset, temperature=0.05, batch_size=5) == pytest.approx(
        mean, rel=1e-5
    )


def test_deterministic_under_seed_and_negatives_never_relevant():
    rng = np.random.default_rng(0)
    n_docs = 400
    doc_ids = [f"d{i}" for i in range(n_docs)]
    qrels = {}
    for q in range(30):
        judged = rng.choice(n_docs, size=60, replace=False)
        # graded: 0 = judged non-relevant (allowed as a negative), 1..3 relevant
        qrels[f"q{q}"] = {doc_ids[int(j)]: int(rng.integers(0, 4)) for j in judged}
    a = sample_contrastive_set(qrels, doc_ids, num_negatives=PAPER_NUM_NEGATIVES, seed=7)
    b = sample_contrastive_set(qrels, doc_ids, num_negatives=PAPER_NUM_NEGATIVES, seed=7)
    c = sample_contrastive_set(qrels, doc_ids, num_negatives=PAPER_NUM_NEGATIVES, seed=8)
    np.testing.assert_array_equal(a.neg, b.neg)
    assert a.query_ids == b.query_ids and (a.pos == b.pos).all()
    assert not np.array_equal(a.neg, c.neg)
    assert a.neg.shape == (a.num_pairs, 256)
    for qid, pos, row in zip(a.query_ids, a.pos, a.neg, strict=True):
        relevant = {d for d, g in qrels[qid].items() if g > 0}
        assert doc_ids[pos] in relevant
        negs = [doc_ids[j] for j in row]
        assert not relevant & set(negs)
        assert len(set(negs)) == len(negs)  # without replacement
    # grade >= relevance_level makes a pair; grade > 0 is never a negative
    strict = sample_contrastive_set(qrels, doc_ids, num_negatives=10, relevance_level=3)
    assert all(qrels[q][doc_ids[p]] == 3 for q, p in zip(strict.query_ids, strict.pos, strict=True))


def test_negatives_are_uniform_over_allowed_docs():
    doc_ids = [f"d{i}" for i in range(20)]
    qrels = {f"q{i}": {"d0": 1, "d1": 2, "d2": 0} for i in range(2000)}
    cset = sample_contrastive_set(qrels, doc_ids, num_negatives=5, seed=0)
    counts = np.bincount(cset.neg.ravel(), minlength=20)
    assert counts[0] == counts[1] == 0
    allowed = counts[2:]  # 18 docs, expected 2000*2*5/18 each... (2 positives per query)
    expected = cset.neg.size / 18
    chi2 = float(((allowed - expected) ** 2 / expected).sum())
    assert chi2 < 45  # df=17: p(chi2 > 45) ~ 2e-4


def test_errors():
    doc_ids = ["p", "n1"]
    with pytest.raises(ScalingNoteError, match="only 1 non-relevant"):
        sample_contrastive_set({"q": {"p": 1}}, doc_ids, num_negatives=2)
    with pytest.raises(ScalingNoteError, match="not among doc_ids"):
        sample_contrastive_set({"q": {"zz": 1}}, doc_ids, num_negatives=1)
    cset = sample_contrastive_set({"q": {"p": 1}}, doc_ids, num_negatives=1)
    with pytest.raises(ScalingNoteError, match="no embedding"):
        contrastive_perplexity(np.zeros((1, 2)), ["other"], np.zeros((2, 2)), doc_ids, cset)
    with pytest.raises(ScalingNoteError, match="doc_ids differ"):
        contrastive_perplexity(np.zeros((1, 2)), ["q"], np.zeros((2, 2)), ["n1", "p"], cset)
    with pytest.raises(ScalingNoteError, match="temperature"):
        contrastive_perplexity(np.zeros((1, 2)), ["q"], np.zeros((2, 2)), doc_ids, cset, temperature=0)
    with pytest.raises(ScalingNoteError, match="no \\(query"):
        sample_contrastive_set({"q": {"p": 0}}, doc_ids, num_negatives=1)
