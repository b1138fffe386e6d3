"""TMJ losses (Huang et al., KDD'23, §3.1 and §3.3, Eq. 4–9) as small pure functions.

Conventions (the paper scores with a raw inner product ``<q, d>``; this toolkit trains
cosine towers, ScalingNote §4.2):

* ``q`` and ``d`` are L2-normalised; ``d̂`` is the PQ reconstruction of the normalised
  ``d`` (so the FAISS index stores codes of unit vectors, as :mod:`scalingnote.index`
  does). Scores are ``<q, d>/τ`` and ``<q, d̂>/τ`` with the toolkit's τ = 0.05 — the
  temperature rescales the paper's softmax to cosine scores in [-1, 1].
* Retrieval losses take one query batch ``q [B, D]``, a candidate set ``cands [N, D]``
  (the batch's positives and hard negatives, shared by every query: in-batch negatives),
  ``targets [B]`` (index of each query's positive in ``cands``) and an optional boolean
  ``mask [B, N]`` of candidates to leave out of a query's softmax (its *other* judged
  positives — they are not negatives).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor


def retrieval_loss(q: Tensor, cands: Tensor, targets: Tensor, tau: float, mask: Tensor | None = None) -> Tensor:
    """Eq. 5 / Eq. 6: mean over queries of ``-ln softmax_j(<q, c_j>/τ)[target]``.

    ``mask[i, j] = True`` removes candidate ``j`` from query ``i``'s denominator (never its
    own target).
    """
    scores = q @ cands.T / tau
    if mask is not None:
        keep_target = torch.zeros_like(mask)
        keep_target[torch.arange(len(targets), device=mask.device), targets] = True
        scores = scores.masked_fill(mask & ~keep_target, float("-inf"))
    return F.cross_entropy(scores, targets)


def dense_retrieval_loss(q: Tensor, d: Tensor, targets: Tensor, tau: float, mask: Tensor | None = None) -> Tensor:
    """Eq. 5, ``L_r``: InfoNCE of the queries against the dense (unquantized) documents."""
    return retrieval_loss(q, d, targets, tau, mask)


def pq_retrieval_loss(q: Tensor, d_tilde: Tensor, targets: Tensor, tau: float, mask: Tensor | None = None) -> Tensor:
    """Eq. 6, ``L_r̂``: InfoNCE against the quantized documents (pass the straight-through
    ``d̃`` of Eq. 7 so the gradient reaches the encoder and the centroids)."""
    return retrieval_loss(q, d_tilde, targets, tau, mask)


def reconstruction_loss(d: Tensor, d_hat: Tensor) -> Tensor:
    """Eq. 4, ``L_m = ||sg(d) - d̂||²``: mean over documents of the squared distortion.
    The stop-gradient makes it train the centroids only."""
    return ((d.detach() - d_hat) ** 2).sum(-1).mean()


def straight_through(d: Tensor, d_hat: Tensor, centroid_grad: bool = True) -> Tensor:
    """Eq. 7, ``d̃ = d - sg(d - d̂)``: forward value ``d̂``, ``∂d̃/∂d = I``.

    Taken literally, Eq. 7 also stops the gradient to ``d̂`` (the centroids), so ``L_r̂``
    would never train them; yet TMJ trains the centroids with ``L_r̂`` (stage 2: "train
    the query encoder and PQ parameters by minimizing L_r̂", §3.2, following JPQ /
    RepCONC, where ``<q, d̂>`` is differentiable in the selected centroids). With
    ``centroid_grad=True`` (default) this returns ``d̂ + d - sg(d)``: same forward value,
    same encoder gradient, plus the gradient to the selected centroids.
    ``centroid_grad=False`` is the literal Eq. 7.
    """
    if centroid_grad:
        return d_hat + (d - d.detach())
    return d - (d - d_hat).detach()


def joint_loss(l_m: Tensor, l_rhat: Tensor) -> Tensor:
    """Eq. 8, the conventional joint-training loss ``L0 = L_m + L_r̂``."""
    return l_m + l_rhat


def multitask_loss(l_m: Tensor, l_rhat: Tensor, l_r: Tensor, weights: Mapping[str, float] | None = None) -> Tensor:
    """Eq. 9, TMJ's multi-task loss ``L1 = L_m + L_r̂ + L_r`` (optional weights ``m``, ``rhat``,
    ``r``; the paper's are all 1)."""
    w = {"m": 1.0, "rhat": 1.0, "r": 1.0, **(weights or {})}
    return w["m"] * l_m + w["rhat"] * l_rhat + w["r"] * l_r


def stage1_loss(
    q: Tensor,
    d: Tensor,
    d_hat: Tensor,
    targets: Tensor,
    *,
    tau: float,
    kind: str = "l1",
    mask: Tensor | None = None,
    weights: Mapping[str, float] | None = None,
    centroid_grad: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """Stage 1 objective: ``L1`` (Eq. 9, ``kind="l1"``) or ``L0`` (Eq. 8, ``kind="l0"``).

    ``q [B, D]`` normalised queries; ``d [N, D]`` normalised candidate documents (with
    grad to the document encoder); ``d_hat [N, D]`` their reconstructions (with grad to
    the centroids). Returns ``(loss, {"loss", "loss_m", "loss_rhat", "loss_r"})``;
    ``loss_r`` is computed (for logging) under both kinds but enters only ``L1``.
    """
    d_tilde = straight_through(d, d_hat, centroid_grad)
    l_m = reconstruction_loss(d, d_hat)
    l_rhat = pq_retrieval_loss(q, d_tilde, targets, tau, mask)
    if kind == "l1":
        l_r = dense_retrieval_loss(q, d, targets, tau, mask)
        loss = multitask_loss(l_m, l_rhat, l_r, weights)
    elif kind == "l0":
        with torch.no_grad():
            l_r = dense_retrieval_loss(q, d, targets, tau, mask)
        w = {"m": 1.0, "rhat": 1.0, **(weights or {})}
        loss = joint_loss(w["m"] * l_m, w["rhat"] * l_rhat)
    else:
        raise ValueError(f"kind must be 'l1' or 'l0', got {kind!r}")
    comps = {
        "loss": float(loss.detach()),
        "loss_m": float(l_m.detach()),
        "loss_rhat": float(l_rhat.detach()),
        "loss_r": float(l_r.detach()),
    }
    return loss, comps
