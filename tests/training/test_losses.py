"""Losses against hand-written reference computations (ScalingNote Eq. 5–12)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from scalingnote.training.losses import (
    margin_loss,
    matryoshka_contrastive,
    matryoshka_margin,
    scalingnote_loss,
)


def _ref_q2d(q, d, tau):
    q, d = F.normalize(q, dim=-1), F.normalize(d, dim=-1)
    tot = 0.0
    for i in range(len(q)):
        num = math.exp(float(q[i] @ d[i]) / tau)
        den = sum(math.exp(float(q[i] @ d[j]) / tau) for j in range(len(d)))
        tot += -math.log(num / den)
    return tot / len(q)


def test_symmetric_infonce_matches_reference():
    torch.manual_seed(0)
    q, d = torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    tau = 0.1
    got = matryoshka_contrastive(q, d, dims=[8], tau=tau)
    want = 0.5 * (_ref_q2d(q, d, tau) + _ref_q2d(d, q, tau))  # Eq. 7 with one dim, w=1
    assert abs(float(got) - want) < 1e-9


def test_matryoshka_uses_prefixes_and_weights():
    torch.manual_seed(1)
    q, d = torch.randn(4, 16, dtype=torch.float64), torch.randn(4, 16, dtype=torch.float64)
    got = matryoshka_contrastive(q, d, dims=[4, 16], weights=[2.0, 0.5], tau=0.2)
    want = 2.0 * matryoshka_contrastive(q[:, :4], d[:, :4], dims=[4], tau=0.2) + 0.5 * matryoshka_contrastive(
        q, d, dims=[16], tau=0.2
    )
    assert torch.allclose(got, want)


def test_hard_negatives_in_denominator_raise_loss():
    torch.manual_seed(2)
    q, d, n = (torch.randn(6, 8) for _ in range(3))
    base = matryoshka_contrastive(q, d, dims=[8])
    with_neg = matryoshka_contrastive(q, d, neg_all=n, dims=[8])
    assert with_neg > base


def test_margin_loss_hand_case():
    q = torch.tensor([[1.0, 0.0]])
    pos = torch.tensor([[1.0, 0.0]])  # sim 1
    neg = torch.tensor([[0.0, 1.0]])  # sim 0
    assert float(margin_loss(q, pos, neg, margin=0.2)) == 0.0  # 0.2 - 1 + 0 < 0
    neg2 = torch.tensor([[0.9, math.sqrt(1 - 0.81)]])  # sim 0.9 -> 0.2 - 1 + 0.9 = 0.1
    assert abs(float(margin_loss(q, pos, neg2, margin=0.2)) - 0.1) < 1e-6
    # Eq. 10 normalises each prefix: scale invariance
    assert abs(float(matryoshka_margin(3 * q, pos, 5 * neg2, dims=[2], margin=0.2)) - 0.1) < 1e-6


def test_total_loss_is_con_plus_alpha_hard_over_views():
    torch.manual_seed(3)
    q = torch.randn(4, 16)
    pos = {v: torch.randn(4, 16) for v in ("title", "content", "emb")}
    neg = {v: torch.randn(4, 16) for v in ("title", "content", "emb")}
    loss, comps = scalingnote_loss(q, pos, neg, dims=[8, 16], alpha=0.5, margin=0.2, tau=0.05)
    con = sum(matryoshka_contrastive(q, pos[v], dims=[8, 16], tau=0.05) for v in pos)  # Eq. 8
    hard = sum(matryoshka_margin(q, pos[v], neg[v], dims=[8, 16], margin=0.2) for v in pos)  # Eq. 11
    assert torch.allclose(loss, con + 0.5 * hard)  # Eq. 12
    assert abs(comps["loss_con"] - float(con)) < 1e-5 and abs(comps["loss_hard"] - float(hard)) < 1e-5


def test_loss_decreases_when_pairs_align():
    torch.manual_seed(4)
    q = torch.randn(8, 16)
    aligned, _ = scalingnote_loss(q, {"emb": q + 0.01 * torch.randn(8, 16)}, dims=[16])
    random, _ = scalingnote_loss(q, {"emb": torch.randn(8, 16)}, dims=[16])
    assert aligned < random
