"""Single-vector InfoNCE (``loss: {name: infonce}``).

Inputs: the queries ``q`` and one document view (``options.view``, default ``emb``: the
``[EMB]`` token of the LLM document tower, the only view of a BERT tower), optional hard
negatives. Equation: ScalingNote Eq. 5 at the full dimension only —
``L = mean_i -log softmax_j(sim(q_i, d_j) / tau)[i]``, the candidates ``d_j`` being every positive
of the (cross-process) batch followed, when given, by every hard negative; no Matryoshka prefixes,
no document->query direction (Eq. 6), no margin term (Eq. 9).
Reference: the in-batch negatives objective of DPR (Karpukhin et al., 2020), also
sentence-transformers' ``MultipleNegativesRankingLoss``. A simpler, cheaper baseline to the
paper's Eq. 12.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from scalingnote.training.losses.batch import LossBatch
from scalingnote.training.losses.scalingnote_loss import info_nce_q2d


def infonce_loss(batch: LossBatch, *, tau: float = 0.05, view: str = "emb", hard_negatives: bool = True) -> tuple[Tensor, dict[str, float]]:
    """Eq. 5 on one view at full dimension (see the module docstring). Returns (loss, {"loss": float})."""
    if view not in batch.pos:
        raise ValueError(f"loss.options.view={view!r}: the document tower gives the views {sorted(batch.pos)}")
    q = F.normalize(batch.q, dim=-1)
    cands = F.normalize(batch.pos_all[view], dim=-1)  # type: ignore[index]
    if hard_negatives and batch.neg_all is not None:
        cands = torch.cat([cands, F.normalize(batch.neg_all[view], dim=-1)])
    targets = torch.arange(q.shape[0], device=q.device) + batch.offset
    loss = info_nce_q2d(q, cands, targets, tau)
    return loss, {"loss": float(loss.detach())}


__all__ = ["infonce_loss"]
