"""A product quantizer as a torch module, initialised from FAISS (TMJ §3.1, Eq. 1–3, 7).

``LearnedPQ`` holds ``M`` codebooks of ``K = 2**nbits`` centroids of ``dim / M`` components
(``codebooks``: ``nn.Parameter [M, K, dim/M]``) and an optional fixed orthogonal rotation
``R`` (OPQ, Ge et al. 2013): the quantizer works on ``y = R x`` and reconstructions are
rotated back, ``x̂ = Rᵀ ŷ`` — so ``<q, x̂> = <R q, ŷ>``, which is exactly what a FAISS
``IndexPreTransform(R, IndexPQ)`` computes with its inner-product look-up tables.

Operations (``x``: ``[B, dim]``):

* :meth:`assign` — Eq. 2, the nearest centroid of every sub-vector (codes ``[B, M]``);
* :meth:`reconstruct` — Eq. 3, concatenated centroids (differentiable w.r.t. the codebooks);
* :meth:`soft_assign` / :meth:`soft_reconstruct` — softmax over negative squared distances
  (temperature ``tau``), the differentiable relaxation used by DPQ-style training;
* :meth:`quantize` — hard, soft, straight-through (Eq. 7) or soft straight-through.

Centroid layout ``[M][K][dim/M]`` is FAISS's ``ProductQuantizer.centroids`` layout, so
:mod:`scalingnote.index.faiss.learned_pq` copies the tensor into FAISS unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from scalingnote.errors import ScalingNoteError
from scalingnote.pq.losses import straight_through
from scalingnote.utils.io import atomic_path

QuantizeMode = Literal["hard", "ste", "soft", "ste_soft"]
FORMAT = "scalingnote-learned-pq/1"


class LearnedPQ(nn.Module):
    """``M`` sub-space codebooks (``nn.Parameter [M, K, dim/M]``) and an optional fixed rotation."""

    rotation: Tensor | None  # a registered buffer, or None

    def __init__(
        self,
        dim: int,
        m: int,
        nbits: int = 8,
        codebooks: Tensor | np.ndarray | None = None,
        rotation: Tensor | np.ndarray | None = None,
    ):
        super().__init__()
        if dim < 1 or m < 1 or dim % m:
            raise ScalingNoteError(f"product quantizer: dim {dim} must be a positive multiple of M={m}")
        if not 1 <= nbits <= 16:
            raise ScalingNoteError(f"product quantizer: nbits must be in 1..16, got {nbits}")
        self.dim, self.m, self.nbits = int(dim), int(m), int(nbits)
        self.ksub = 2**self.nbits
        self.dsub = self.dim // self.m
        if codebooks is None:
            cb = torch.zeros(self.m, self.ksub, self.dsub)
        else:
            cb = torch.as_tensor(
                np.asarray(codebooks, dtype=np.float32) if isinstance(codebooks, np.ndarray) else codebooks,
                dtype=torch.float32,
            )
            if tuple(cb.shape) != (self.m, self.ksub, self.dsub):
                raise ScalingNoteError(
                    f"codebooks: expected shape {(self.m, self.ksub, self.dsub)}, got {tuple(cb.shape)}"
                )
        self.codebooks = nn.Parameter(cb.clone().contiguous())
        if rotation is not None:
            r = torch.as_tensor(
                np.asarray(rotation, dtype=np.float32) if isinstance(rotation, np.ndarray) else rotation,
                dtype=torch.float32,
            )
            if tuple(r.shape) != (self.dim, self.dim):
                raise ScalingNoteError(
                    f"rotation: expected a square ({self.dim}, {self.dim}) matrix, got {tuple(r.shape)}"
                )
            err = float((r @ r.T - torch.eye(self.dim)).abs().max())
            if err > 1e-3:
                raise ScalingNoteError(f"rotation: not orthogonal (max |R Rᵀ - I| = {err:.2e})")
            self.register_buffer("rotation", r.clone().contiguous())
        else:
            self.rotation = None

    # ------------------------------------------------------------------ geometry
    @property
    def code_bytes(self) -> int:
        """Bytes of one stored code (``ceil(M * nbits / 8)``, FAISS ``code_size``)."""
        return (self.m * self.nbits + 7) // 8

    def rotate(self, x: Tensor) -> Tensor:
        """``y = R x`` (identity without a rotation)."""
        return x if self.rotation is None else x @ self.rotation.T

    def unrotate(self, y: Tensor) -> Tensor:
        """``x = Rᵀ y`` (R orthogonal)."""
        return y if self.rotation is None else y @ self.rotation

    def split(self, x: Tensor) -> Tensor:
        """Eq. 1: ``[B, dim] -> [B, M, dim/M]`` sub-vectors of the rotated vector."""
        return self.rotate(x).reshape(x.shape[0], self.m, self.dsub)

    def distances(self, x: Tensor) -> Tensor:
        """Squared L2 distances of every sub-vector to every centroid: ``[B, M, K]``."""
        sub = self.split(x)  # [B, M, ds]
        cb = self.codebooks
        cross = torch.einsum("bmd,mkd->bmk", sub, cb)
        return (sub * sub).sum(-1, keepdim=True) - 2 * cross + (cb * cb).sum(-1).unsqueeze(0)

    # ------------------------------------------------------------------ Eq. 2-3
    @torch.no_grad()
    def assign(self, x: Tensor) -> Tensor:
        """Eq. 2: ``γ_i(x) = argmin_j ||c_ij - x_i||²`` per sub-space, int64 ``[B, M]``."""
        return self.distances(x.detach()).argmin(-1)

    def reconstruct(self, codes: Tensor) -> Tensor:
        """Eq. 3: ``x̂ = concat_i c_{i, γ_i}`` (rotated back), differentiable w.r.t. the codebooks."""
        codes = codes.long()
        idx = torch.arange(self.m, device=codes.device).unsqueeze(0).expand_as(codes)
        sub = self.codebooks[idx, codes]  # [B, M, ds]
        return self.unrotate(sub.reshape(codes.shape[0], self.dim))

    def soft_assign(self, x: Tensor, tau: float = 1.0) -> Tensor:
        """Soft assignment ``softmax_j(-||c_ij - x_i||² / tau)``: ``[B, M, K]``."""
        return torch.softmax(-self.distances(x) / tau, dim=-1)

    def soft_reconstruct(self, probs: Tensor) -> Tensor:
        """``Σ_j p_ij c_ij`` per sub-space, concatenated and rotated back."""
        sub = torch.einsum("bmk,mkd->bmd", probs, self.codebooks)
        return self.unrotate(sub.reshape(probs.shape[0], self.dim))

    def quantize(self, x: Tensor, mode: QuantizeMode = "ste", tau: float = 1.0) -> tuple[Tensor, Tensor]:
        """Quantized vectors and codes ``(x_q [B, dim], codes [B, M])``.

        ``hard``: ``x̂`` (Eq. 3; gradient reaches the selected centroids only).
        ``ste``: Eq. 7 straight-through ``x̃`` — forward value ``x̂``; gradient reaches ``x``
        (identity) and the selected centroids (see :func:`~scalingnote.pq.losses.straight_through`).
        ``soft``: the soft reconstruction (gradient to ``x`` through the assignment
        probabilities, and to every centroid).
        ``ste_soft``: forward ``x̂``, backward through the soft reconstruction (DPQ, Chen et al. 2020).
        """
        codes = self.assign(x)
        if mode == "hard":
            return self.reconstruct(codes), codes
        if mode == "ste":
            return straight_through(x, self.reconstruct(codes)), codes
        if mode == "soft":
            return self.soft_reconstruct(self.soft_assign(x, tau)), codes
        if mode == "ste_soft":
            soft = self.soft_reconstruct(self.soft_assign(x, tau))
            return soft + (self.reconstruct(codes) - soft).detach(), codes
        raise ValueError(f"mode must be one of hard, ste, soft, ste_soft; got {mode!r}")

    def forward(self, x: Tensor) -> Tensor:
        """Eq. 7: the straight-through quantized vectors."""
        return self.quantize(x, "ste")[0]

    # ------------------------------------------------------------------ numpy helpers
    @torch.no_grad()
    def encode(self, x: np.ndarray, batch_size: int = 8192) -> np.ndarray:
        """Codes of a float array ``(n, dim)``: uint8 when ``nbits <= 8`` else int32."""
        x = np.asarray(x, dtype=np.float32)
        dtype = np.uint8 if self.nbits <= 8 else np.int32
        out = np.empty((x.shape[0], self.m), dtype=dtype)
        dev = self.codebooks.device
        for s in range(0, x.shape[0], batch_size):
            out[s : s + batch_size] = (
                self.assign(torch.from_numpy(x[s : s + batch_size]).to(dev)).cpu().numpy().astype(dtype)
            )
        return out

    @torch.no_grad()
    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Reconstructions ``(n, dim)`` float32 of codes ``(n, M)``."""
        c = torch.from_numpy(np.asarray(codes, dtype=np.int64)).to(self.codebooks.device)
        return self.reconstruct(c).cpu().numpy().astype(np.float32)

    def quantized(self, x: np.ndarray) -> np.ndarray:
        """``decode(encode(x))``: the vectors an index built with these codebooks scores."""
        return self.decode(self.encode(x))

    @torch.no_grad()
    def mse(self, x: np.ndarray) -> float:
        """Mean over vectors of ``||x - x̂||²`` (the reconstruction error of Eq. 4)."""
        x = np.asarray(x, dtype=np.float32)
        return float(((x - self.quantized(x)) ** 2).sum(1).mean()) if len(x) else 0.0

    def describe(self) -> dict:
        return {
            "dim": self.dim,
            "m": self.m,
            "nbits": self.nbits,
            "ksub": self.ksub,
            "dsub": self.dsub,
            "rotation": self.rotation is not None,
            "code_bytes": self.code_bytes,
        }

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``codebooks`` (+ ``rotation``) and the shape to an ``.npz`` file, atomically."""

        path = Path(path)
        arrays = {
            "format": np.array(FORMAT),
            "shape": np.array([self.dim, self.m, self.nbits], dtype=np.int64),
            "codebooks": self.codebooks.detach().cpu().numpy().astype(np.float32),
        }
        if self.rotation is not None:
            arrays["rotation"] = self.rotation.detach().cpu().numpy().astype(np.float32)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, suffix=".npz") as tmp:
            with open(tmp, "wb") as fh:
                # numpy's stub checks **arrays against savez's allow_pickle: bool
                np.savez(fh, **arrays)  # type: ignore[arg-type]
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> LearnedPQ:
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                if str(z["format"]) != FORMAT:
                    raise ScalingNoteError(f"{path}: field 'format' is {str(z['format'])!r}, expected {FORMAT!r}")
                dim, m, nbits = (int(v) for v in z["shape"])
                rot = z["rotation"] if "rotation" in z.files else None
                return cls(dim, m, nbits, codebooks=z["codebooks"], rotation=rot)
        except (OSError, KeyError, ValueError) as e:
            raise ScalingNoteError(f"{path}: not a learned-PQ file ({e})") from None

    # ------------------------------------------------------------------ FAISS initialisation
    @classmethod
    def from_faiss(cls, pq, rotation=None) -> LearnedPQ:
        """From a trained ``faiss.ProductQuantizer`` and optionally an ``OPQMatrix`` /
        ``LinearTransform`` (or a ``[dim, dim]`` array) applied before it."""
        import faiss

        cb = faiss.vector_to_array(pq.centroids).reshape(pq.M, pq.ksub, pq.dsub)
        r = None
        if rotation is not None:
            if isinstance(rotation, np.ndarray):
                r = rotation
            else:
                vt: Any = faiss.downcast_VectorTransform(rotation)  # the stub types it as the base class (no A)
                if vt.d_in != vt.d_out or getattr(vt, "have_bias", False):
                    raise ScalingNoteError("rotation: only a square linear transform without bias is supported")
                r = faiss.vector_to_array(vt.A).reshape(vt.d_out, vt.d_in)
        return cls(int(pq.d), int(pq.M), int(pq.nbits), codebooks=cb, rotation=r)

    @classmethod
    def fit(
        cls,
        x: np.ndarray,
        m: int,
        nbits: int = 8,
        *,
        opq: bool = False,
        seed: int = 0,
        niter: int = 25,
        opq_niter: int = 20,
        train_size: int | None = None,
    ) -> LearnedPQ:
        """Train FAISS PQ (``opq=False``) or OPQ + PQ on ``x`` and wrap the result.

        The same training FAISS's factory does for ``PQ{M}x{nbits}`` /
        ``OPQ{M},PQ{M}x{nbits}`` (k-means per sub-space; OPQ alternates k-means and an
        orthogonal Procrustes rotation update, ``opq_niter`` rounds), seeded, with
        polysemous training off. ``train_size``: seeded random subsample.
        """
        import faiss

        x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
        if x.ndim != 2:
            raise ScalingNoteError(f"PQ training data: expected (n, dim), got shape {x.shape}")
        n, dim = x.shape
        if dim % m:
            raise ScalingNoteError(f"PQ: dim {dim} is not a multiple of M={m}")
        if n < 2**nbits:
            raise ScalingNoteError(f"PQ: {n} training vectors < {2**nbits} centroids per sub-space")
        if train_size is not None and train_size < n:
            rows = np.sort(np.random.default_rng(seed).choice(n, size=train_size, replace=False))
            x = np.ascontiguousarray(x[rows])
        rot = None
        if opq:
            vt = faiss.OPQMatrix(dim, m)
            vt.niter = int(opq_niter)
            inner = faiss.ProductQuantizer(dim, m, nbits)
            _quiet_clustering(inner.cp, seed + 2)
            vt.pq = inner  # OPQ's alternating k-means uses these clustering parameters
            vt.train(x)  # its random initial rotation uses FAISS's fixed internal seed
            vt.pq = None
            rot = faiss.vector_to_array(vt.A).reshape(dim, dim).copy()
            x = np.ascontiguousarray(x @ rot.T)
        pq = faiss.ProductQuantizer(dim, m, nbits)
        _quiet_clustering(pq.cp, seed + 1)
        pq.cp.niter = int(niter)
        pq.train(x)
        return cls.from_faiss(pq, rot)


def _quiet_clustering(cp, seed: int) -> None:
    """Seed a FAISS ``ClusteringParameters`` and drop its 'too few points' warning (a small
    corpus is a legitimate training set for 256 centroids; the warning is printed once per
    sub-space and iteration otherwise)."""
    cp.seed = int(seed)
    cp.min_points_per_centroid = 1
    cp.verbose = False


def pq_state(pq: LearnedPQ) -> dict[str, Any]:
    """The quantizer as plain tensors (detached CPU copies) for a training snapshot."""
    return {
        "shape": (pq.dim, pq.m, pq.nbits),
        "codebooks": pq.codebooks.detach().cpu().clone(),
        "rotation": None if pq.rotation is None else pq.rotation.detach().cpu().clone(),
    }


def pq_from_state(st: dict[str, Any]) -> LearnedPQ:
    """The quantizer of a :func:`pq_state` snapshot."""
    dim, m, nbits = st["shape"]
    return LearnedPQ(dim, m, nbits, codebooks=st["codebooks"], rotation=st["rotation"])
