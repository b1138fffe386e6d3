"""Learned PQ (TMJ): module, losses, straight-through estimator, export to FAISS, negative mining."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scalingnote.errors import ScalingNoteError
from scalingnote.pq import (
    LearnedPQ,
    dense_retrieval_loss,
    export_index,
    faiss_codes,
    faiss_index,
    joint_loss,
    multitask_loss,
    parse_kind,
    pq_oriented_negatives,
    pq_retrieval_loss,
    reconstruction_loss,
    retrieval_loss,
    sample_negatives,
    search,
    stage1_loss,
    straight_through,
    top_negatives,
)
from tests.index.conftest import clustered_vectors


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def vecs() -> np.ndarray:
    return clustered_vectors(800, 16, n_clusters=12, seed=3)


@pytest.fixture(scope="module", params=[False, True], ids=["pq", "opq"])
def trained_pq(request, vecs) -> LearnedPQ:
    pq = LearnedPQ.fit(vecs, m=4, nbits=5, opq=request.param, seed=0, niter=10, opq_niter=3)
    # move the codebooks away from the FAISS solution, as training does
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        pq.codebooks.add_(0.02 * torch.randn(pq.codebooks.shape, generator=g))
    return pq


# ----------------------------------------------------------------------------- module
def test_module_shapes_assign_and_reconstruct(trained_pq, vecs):
    pq = trained_pq
    x = torch.from_numpy(vecs[:50])
    codes = pq.assign(x)
    assert codes.shape == (50, 4) and codes.dtype == torch.int64
    assert int(codes.max()) < 32
    # Eq. 2: the assigned centroid is the nearest one in every sub-space
    dist = pq.distances(x)
    chosen = dist.gather(-1, codes.unsqueeze(-1)).squeeze(-1)
    assert torch.all(chosen <= dist.min(-1).values + 1e-6)
    # Eq. 3: the reconstruction, rotated into the PQ space, is the concatenation of the centroids
    rec = pq.reconstruct(codes)
    sub = pq.rotate(rec).reshape(50, 4, 4)
    for i in range(4):
        assert torch.allclose(sub[:, i], pq.codebooks[i, codes[:, i]], atol=1e-5)
    # soft assignment: rows are distributions; a very low temperature recovers the hard reconstruction
    p = pq.soft_assign(x, tau=1e-4)
    assert torch.allclose(p.sum(-1), torch.ones(50, 4), atol=1e-5)
    two = dist.topk(2, dim=-1, largest=False).values
    clear = ((two[..., 1] - two[..., 0]) > 1e-2).all(-1)  # no near-tie in any sub-space
    assert clear.sum() > 10
    assert torch.allclose(pq.soft_reconstruct(p)[clear], rec[clear], atol=1e-4)
    assert pq.code_bytes == 3  # 4 x 5 bits
    assert pq.mse(vecs) < ((vecs - vecs.mean(0)) ** 2).sum(1).mean()


def test_rotation_must_be_orthogonal():
    with pytest.raises(ScalingNoteError, match="orthogonal"):
        LearnedPQ(8, 2, 2, rotation=np.eye(8, dtype=np.float32) * 2)
    with pytest.raises(ScalingNoteError, match="multiple"):
        LearnedPQ(10, 4, 2)


def test_save_load_roundtrip(trained_pq, vecs, tmp_path):
    p = trained_pq.save(tmp_path / "pq.npz")
    back = LearnedPQ.load(p)
    assert back.describe() == trained_pq.describe()
    np.testing.assert_array_equal(back.encode(vecs), trained_pq.encode(vecs))
    (tmp_path / "bad.npz").write_bytes(b"not an npz")
    with pytest.raises(ScalingNoteError, match="bad.npz"):
        LearnedPQ.load(tmp_path / "bad.npz")


# ----------------------------------------------------------------------------- losses and STE
def test_ste_gradients_reach_encoder_and_centroids(vecs):
    torch.manual_seed(0)
    pq = LearnedPQ.fit(vecs, m=4, nbits=4, seed=0, niter=5)
    encoder = torch.nn.Linear(16, 16, bias=False)  # stands for the document tower
    q = F.normalize(torch.randn(6, 16), dim=-1)
    d = F.normalize(encoder(torch.from_numpy(vecs[:10])), dim=-1)
    codes = pq.assign(d)
    d_hat = pq.reconstruct(codes)
    d_tilde = straight_through(d, d_hat)
    assert torch.allclose(d_tilde, d_hat, atol=1e-6)  # forward value is the quantized vector (Eq. 7)
    d_tilde.retain_grad()
    loss = pq_retrieval_loss(q, d_tilde, torch.arange(6), tau=0.05)
    loss.backward()
    assert encoder.weight.grad is not None and encoder.weight.grad.abs().sum() > 0
    g = pq.codebooks.grad
    assert g is not None and g.abs().sum() > 0
    used = torch.zeros(4, 16, dtype=torch.bool)
    used[torch.arange(4).unsqueeze(0).expand_as(codes), codes] = True
    assert g[~used].abs().max() == 0  # only the selected centroids are trained
    assert g[used].abs().sum(-1).min() > 0  # ... and every selected centroid is
    # ∂d̃/∂d = I: the encoder receives exactly the gradient of the quantized vectors
    d2 = d.detach().clone().requires_grad_()
    straight_through(d2, d_hat.detach()).backward(d_tilde.grad)
    assert torch.allclose(d2.grad, d_tilde.grad)


def test_literal_eq7_blocks_the_centroid_gradient(vecs):
    pq = LearnedPQ.fit(vecs, m=4, nbits=4, seed=0, niter=5)
    d = torch.from_numpy(vecs[:8]).requires_grad_()
    out = straight_through(d, pq.reconstruct(pq.assign(d)), centroid_grad=False)
    out.sum().backward()
    assert pq.codebooks.grad is None or pq.codebooks.grad.abs().sum() == 0
    assert torch.allclose(d.grad, torch.ones_like(d))


def test_reconstruction_loss_decreases_training_centroids_only(vecs):
    x = torch.from_numpy(vecs)
    pq = LearnedPQ(16, 4, 4, codebooks=0.3 * torch.randn(4, 16, 4, generator=torch.Generator().manual_seed(0)))
    x_req = x.clone().requires_grad_()
    opt = torch.optim.Adam([pq.codebooks], lr=0.02)
    first = None
    for _ in range(60):
        l_m = reconstruction_loss(x_req, pq.reconstruct(pq.assign(x_req)))
        first = float(l_m.detach()) if first is None else first
        opt.zero_grad()
        l_m.backward()
        opt.step()
    with torch.no_grad():
        last = float(reconstruction_loss(x, pq.reconstruct(pq.assign(x))))
    assert last < 0.5 * first
    assert x_req.grad is None or x_req.grad.abs().sum() == 0  # sg(d): Eq. 4 never trains the encoder


def test_retrieval_losses_and_combinations():
    g = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(3, 8, generator=g), dim=-1)
    c = F.normalize(torch.randn(5, 8, generator=g), dim=-1)
    t = torch.tensor([0, 2, 4])
    s = q @ c.T / 0.1
    manual = -(s[torch.arange(3), t] - torch.logsumexp(s, dim=1)).mean()
    assert torch.allclose(retrieval_loss(q, c, t, 0.1), manual)
    assert torch.allclose(dense_retrieval_loss(q, c, t, 0.1), manual)
    # masked candidates (a query's other positives) leave the denominator; the target never does
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[0, 1] = True
    mask[1, 2] = True  # own target: ignored
    keep = torch.ones(5, dtype=torch.bool)
    keep[1] = False
    row0 = -(s[0, 0] - torch.logsumexp(s[0, keep], dim=0))
    rows12 = -(s[torch.arange(1, 3), t[1:]] - torch.logsumexp(s[1:], dim=1))
    assert torch.allclose(retrieval_loss(q, c, t, 0.1, mask), (row0 + rows12.sum()) / 3)
    a, b, d = torch.tensor(1.0), torch.tensor(2.0), torch.tensor(4.0)
    assert float(joint_loss(a, b)) == 3.0  # Eq. 8
    assert float(multitask_loss(a, b, d)) == 7.0  # Eq. 9
    assert float(multitask_loss(a, b, d, {"r": 0.5})) == 5.0


def test_stage1_loss_l1_vs_l0(vecs):
    pq = LearnedPQ.fit(vecs, m=4, nbits=4, seed=0, niter=5)
    q = F.normalize(torch.randn(4, 16, generator=torch.Generator().manual_seed(2)), dim=-1)
    d = torch.from_numpy(vecs[:6]).requires_grad_()
    d_hat = pq.reconstruct(pq.assign(d))
    t = torch.arange(4)
    l1, c1 = stage1_loss(q, d, d_hat, t, tau=0.05, kind="l1")
    assert c1["loss"] == pytest.approx(c1["loss_m"] + c1["loss_rhat"] + c1["loss_r"], rel=1e-5)
    l0, c0 = stage1_loss(q, d, d_hat, t, tau=0.05, kind="l0")
    assert c0["loss"] == pytest.approx(c0["loss_m"] + c0["loss_rhat"], rel=1e-5)
    assert c0["loss_r"] == pytest.approx(c1["loss_r"], rel=1e-5)  # logged, not optimised
    with pytest.raises(ValueError, match="kind must be 'l1' or 'l0', got 'l2'"):
        stage1_loss(q, d, d_hat, t, tau=0.05, kind="l2")


# ----------------------------------------------------------------------------- export
def test_export_roundtrip_codes_and_distances(trained_pq, vecs):
    pq = trained_pq
    rng = np.random.default_rng(5)
    q = _unit(vecs[rng.choice(len(vecs), 20)] + 0.3 * rng.normal(size=(20, 16)))
    codes = pq.encode(vecs)
    ref = q @ pq.quantized(vecs).T
    idx = faiss_index(pq, "PQ")
    idx.add(vecs)
    # FAISS packs 5-bit codes: compare through its own decoder of our codes
    fc = faiss_codes(idx, vecs)
    import faiss

    inner = (
        faiss.downcast_index(idx.index)
        if isinstance(faiss.downcast_index(idx), faiss.IndexPreTransform)
        else faiss.downcast_index(idx)
    )
    assert np.array_equal(inner.pq.compute_codes(np.ascontiguousarray(pq.rotate(torch.from_numpy(vecs)).numpy())), fc)
    dec = inner.pq.decode(fc)
    np.testing.assert_allclose(dec, pq.rotate(torch.from_numpy(pq.decode(codes))).numpy(), atol=1e-5)
    dists, ids = idx.search(q, 10)
    np.testing.assert_allclose(dists, np.take_along_axis(ref, ids, axis=1), atol=1e-5)
    np.testing.assert_allclose(dists, -np.sort(-ref, axis=1)[:, :10], atol=1e-5)
    # IVF with flat (non-residual) codes: same scores when every list is probed
    ivf = faiss_index(pq, "IVF8,PQ", train_vectors=vecs)
    ivf.add(vecs)
    faiss.extract_index_ivf(ivf).nprobe = 8
    ivf_dists, _ = ivf.search(q, 10)
    np.testing.assert_allclose(ivf_dists, dists, atol=1e-5)
    # HNSW storage holds the same codes
    h = faiss_index(pq, "HNSW8,PQ")
    h.add(vecs)
    assert np.array_equal(faiss_codes(h, vecs), fc)


def test_export_8bit_codes_equal_module_codes(vecs):
    pq = LearnedPQ.fit(vecs, m=4, nbits=8, seed=0, niter=4)
    with torch.no_grad():
        pq.codebooks.mul_(1.05)
    idx = faiss_index(pq, "PQ")
    assert np.array_equal(faiss_codes(idx, vecs), pq.encode(vecs))


def test_parse_kind():
    assert parse_kind("PQ") == ("pq", None)
    assert parse_kind("IVF64,PQ") == ("ivf", 64)
    assert parse_kind("HNSW32,PQ") == ("hnsw", 32)
    for bad in ("IVF,PQ", "Flat", "HNSW32PQ", "PQ16"):
        with pytest.raises(ScalingNoteError):
            parse_kind(bad)


def test_exported_index_opens_with_dense_index_and_searches(tmp_path, query_tower, doc_tower, tiny_corpus):
    from scalingnote.index import DenseIndex, tower_identity

    # Well-separated random unit vectors (the tiny random tower's embeddings are nearly identical,
    # so float32 rounding would reorder near-ties); the tower only provides the identity checks.
    rng = np.random.default_rng(0)
    dim = doc_tower.out_dim
    X = rng.standard_normal((len(tiny_corpus), dim)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    pq = LearnedPQ.fit(X, m=4, nbits=4, opq=True, seed=0, niter=5, opq_niter=2)
    ids = [d.id for d in tiny_corpus]
    queries = rng.standard_normal((2, dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    qv = queries
    ref = qv @ pq.quantized(X).T
    for kind in ("PQ", "IVF4,PQ", "HNSW8,PQ"):
        path = export_index(
            pq, X, ids, tmp_path / kind.replace(",", "_"), kind, tower_info=tower_identity(doc_tower), nprobe=4
        )
        idx = DenseIndex.open(path, query_tower=query_tower)
        assert idx.manifest["learned_pq"]["m"] == 4 and idx.manifest["code_bytes_per_vector"] == 2
        assert idx.factory.startswith("learned:OPQ4,")
        res = idx.search(queries, k=5)
        assert [len(r) for r in res.doc_ids] == [5, 5]
        if kind != "HNSW8,PQ":  # inner-product indexes return exactly <q, x̂>
            top = np.argsort(-ref, axis=1)[:, :5]
            np.testing.assert_allclose(res.scores, np.take_along_axis(ref, top, axis=1), atol=1e-5)
        # dense re-rank (TMJ §6) returns exact inner products with the stored vectors
        rr = idx.search(queries, k=3, rerank=20)
        exact = qv @ (X / np.linalg.norm(X, axis=1, keepdims=True)).T
        for i, row in enumerate(rr.indices):
            np.testing.assert_allclose(rr.scores[i], exact[i, row], atol=1e-5)


# ----------------------------------------------------------------------------- mining
def test_pq_oriented_negatives_hand_made():
    pq_rank = np.array([[5, 1, 7, 3, 9, 2], [0, 4, 6, 8, 1, 3]])
    flat_rank = np.array([[1, 2, 3, 4, 5, 6], [8, 0, 2, 6, 9, 7]])
    positives = [{1}, {0, 9}]
    got = pq_oriented_negatives(pq_rank, flat_rank, positives, depth=5)
    # query 0: S_c = {5,1,7,3,9}, S_u = {1,2,3,4,5}: S_c ∩ S_u = {5,1,3} minus positive 1 -> [5, 3] (PQ order)
    # query 1: S_c = {0,4,6,8,1}, S_u = {8,0,2,6,9}: {0,6,8} minus positive 0 -> [6, 8]
    assert [g.tolist() for g in got] == [[5, 3], [6, 8]]
    top = pq_oriented_negatives(pq_rank, flat_rank, positives, depth=5, rule="pq_top")
    assert [g.tolist() for g in top] == [[5, 7, 3, 9], [4, 6, 8, 1]]
    diff = pq_oriented_negatives(pq_rank, flat_rank, positives, depth=5, rule="difference")
    assert [g.tolist() for g in diff] == [[2, 4], [2]]  # S_u - S_c minus positives (9 is a positive)
    assert [g.tolist() for g in top_negatives(pq_rank, positives, depth=3)] == [[5, 7], [4, 6]]


def test_search_and_sampling():
    rng = np.random.default_rng(0)
    docs = _unit(rng.normal(size=(50, 8)))
    q = docs[:3]
    top = search(q, docs, 5)
    assert top[:, 0].tolist() == [0, 1, 2]
    assert np.all(np.diff(np.take_along_axis(q @ docs.T, top, axis=1), axis=1) <= 1e-7)
    pool = np.array([4, 5, 6])
    s = sample_negatives(np.random.default_rng(1), pool, 2, 50, {0})
    assert len(set(s.tolist())) == 2 and set(s.tolist()) <= {4, 5, 6}
    s = sample_negatives(np.random.default_rng(1), pool, 5, 50, {0})
    assert len(s) == 5 and set(s.tolist()) <= {4, 5, 6}
    s = sample_negatives(np.random.default_rng(1), np.zeros(0, np.int64), 4, 50, {0, 1})
    assert len(s) == 4 and not (set(s.tolist()) & {0, 1})
