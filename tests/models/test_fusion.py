"""Fusion towers (ScalingNote §3.5): shapes, identity at the start, errors, and that the Stage I
trainer optimises the fusion parameters with the heads (tiny random towers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scalingnote.errors import ScalingNoteError
from scalingnote.models.fusion import DocumentFeatures, DocumentFusion, FusedPrefixEncoder, QueryFusion


def test_document_fusion_shapes_and_identity_at_start():
    torch.manual_seed(0)
    f = DocumentFusion(16, codebook_sizes=[4, 4, 3], num_categories=5, num_numeric=2)
    e = torch.randn(7, 16)
    codes = torch.randint(0, 3, (7, 3))
    cat = torch.randint(0, 5, (7,))
    num = torch.randn(7, 2)
    out = f(e, codes, cat, num)
    assert out.shape == (7, 16)
    assert torch.equal(out, e)  # W_out = 0: the plain tower
    with torch.no_grad():
        f.out.weight.normal_()
    out2 = f(e, codes, cat, num)
    assert not torch.allclose(out2, e)
    # the same codes give the same fusion vector; other codes another one
    assert torch.allclose(f.side(codes[:1], cat[:1], num[:1]), f.side(codes[:1].clone(), cat[:1], num[:1]))
    with pytest.raises(ScalingNoteError, match=r"semantic IDs must be \[B, 3\]"):
        f(e, codes[:, :2], cat, num)
    with pytest.raises(ScalingNoteError, match="numeric side features"):
        f(e, codes, cat, None)
    with pytest.raises(ScalingNoteError, match="at least one input"):
        DocumentFusion(16)


def test_query_fusion():
    q = QueryFusion(8, 3)
    e = torch.randn(4, 8)
    assert torch.equal(q(e, torch.randn(4, 3)), e)
    with pytest.raises(ScalingNoteError, match=r"context vectors must be \[4, 3\]"):
        q(e, torch.randn(4, 2))


def test_document_features_lookup():
    f = DocumentFeatures(["a", "b"], codes=np.array([[1, 2], [3, 4]]), numeric=np.ones((2, 3), np.float32))
    r = f.rows(["b", "a", "b"])
    assert r["codes"].tolist() == [[3, 4], [1, 2], [3, 4]] and r["cat"] is None and r["num"].shape == (3, 3)
    with pytest.raises(ScalingNoteError, match="no fusion features for document 'c'"):
        f.rows(["c"])
    with pytest.raises(ScalingNoteError, match="codes has 1 rows for 2 documents"):
        DocumentFeatures(["a", "b"], codes=np.zeros((1, 2)))


@pytest.fixture(scope="module")
def heads_setup(tmp_path_factory):
    from scalingnote.scaling.points import make_eval_set
    from scalingnote.training.data import Example
    from tests.helpers.tiny_heads import tiny_head_session

    h = tiny_head_session(tmp_path_factory.mktemp("fusion"), docs_per_topic=6)
    qrels, queries = h.train_qrels, h.queries
    train = [Example(q, queries[q], h.corpus[d], None) for q in sorted(qrels) for d in qrels[q]]
    dev = make_eval_set(queries, {q: qrels[q] for q in sorted(qrels)[:6]}, h.session.doc_ids, num_negatives=8, seed=1)
    return h.session, train, dev, queries


def test_fused_encoder_trains_the_fusion_parameters(heads_setup, tmp_path):
    from scalingnote.scaling.points import PointSettings, train_point

    session, train, dev, queries = heads_setup
    base_q, base_d = session.q_enc, session.d_enc
    ids = session.doc_ids
    topics = sorted({session.docs[i].topic for i in range(len(ids))})
    feats = DocumentFeatures(
        ids, codes=np.arange(len(ids))[:, None] % 4, category=np.array([topics.index(d.topic) for d in session.docs])
    )
    torch.manual_seed(0)
    fus = DocumentFusion(16, codebook_sizes=[4], num_categories=len(topics))
    ctx = {t: np.eye(3, dtype=np.float32)[i % 3] for i, t in enumerate(sorted(queries.values()))}
    try:
        session.d_enc = FusedPrefixEncoder(base_d, fus, feats)
        session.q_enc = FusedPrefixEncoder(base_q, QueryFusion(16, 3), ctx)
        # at the start the fused encoders equal the plain ones
        session.reset()
        assert np.allclose(session.d_enc.encode(session.docs[:5]), base_d.encode(session.docs[:5]), atol=1e-6)
        assert "fusion.out.weight" in dict(session.dt.named_parameters())
        train_point(
            session,
            train,
            dev,
            tmp_path / "p",
            PointSettings(batch_size=8, max_steps=30, min_eval_every=10, patience=10, head_lr=1e-2, lr=1e-2),
        )
        assert fus.out.weight.abs().sum() > 0
        assert session.q_enc.fusion.ctx.weight.abs().sum() > 0
        e = session.d_enc.encode(session.docs[:3])
        assert e.shape == (3, 16) and np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5)
    finally:
        session.q_enc, session.d_enc = base_q, base_d
        for t in (session.qt, session.dt):
            if hasattr(t, "fusion"):
                del t.fusion


def test_synthetic_side_features_and_context():
    import benchmarks.fusion as bf
    from scalingnote.data.synth import SynthConfig, generate

    log = generate(SynthConfig(num_docs=120, num_queries=40, seed=1))
    cat, num, topics, names = bf.side_features(log)
    assert cat.shape == (120,) and num.shape == (120, len(names)) and cat.max() < len(topics)
    assert np.allclose(num.mean(0), 0, atol=1e-5)
    clicked = {r.doc_id for r in log.clicks if r.clicked}
    idx = [i for i, d in enumerate(log.corpus) if d.id in clicked]
    rest = [i for i, d in enumerate(log.corpus) if d.id not in clicked]
    assert num[idx, 1].min() > num[rest, 1].max()  # log click count orders the notes
    ctx = bf.context_vectors(log, topics, seed=0, noise=0.0)
    q = log.queries[0]
    assert ctx[q.text].sum() == 1 and ctx[q.text][topics.index(log.meta["intents"][q.id][0]["topic"])] == 1
