"""Semantic IDs by L-layer residual K-means (ScalingNote §3.5).

ScalingNote §3.5: "we employ 6-layer residual K-means clustering. Every time the
system encodes a new document, the LLM-based document tower is used to generate
the embedding and cluster it into specific clustering centers. We assign the
clustering center IDs as the semantic IDs."

Layer ``l`` runs K-means (``faiss.Kmeans``, seeded) on the residuals left by
layers ``0..l-1``::

    r_0 = x
    a_l = argmin_j || r_l - C_l[j] ||^2
    r_{l+1} = r_l - C_l[a_l]

A document's semantic ID is the tuple ``(a_0, ..., a_{L-1})``; its
reconstruction after ``l`` layers is ``sum_{i<l} C_i[a_i]``. New documents are
assigned with the fitted codebooks, without refitting.

This is deliberately the plain residual K-means of the paper (greedy nearest
centroid per layer), not FAISS's ``ResidualQuantizer`` (beam search, codebook
refinement).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.utils.io import atomic_path

FORMAT = "scalingnote-residual-kmeans/1"


def _as_f32(x: np.ndarray, what: str = "vectors") -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ScalingNoteError(f"{what}: expected a 2-D array (n, dim), got shape {x.shape}")
    return np.ascontiguousarray(x, dtype=np.float32)


class ResidualKMeans:
    """L-layer residual K-means quantiser producing semantic IDs.

    Parameters
    ----------
    n_layers: number of layers ``L`` (ScalingNote uses 6).
    codebook_size: centroids per layer ``K``; clamped to the number of training
        points at :meth:`fit` (the effective size is :attr:`codebook_sizes`).
    seed: base seed; layer ``l`` uses ``seed + l``.
    niter: K-means iterations per layer.
    max_points_per_centroid: FAISS subsamples the training set to ``K`` times this
        per layer (seeded), which bounds the fit time on large corpora.
    """

    def __init__(
        self,
        n_layers: int = 6,
        codebook_size: int = 256,
        seed: int = 0,
        niter: int = 20,
        max_points_per_centroid: int = 256,
    ):
        if n_layers < 1:
            raise ScalingNoteError(f"semantic IDs: n_layers must be >= 1, got {n_layers}")
        if codebook_size < 1:
            raise ScalingNoteError(f"semantic IDs: codebook_size must be >= 1, got {codebook_size}")
        self.n_layers = int(n_layers)
        self.codebook_size = int(codebook_size)
        self.seed = int(seed)
        self.niter = int(niter)
        self.max_points_per_centroid = int(max_points_per_centroid)
        self.codebooks: list[np.ndarray] = []  # layer l: (K_l, dim) float32
        self.train_error: list[float] = []  # mean squared reconstruction error after l+1 layers (training set)

    # ------------------------------------------------------------------ fit
    @property
    def is_fitted(self) -> bool:
        return len(self.codebooks) == self.n_layers

    @property
    def dim(self) -> int:
        self._check_fitted()
        return int(self.codebooks[0].shape[1])

    @property
    def codebook_sizes(self) -> list[int]:
        return [int(c.shape[0]) for c in self.codebooks]

    def fit(self, x: np.ndarray) -> ResidualKMeans:
        """Fit the ``L`` codebooks on ``x`` (n, dim). Deterministic for a given seed."""
        import faiss

        x = _as_f32(x, "semantic IDs training vectors")
        n, d = x.shape
        if n == 0:
            raise ScalingNoteError("semantic IDs: cannot fit on 0 vectors")
        k = min(self.codebook_size, n)
        residual = x.copy()
        self.codebooks, self.train_error = [], []
        for layer in range(self.n_layers):
            km = faiss.Kmeans(
                d,
                k,
                niter=self.niter,
                seed=self.seed + layer,
                max_points_per_centroid=self.max_points_per_centroid,
                min_points_per_centroid=1,
                verbose=False,
            )
            km.train(residual)
            cents = np.ascontiguousarray(km.centroids, dtype=np.float32).reshape(k, d)
            codes = _nearest(cents, residual)
            residual -= cents[codes]
            self.codebooks.append(cents)
            self.train_error.append(float(np.mean(np.sum(residual * residual, axis=1))))
        return self

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise ScalingNoteError("semantic IDs: ResidualKMeans is not fitted (call fit() or load())")

    # --------------------------------------------------------------- assign
    def assign(self, x: np.ndarray, batch_size: int = 65536) -> np.ndarray:
        """Semantic IDs of ``x``: int32 array (n, L), greedy nearest centroid per layer."""
        self._check_fitted()
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ScalingNoteError(f"semantic IDs: expected vectors of shape (n, {self.dim}), got {x.shape}")
        out = np.empty((x.shape[0], self.n_layers), dtype=np.int32)
        for s in range(0, x.shape[0], batch_size):
            r = np.array(x[s : s + batch_size], dtype=np.float32, copy=True)
            for layer, cents in enumerate(self.codebooks):
                codes = _nearest(cents, r)
                out[s : s + len(r), layer] = codes
                r -= cents[codes]
        return out

    def reconstruct(self, codes: np.ndarray, n_layers: int | None = None) -> np.ndarray:
        """Sum of the first ``n_layers`` (default all) centroids selected by ``codes``."""
        self._check_fitted()
        codes = np.asarray(codes)
        n_layers = self.n_layers if n_layers is None else n_layers
        out = np.zeros((codes.shape[0], self.dim), dtype=np.float32)
        for layer in range(n_layers):
            out += self.codebooks[layer][codes[:, layer]]
        return out

    def reconstruction_error(self, x: np.ndarray) -> list[float]:
        """Mean squared reconstruction error ``E||x - x_hat_l||^2`` after each layer ``l = 1..L``."""
        x = _as_f32(x)
        codes = self.assign(x)
        r = x.copy()
        errs = []
        for layer in range(self.n_layers):
            r -= self.codebooks[layer][codes[:, layer]]
            errs.append(float(np.mean(np.sum(r * r, axis=1))))
        return errs

    # ------------------------------------------------------------ save/load
    def save(self, path: str | Path) -> None:
        """Atomically write the codebooks and settings to one ``.npz`` file."""
        self._check_fitted()
        path = Path(path)
        arrays = {f"codebook_{i}": c for i, c in enumerate(self.codebooks)}
        with atomic_path(path, suffix=".npz") as tmp:
            with open(tmp, "wb") as fh:
                np.savez(
                    fh,
                    format=np.array(FORMAT),
                    n_layers=np.array(self.n_layers),
                    codebook_size=np.array(self.codebook_size),
                    seed=np.array(self.seed),
                    niter=np.array(self.niter),
                    max_points_per_centroid=np.array(self.max_points_per_centroid),
                    train_error=np.array(self.train_error, dtype=np.float64),
                    # numpy's stub checks **arrays against savez's allow_pickle: bool
                    **arrays,  # type: ignore[arg-type]
                )

    @classmethod
    def load(cls, path: str | Path) -> ResidualKMeans:
        path = Path(path)
        if not path.is_file():
            raise ScalingNoteError(f"{path}: semantic-ID codebooks not found")
        try:
            z = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ScalingNoteError(f"{path}: not a readable semantic-ID codebook file ({e})") from None
        with z:
            if "format" not in z or str(z["format"]) != FORMAT:
                raise ScalingNoteError(f"{path}: not a {FORMAT} file")
            obj = cls(
                n_layers=int(z["n_layers"]),
                codebook_size=int(z["codebook_size"]),
                seed=int(z["seed"]),
                niter=int(z["niter"]),
                max_points_per_centroid=int(z["max_points_per_centroid"]),
            )
            obj.codebooks = [np.ascontiguousarray(z[f"codebook_{i}"], dtype=np.float32) for i in range(obj.n_layers)]
            obj.train_error = [float(v) for v in z["train_error"]]
        return obj

    def describe(self) -> dict:
        return {
            "n_layers": self.n_layers,
            "codebook_size": self.codebook_size,
            "codebook_sizes": self.codebook_sizes,
            "seed": self.seed,
            "niter": self.niter,
            "train_mse_per_layer": list(self.train_error),
        }


def _nearest(centroids: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid (L2) for each row of ``x``."""
    import faiss

    index = faiss.IndexFlatL2(centroids.shape[1])
    index.add(centroids)
    _, idx = index.search(np.ascontiguousarray(x, dtype=np.float32), 1)
    return idx[:, 0].astype(np.int64)
