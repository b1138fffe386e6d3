"""The Stage II objective on a batch of queries: Eq. 15 of ScalingNote §3.3 (plus the
listwise term over the teacher's top-k documents) and its mean over the validation queries."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch

from scalingnote.distill.config import DistillConfig
from scalingnote.distill.data import QKDData, forward_batch
from scalingnote.distill.loss import qkd_loss, qkd_rank_loss


def qkd_batch_loss(
    cfg: DistillConfig, student, prefix, data: QKDData, idx: np.ndarray, device: torch.device, use_bf16: bool
) -> torch.Tensor:
    """Eq. 15 (+ the listwise term when ``data.ranking``) of the student on queries ``idx``."""
    batch_texts = [data.texts[i] for i in idx]
    ctx = torch.autocast(device_type=device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()
    with ctx:
        if prefix is not None:
            q_stu = prefix.queries(batch_texts)
        else:
            enc = student.tokenize_queries(batch_texts)
            q_stu = student({k: v.to(device) for k, v in enc.items()})
    q_stu = q_stu if q_stu.dtype == torch.float64 else q_stu.float()  # float64 stays (exactness tests)
    loss = qkd_loss(torch.from_numpy(data.targets[idx]).to(device, q_stu.dtype), q_stu, cfg.lam)
    if data.ranking is not None:
        t_scores, s_scores = data.ranking.batch(idx, q_stu)
        loss = loss + cfg.rank_weight * qkd_rank_loss(t_scores, s_scores, cfg.rank_tau)
    return loss


def qkd_validation_loss(
    cfg: DistillConfig, student, prefix, data: QKDData, device: torch.device, use_bf16: bool
) -> float | None:
    """Mean :func:`qkd_batch_loss` over the validation queries (eval mode, no grad); None without
    any. Every rank computes it over all of them: a sharded forward is collective."""
    v = data.val_idx
    if not len(v):
        return None
    v = v[
        np.argsort([len(data.texts[i]) for i in v], kind="stable")
    ]  # length-sorted: little padding (the mean is the same)
    ch = 512 if device.type == "cuda" else forward_batch(cfg)
    was = student.training
    student.eval()
    with torch.no_grad():
        tot = sum(
            float(qkd_batch_loss(cfg, student, prefix, data, v[i : i + ch], device, use_bf16)) * len(v[i : i + ch])
            for i in range(0, len(v), ch)
        )
    student.train(was)
    return tot / len(v)
