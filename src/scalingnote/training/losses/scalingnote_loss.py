"""Stage I losses (ScalingNote §3.2, Eq. 5–12), as small pure functions, and the ``scalingnote``
entry of the loss table (:func:`scalingnote_stage1_loss`, the default ``loss.name``).

Conventions:
- ``sim`` is cosine similarity (§4.2: "we use cosine similarity ... for better
  training stability"): every Matryoshka prefix ``x[:, :m]`` is L2-normalised
  before the dot product.
- Matryoshka dims ``M = {dim_low, 2·dim_low, ..., dim}`` (§3.2, MRL), default
  (16, 32, 64, 128) with all weights 1 (§4.2).
- Cross-process negatives: the contrastive terms take the *local* batch
  (``q``, ``d``) and the *global* batch gathered from every process (``q_all``,
  ``d_all``, ``neg_all``), with ``offset`` = index of the first local example in
  the global batch. Without distribution pass the local tensors as the global
  ones and ``offset=0``. Each process returns the mean over its local examples;
  averaging those over processes (what DDP does to gradients) equals the loss of
  one process on the concatenated batch.
- Temperature τ: the paper does not state its value. Default 0.05 — the usual
  value for cosine InfoNCE (SimCSE, Contriever-style retrievers). With cosine
  scores in [-1, 1] it gives logits in [-20, 20]: sharp enough to separate a
  positive from in-batch negatives, without the instability of τ = 0.01 at the
  small batch sizes this toolkit trains with on CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from scalingnote.training.losses.batch import LossBatch
from scalingnote.training.losses.registry import register_loss
from scalingnote.training.losses.spec import LossSpec

DEFAULT_DIMS: tuple[int, ...] = (16, 32, 64, 128)
VIEWS: tuple[str, ...] = ("title", "content", "emb")


def _prefix(x: Tensor, m: int) -> Tensor:
    """``x[:, :m]`` L2-normalised (the Matryoshka prefix used by ``sim``)."""
    return F.normalize(x[:, :m], dim=-1)


def info_nce_q2d(q: Tensor, candidates: Tensor, targets: Tensor, tau: float) -> Tensor:
    """Eq. 5: mean over queries of −log softmax_j(sim(q_i, d_j)/τ)[target_i].

    Args:
        q: [B, m] normalised query prefixes (local queries).
        candidates: [N, m] normalised document prefixes (all in-batch positives, across
            processes, optionally followed by the hard negatives).
        targets: [B] index of each query's positive in ``candidates``.
    """
    return F.cross_entropy(q @ candidates.T / tau, targets)


def info_nce_d2q(d: Tensor, queries: Tensor, targets: Tensor, tau: float) -> Tensor:
    """Eq. 6: mean over documents of −log softmax_j(sim(q_j, d_i)/τ)[target_i].

    Args:
        d: [B, m] normalised positive-document prefixes (local).
        queries: [N, m] normalised query prefixes of the whole (global) batch.
        targets: [B] index of each document's query in ``queries``.
    """
    return F.cross_entropy(d @ queries.T / tau, targets)


def matryoshka_contrastive(
    q: Tensor,
    d: Tensor,
    *,
    q_all: Tensor | None = None,
    d_all: Tensor | None = None,
    neg_all: Tensor | None = None,
    offset: int = 0,
    dims: Sequence[int] = DEFAULT_DIMS,
    weights: Sequence[float] | None = None,
    tau: float = 0.05,
) -> Tensor:
    """Eq. 7 for one document view: ½ Σ_m w^m (L_q2d^m + L_d2q^m).

    ``neg_all`` (global hard negatives, [N, h]) are appended to the query→doc
    denominators when given (the "hard negatives in the in-batch denominator" option).
    """
    q_all = q if q_all is None else q_all
    d_all = d if d_all is None else d_all
    weights = [1.0] * len(dims) if weights is None else list(weights)
    if len(weights) != len(dims):
        raise ValueError(f"{len(dims)} Matryoshka dims but {len(weights)} weights")
    targets = torch.arange(q.shape[0], device=q.device) + offset
    total = q.new_zeros(())
    for m, w in zip(dims, weights, strict=True):
        if m > q.shape[1]:
            raise ValueError(f"Matryoshka dim {m} exceeds the embedding size {q.shape[1]}")
        qm, dm, qam, dam = _prefix(q, m), _prefix(d, m), _prefix(q_all, m), _prefix(d_all, m)
        cands = dam if neg_all is None else torch.cat([dam, _prefix(neg_all, m)])
        total = total + w * (info_nce_q2d(qm, cands, targets, tau) + info_nce_d2q(dm, qam, targets, tau))
    return 0.5 * total


def margin_loss(
    q: Tensor, d_pos: Tensor, d_neg: Tensor, margin: float = 0.2, reduce: str = "mean", mask: Tensor | None = None
) -> Tensor:
    """Eq. 9: mean over queries of max(0, margin − sim(q, d+) + sim(q, d−)) (inputs normalised).

    ``d_neg`` is [B, m] (one hard negative per query: the paper's Eq. 9 exactly) or [B*n, m], n
    negatives per query, query-major. Several negatives (not in the paper, which forms one
    triplet <q, d+, d−> per example, §3.2 and §4.1.1): ``reduce="mean"`` averages the hinge over
    every (q_i, d_i+, d_ij−) triplet, i.e. Eq. 9 over the B·n triplets the paper would have formed
    from each negative with its query and positive; ``reduce="max"`` keeps each query's largest
    hinge (its hardest negative, VSE++ style, Faghri et al. 2018). ``mask`` [B*n] bool (padding
    rows False, :class:`LossBatch`): the mean runs over the real triplets only, and ``max`` over
    the queries with at least one real negative (0 when no row is real)."""
    b = q.shape[0]
    if d_neg.shape[0] == b and mask is None:  # one negative per query: the paper's Eq. 9 (bit-identical to before)
        return F.relu(margin - (q * d_pos).sum(-1) + (q * d_neg).sum(-1)).mean()
    if d_neg.shape[0] % b:
        raise ValueError(f"hard negatives: {d_neg.shape[0]} rows is not a multiple of the {b} queries")
    if reduce not in ("mean", "max"):
        raise ValueError(f"loss.hard_reduce must be 'mean' or 'max', got {reduce!r}")
    s_neg = torch.einsum("bm,bnm->bn", q, d_neg.reshape(b, -1, d_neg.shape[-1]))  # [B, n]
    hinge = F.relu(margin - (q * d_pos).sum(-1, keepdim=True) + s_neg)
    if mask is None:
        return hinge.max(dim=1).values.mean() if reduce == "max" else hinge.mean()
    m = mask.reshape(b, -1).to(hinge.dtype)
    hinge = hinge * m  # the padding rows' hinge is 0 (hinge >= 0, so the max is unaffected)
    if reduce == "max":
        has = m.amax(dim=1)
        return (hinge.max(dim=1).values * has).sum() / has.sum().clamp(min=1.0)
    return hinge.sum() / m.sum().clamp(min=1.0)


def matryoshka_margin(
    q: Tensor,
    d_pos: Tensor,
    d_neg: Tensor,
    *,
    dims: Sequence[int] = DEFAULT_DIMS,
    weights: Sequence[float] | None = None,
    margin: float = 0.2,
    reduce: str = "mean",
    mask: Tensor | None = None,
) -> Tensor:
    """Eq. 10 for one view: Σ_m w_hard^m · L_hard^m (Eq. 9 on each prefix; ``d_neg`` [B*n, h],
    ``reduce`` over a query's n negatives and ``mask`` of the padding rows as in :func:`margin_loss`)."""
    weights = [1.0] * len(dims) if weights is None else list(weights)
    if len(weights) != len(dims):
        raise ValueError(f"{len(dims)} Matryoshka dims but {len(weights)} hard weights")
    total = q.new_zeros(())
    for m, w in zip(dims, weights, strict=True):
        total = total + w * margin_loss(_prefix(q, m), _prefix(d_pos, m), _prefix(d_neg, m), margin, reduce, mask)
    return total


def scalingnote_loss(
    q: Tensor,
    pos: Mapping[str, Tensor],
    neg: Mapping[str, Tensor] | None = None,
    *,
    q_all: Tensor | None = None,
    pos_all: Mapping[str, Tensor] | None = None,
    neg_all: Mapping[str, Tensor] | None = None,
    offset: int = 0,
    dims: Sequence[int] = DEFAULT_DIMS,
    weights: Sequence[float] | None = None,
    hard_weights: Sequence[float] | None = None,
    tau: float = 0.05,
    margin: float = 0.2,
    alpha: float = 0.5,
    hard_in_denominator: bool = False,
    hard_reduce: str = "mean",
    neg_mask: Tensor | None = None,
    neg_mask_all: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Eq. 12: L = L_con + α·L_hard, with L_con = Σ_views L^view (Eq. 8) and
    L_hard = Σ_views L_hard^view (Eq. 11).

    Args:
        q: [B, dim] local query embeddings (before normalisation).
        pos: view name -> [B, dim] local positive-document embeddings. The LLM document
            tower gives ``title``, ``content`` and ``emb``; a single-vector tower gives one
            view (e.g. ``{"emb": d}``) and the sums run over what is given.
        neg: view name -> [B*n, dim] hard-negative embeddings (same views; n >= 1 per query,
            query-major), or None.
        q_all / pos_all / neg_all: the same, gathered from every process (None = local).
        offset: position of the local batch inside the gathered batch.
        hard_reduce: how Eq. 9 takes a query's n > 1 negatives: "mean" or "max" (:func:`margin_loss`).
        neg_mask / neg_mask_all: [B*n] / gathered bools, False on padding rows of ``neg`` /
            ``neg_all`` (:class:`LossBatch`); padding joins neither the denominators nor the hinge.
    Returns:
        (loss, components) where components holds floats ``loss_con``, ``loss_hard`` and
        ``loss_con/<view>`` for logging.
    """
    pos_all = pos if pos_all is None else pos_all
    neg_all = neg if neg_all is None else neg_all
    neg_mask_all = neg_mask if neg_mask_all is None else neg_mask_all
    comps: dict[str, float] = {}
    l_con = q.new_zeros(())
    for view, d in pos.items():
        extra = neg_all[view] if (hard_in_denominator and neg_all is not None) else None
        if extra is not None and neg_mask_all is not None:
            extra = extra[neg_mask_all]  # padding rows are not candidates
        lv = matryoshka_contrastive(
            q, d, q_all=q_all, d_all=pos_all[view], neg_all=extra, offset=offset, dims=dims, weights=weights, tau=tau
        )
        comps[f"loss_con/{view}"] = float(lv.detach())
        l_con = l_con + lv
    l_hard = q.new_zeros(())
    if neg is not None and alpha:
        for view, d in pos.items():
            l_hard = l_hard + matryoshka_margin(
                q, d, neg[view], dims=dims, weights=hard_weights, margin=margin, reduce=hard_reduce, mask=neg_mask
            )
    comps["loss_con"] = float(l_con.detach())
    comps["loss_hard"] = float(l_hard.detach())
    loss = l_con + alpha * l_hard
    comps["loss"] = float(loss.detach())
    return loss, comps


def scalingnote_stage1_loss(batch: LossBatch, spec: LossSpec) -> tuple[Tensor, dict[str, float]]:
    """The ScalingNote Stage I loss (``loss: {name: scalingnote}``, the default).

    Inputs: ``batch`` (:class:`~scalingnote.training.losses.batch.LossBatch`): the local queries
    ``q`` [B, dim], the positive documents ``pos`` (view name -> [B, dim]) and hard negatives
    ``neg`` (view name -> [B*n, dim], n >= 1 per query, query-major; an LLM document tower gives the
    ``title``, ``content`` and ``emb`` views, a single-vector tower one ``emb`` view), the same
    gathered across processes and the local batch's ``offset`` in them.
    ``spec`` (:class:`~scalingnote.training.losses.spec.LossSpec`): the Matryoshka ``dims`` and
    ``weights`` / ``hard_weights``, ``tau``, ``margin``, ``alpha`` and ``hard_in_denominator`` and
    ``hard_reduce``. Padding rows of ``neg`` (``batch.neg_mask``
    False: an example with fewer negatives than the batch's largest) are left out of both terms.

    Equation: ScalingNote Eq. 5–12 (§3.2). For each view t and prefix length m ∈ M,
    L_q2d^{t,m} (Eq. 5) and L_d2q^{t,m} (Eq. 6) are in-batch InfoNCE terms over cosine
    similarities / τ; L^t = ½ Σ_m w^m (L_q2d^{t,m} + L_d2q^{t,m}) (Eq. 7) and
    L^con = Σ_t L^t (Eq. 8); L_hard^{t,m} = mean_i max(0, margin − sim(q_i, d_i+) + sim(q_i, d_i−))
    (Eq. 9; with n > 1 negatives per query the hinge is averaged over the B·n triplets
    (q_i, d_i+, d_ij−), ``hard_reduce: mean``, or each query keeps its largest, ``max``; every
    hard negative joins the Eq. 5 denominators with ``hard_in_denominator``),
    L_hard^t = Σ_m w_hard^m L_hard^{t,m} (Eq. 10), L^hard = Σ_t L_hard^t (Eq. 11), and
    L = L^con + α L^hard (Eq. 12).

    Reference: "ScalingNote: Scaling up Retrievers with Large Language Models for Real-World
    Dense Retrieval" (Huang et al., 2024), §3.2; the Matryoshka prefixes follow Kusupati et al.,
    "Matryoshka Representation Learning" (2022).

    Returns ``(loss, components)``; the components (``loss``, ``loss_con``, ``loss_hard``,
    ``loss_con/<view>``) are logged with the step.

    Example:

    >>> import torch
    >>> from scalingnote.training.losses import LossBatch, LossSpec, get_loss
    >>> g = torch.Generator().manual_seed(0)
    >>> q, d, n = (torch.randn(4, 32, generator=g) for _ in range(3))
    >>> loss, comps = get_loss("scalingnote")(LossBatch(q, {"emb": d}, {"emb": n}), LossSpec(dims=[16, 32]))
    >>> sorted(comps)
    ['loss', 'loss_con', 'loss_con/emb', 'loss_hard']
    >>> abs(comps["loss"] - (comps["loss_con"] + 0.5 * comps["loss_hard"])) < 1e-5  # Eq. 12, alpha 0.5
    True
    """
    return scalingnote_loss(
        batch.q,
        batch.pos,
        batch.neg,
        q_all=batch.q_all,
        pos_all=batch.pos_all,
        neg_all=batch.neg_all,
        offset=batch.offset,
        dims=spec.dims,
        weights=spec.weights,
        hard_weights=spec.hard_weights,
        tau=spec.tau,
        margin=spec.margin,
        alpha=spec.alpha,
        hard_in_denominator=spec.hard_in_denominator,
        hard_reduce=spec.hard_reduce,
        neg_mask=batch.neg_mask,
        neg_mask_all=batch.neg_mask_all,
    )


register_loss("scalingnote", scalingnote_stage1_loss)
