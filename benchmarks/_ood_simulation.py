"""The 1M-document simulation of ``benchmarks.ood_routing``: document vectors sampled from a
probabilistic-PCA mixture fitted to a real set's document vectors (estimates of scale, not real
documents)."""

from __future__ import annotations

import numpy as np


def ppca_mixture(x: np.ndarray, n: int, *, k: int, rank: int, seed: int) -> np.ndarray:
    """``n`` unit vectors sampled from a Gaussian mixture fitted to ``x``: FAISS k-means (``k``
    components, weights = cluster shares); per component its mean and its top ``rank`` principal
    directions with their variances; what those leave (within-component residuals, pooled over all
    components) is one shared full covariance, so the spectrum's decay is kept rather than spread
    evenly over the remaining dimensions (which would make the data artificially high-dimensional)."""
    import faiss

    d = x.shape[1]
    km = faiss.Kmeans(d, k, niter=20, seed=seed)
    km.train(x)
    lab = km.index.search(x, 1)[1].ravel()
    comps, resid = [], []
    for j in range(k):
        m = x[lab == j]
        if len(m) < 3:
            comps.append((m.mean(0) if len(m) else km.centroids[j], np.zeros((0, d)), np.zeros(0)))
            continue
        mu = m.mean(0)
        _, s, vt = np.linalg.svd(m - mu, full_matrices=False)
        r = min(rank, len(s) - 1)
        comps.append((mu, vt[:r], s[:r] / np.sqrt(len(m) - 1)))
        c = m - mu
        resid.append(c - (c @ vt[:r].T) @ vt[:r])
    res = np.concatenate(resid).astype(np.float64)
    chol = np.linalg.cholesky(res.T @ res / len(res) + 1e-8 * np.eye(d))
    w = np.bincount(lab, minlength=k) / len(lab)
    rng = np.random.default_rng(seed)
    out = np.empty((n, d), np.float32)
    which = rng.choice(k, size=n, p=w)
    for j in range(k):
        rows = np.flatnonzero(which == j)
        if not len(rows):
            continue
        mu, vt, sd = comps[j]
        z = rng.standard_normal((len(rows), len(sd))) * sd
        out[rows] = mu + z @ vt + rng.standard_normal((len(rows), d)) @ chol.T
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out
