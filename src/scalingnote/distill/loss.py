"""Query-based knowledge distillation loss (ScalingNote §3.3, Eq. 15)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def qkd_loss(teacher: Tensor, student: Tensor, lam: float = 1.0) -> Tensor:
    """Eq. 15: L_KD = mean_i( ||q_i − q_i^stu||²₂ − λ·sim(q_i, q_i^stu) ), sim = cosine.

    The squared L2 term aligns magnitude and direction, the cosine term the direction
    that Stage I's cosine scoring uses (§3.3). λ = 1 in the paper (§4.2).

    Args:
        teacher: [B, dim] frozen Stage I query-tower embeddings q_i (projected, not normalised).
        student: [B, dim] student embeddings q_i^stu = W_stu^Q h_stu (Eq. 14).
    """
    sq = (teacher - student).pow(2).sum(-1)
    cos = F.cosine_similarity(teacher, student, dim=-1)
    return (sq - lam * cos).mean()
