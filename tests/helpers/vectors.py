"""Vectors for index tests."""

from __future__ import annotations

import numpy as np


def clustered_docs_and_queries(seed: int, n: int, d: int, queries: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors around 40 random centres: ``n`` documents (noise 0.4) and ``queries`` noisier
    (0.6: out of the documents' distribution) queries."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((40, d)).astype(np.float32)

    def draw(m: int, noise: float) -> np.ndarray:
        x = c[rng.integers(0, len(c), m)] + noise * rng.standard_normal((m, d)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    return draw(n, 0.4), draw(queries, 0.6)
