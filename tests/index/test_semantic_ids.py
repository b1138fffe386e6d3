"""Residual K-means semantic IDs (ScalingNote §3.5)."""

from __future__ import annotations

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index import ResidualKMeans


def test_deterministic_for_a_seed(syn_vectors):
    x = syn_vectors[:1500]
    a = ResidualKMeans(n_layers=4, codebook_size=16, seed=3).fit(x)
    b = ResidualKMeans(n_layers=4, codebook_size=16, seed=3).fit(x)
    c = ResidualKMeans(n_layers=4, codebook_size=16, seed=4).fit(x)
    for ca, cb in zip(a.codebooks, b.codebooks, strict=True):
        np.testing.assert_array_equal(ca, cb)
    np.testing.assert_array_equal(a.assign(x), b.assign(x))
    assert not all(np.array_equal(ca, cc) for ca, cc in zip(a.codebooks, c.codebooks, strict=True))


def test_each_layer_lowers_reconstruction_error(syn_vectors):
    train, held_out = syn_vectors[:2000], syn_vectors[2000:]
    rkm = ResidualKMeans(n_layers=6, codebook_size=32, seed=0).fit(train)
    errs = rkm.reconstruction_error(train)
    np.testing.assert_allclose(errs, rkm.train_error, rtol=1e-5)
    base = float(np.mean(np.sum(train * train, axis=1)))  # error of the empty reconstruction
    assert errs[0] < base
    assert all(later < earlier for earlier, later in zip(errs, errs[1:], strict=False)), errs
    # new documents are assigned with the fitted codebooks (no refit) and also improve per layer
    held = rkm.reconstruction_error(held_out)
    assert all(later < earlier for earlier, later in zip(held, held[1:], strict=False)), held
    codes = rkm.assign(held_out)
    assert codes.shape == (len(held_out), 6) and codes.dtype == np.int32
    assert codes.min() >= 0 and codes.max() < 32
    # reconstruct() is the sum of the selected centroids
    r = rkm.reconstruct(codes)
    np.testing.assert_allclose(np.mean(np.sum((held_out - r) ** 2, axis=1)), held[-1], rtol=1e-4)


def test_assignment_is_greedy_nearest_centroid(syn_vectors):
    x = syn_vectors[:500]
    rkm = ResidualKMeans(n_layers=2, codebook_size=8, seed=0).fit(x)
    codes = rkm.assign(x)
    d0 = ((x[:, None, :] - rkm.codebooks[0][None]) ** 2).sum(-1)
    np.testing.assert_array_equal(codes[:, 0], d0.argmin(1))
    r = x - rkm.codebooks[0][codes[:, 0]]
    d1 = ((r[:, None, :] - rkm.codebooks[1][None]) ** 2).sum(-1)
    np.testing.assert_array_equal(codes[:, 1], d1.argmin(1))


def test_save_load_round_trip_and_clamp(tmp_path, syn_vectors):
    x = syn_vectors[:10]
    rkm = ResidualKMeans(n_layers=3, codebook_size=256, seed=1).fit(x)
    assert rkm.codebook_sizes == [10, 10, 10]  # clamped to the number of training points
    rkm.save(tmp_path / "sid.npz")
    back = ResidualKMeans.load(tmp_path / "sid.npz")
    assert back.describe() == rkm.describe()
    np.testing.assert_array_equal(back.assign(syn_vectors[:100]), rkm.assign(syn_vectors[:100]))


def test_errors(tmp_path, syn_vectors):
    with pytest.raises(ScalingNoteError, match="not fitted"):
        ResidualKMeans().assign(syn_vectors[:5])
    rkm = ResidualKMeans(n_layers=1, codebook_size=4).fit(syn_vectors[:50])
    with pytest.raises(ScalingNoteError, match="shape"):
        rkm.assign(syn_vectors[:5, :8])
    with pytest.raises(ScalingNoteError, match="n_layers"):
        ResidualKMeans(n_layers=0)
    with pytest.raises(ScalingNoteError, match="not found"):
        ResidualKMeans.load(tmp_path / "nope.npz")
