"""Single-vector InfoNCE (``loss: {name: infonce}``): :func:`infonce_loss` and the loss table's
``infonce`` entry :func:`infonce_stage1_loss`.

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
from scalingnote.training.losses.registry import register_loss
from scalingnote.training.losses.scalingnote_loss import info_nce_q2d
from scalingnote.training.losses.spec import LossSpec


def infonce_loss(
    batch: LossBatch, *, tau: float = 0.05, view: str = "emb", hard_negatives: bool = True
) -> tuple[Tensor, dict[str, float]]:
    """Eq. 5 on one view at full dimension (see the module docstring). Returns (loss, {"loss": float})."""
    if view not in batch.pos:
        raise ValueError(f"loss.options.view={view!r}: the document tower gives the views {sorted(batch.pos)}")
    q = F.normalize(batch.q, dim=-1)
    cands = F.normalize(batch.pos_all[view], dim=-1)  # type: ignore[index]
    negs = batch.real_negatives(view) if hard_negatives else None  # padding rows left out
    if negs is not None:
        cands = torch.cat([cands, F.normalize(negs, dim=-1)])
    targets = torch.arange(q.shape[0], device=q.device) + batch.offset
    loss = info_nce_q2d(q, cands, targets, tau)
    return loss, {"loss": float(loss.detach())}


def infonce_stage1_loss(batch: LossBatch, spec: LossSpec) -> tuple[Tensor, dict[str, float]]:
    """Single-vector InfoNCE (``loss: {name: infonce}``).

    Inputs: ``batch`` (:class:`~scalingnote.training.losses.batch.LossBatch`): the local queries
    ``q`` [B, dim] and the documents of one view (``pos[view]``, hard negatives ``neg[view]``),
    gathered across processes in ``pos_all`` / ``neg_all`` with the local ``offset``; ``neg`` may
    hold n >= 1 negatives per query ([B*n, dim]): every one of them joins every query's candidates. ``spec``
    (:class:`~scalingnote.training.losses.spec.LossSpec`): ``tau``, and in ``options``: ``view``
    (default ``"emb"``) and ``hard_negatives`` (default True: the hard negatives join every
    query's candidates).

    Equation: ScalingNote Eq. 5 at the full dimension, L = −(1/B) Σ_i log
    exp(sim(q_i, d_i+)/τ) / Σ_j exp(sim(q_i, d_j)/τ), sim the cosine similarity and d_j every
    in-batch positive (then every hard negative).

    Reference: Karpukhin et al., "Dense Passage Retrieval for Open-Domain Question Answering"
    (2020), in-batch negatives; sentence-transformers' ``MultipleNegativesRankingLoss``.

    Example:

    >>> import torch
    >>> from scalingnote.training.losses import LossBatch, LossSpec, get_loss
    >>> g = torch.Generator().manual_seed(0)
    >>> q = torch.randn(4, 8, generator=g)
    >>> batch = LossBatch(q, {"emb": q.clone()})  # each query's positive is itself: cosine 1
    >>> loss, comps = get_loss("infonce")(batch, LossSpec(name="infonce", dims=[8], tau=0.01))
    >>> sorted(comps), round(comps["loss"], 3)
    (['loss'], 0.0)
    >>> three = LossBatch(q, {"emb": q.clone()}, {"emb": torch.randn(12, 8, generator=g)})  # 3 negatives per query
    >>> round(get_loss("infonce")(three, LossSpec(name="infonce", dims=[8], tau=0.01))[1]["loss"], 3)
    0.0
    """
    return infonce_loss(batch, tau=spec.tau, **dict(spec.options))


register_loss("infonce", infonce_stage1_loss)


__all__ = ["infonce_loss", "infonce_stage1_loss"]
