"""Pooling helpers: the seeded orthogonal projection ``W`` (Eq. 3-4) and per-segment mean pooling."""

from __future__ import annotations

import math

import torch


def orthogonal_projection(hidden: int, dim: int, seed: int) -> torch.Tensor:
    """``W`` (dim x hidden) with orthonormal rows times ``sqrt(hidden/dim)`` from a seeded generator.

    Norm-preserving in expectation: for ``x`` uniform on a sphere, E||Wx||^2 = ||x||^2.
    """
    g = torch.Generator().manual_seed(int(seed))
    a = torch.randn(hidden, dim, generator=g, dtype=torch.float64)
    q, r = torch.linalg.qr(a)  # q: hidden x dim, orthonormal columns
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)  # make the factorisation unique
    return (q.T * math.sqrt(hidden / dim)).to(torch.float32).contiguous()


def _segment_means(h: torch.Tensor, mask: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Mean of the hidden states of consecutive segments of each sequence.

    ``ends [B, S]`` are inclusive, ascending end positions: segment ``s`` covers the real
    (``mask`` = 1) tokens in ``(ends[:, s-1], ends[:, s]]``, the first one starts at the first
    real token. Returns ``[B, S, H]``.

    This is the ``"mean"`` pooling of LLM towers, **not the paper's** placeholder pooling
    (§3.2 reads one hidden state before each placeholder). A truncated, untrained decoder's
    last-token states are nearly identical across texts (zero-shot SmolLM2 at 1-16 layers: see
    ``benchmarks/results/llm_pooling_scifact.json``), and mean pooling over a causal decoder is
    the usual remedy (SGPT, Muennighoff 2022).
    """
    m = mask.to(h.dtype).unsqueeze(-1)
    csum = torch.cumsum(h * m, dim=1)  # [B, L, H]
    ccount = torch.cumsum(m, dim=1)  # [B, L, 1]
    idx = ends.long()
    sums = csum.gather(1, idx.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
    counts = ccount.gather(1, idx.unsqueeze(-1))
    prev_sums = torch.cat([torch.zeros_like(sums[:, :1]), sums[:, :-1]], dim=1)
    prev_counts = torch.cat([torch.zeros_like(counts[:, :1]), counts[:, :-1]], dim=1)
    return (sums - prev_sums) / (counts - prev_counts).clamp(min=1)
