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


def qkd_rank_loss(teacher_scores: Tensor, student_scores: Tensor, tau: float = 0.05) -> Tensor:
    """Listwise score distillation over each query's teacher top-k documents (not in the paper).

    L_rank = mean_i KL( softmax(s_i^T / τ) ‖ softmax(s_i^S / τ) ), with s_ij^T = cos(q_i, d_j) and
    s_ij^S = cos(q_i^stu, d_j) over the k documents d_j that the teacher ranks highest for query i
    (the frozen Stage I document embeddings: ScalingNote §3.3 serves the student against them).
    Eq. 15 matches the student's vector to the teacher's everywhere; this term spends the student's
    capacity where ranking happens, on the order of the documents near the query (as in score
    distillation for dense retrievers, e.g. TCT-ColBERT, Lin et al. 2021).

    Args:
        teacher_scores: [B, k] teacher cosine scores of the top-k documents.
        student_scores: [B, k] student cosine scores of the same documents.
        tau: softmax temperature (Stage I's τ, §4.2: 0.05).
    """
    log_p_t = F.log_softmax(teacher_scores / tau, dim=-1)
    log_p_s = F.log_softmax(student_scores / tau, dim=-1)
    return F.kl_div(log_p_s, log_p_t, log_target=True, reduction="batchmean")
