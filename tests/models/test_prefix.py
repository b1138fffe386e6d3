"""Cached frozen-prefix features: exactness against a full forward pass, keys, refusal, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scalingnote.data import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.models import FeatureCache, PrefixTower, fill_pooled_depths, freeze_prefix, load_tower
from scalingnote.models.prefix import cache_key, fill_cache, item_key
from scalingnote.training.losses import scalingnote_loss

DOCS = [Document(id=str(i), title=f"title {i} alpha", topic="topic", content=" ".join(f"w{j}" for j in range(2 + 3 * i))) for i in range(6)]
QUERIES = [("how " * (1 + i % 3)) + f"query {i}" for i in range(6)]


def _towers(tiny_dirs, kind, pooling):
    arch = "llama" if kind == "llm" else "bert"
    q = load_tower(tiny_dirs[arch], "query", dim=16, matryoshka_dims=[8, 16], pooling=pooling)
    d = load_tower(tiny_dirs[arch], "document", dim=16, matryoshka_dims=[8, 16], pooling=pooling, max_doc_length=64)
    return q, d


def _loss(q, views):
    n = len(QUERIES)
    pos = {k: v[:n] for k, v in views.items()}
    neg = {k: v[n:] for k, v in views.items()}
    loss, _ = scalingnote_loss(q, pos, neg, dims=[8, 16], tau=0.05, margin=0.2, alpha=0.5)
    return loss


@pytest.mark.parametrize("kind,pooling", [("llm", None), ("llm", "mean"), ("bert", "cls"), ("bert", "mean")])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_prefix_training_equals_full_forward_with_frozen_bottom(tiny_dirs, tmp_path, kind, pooling, k):
    docs = DOCS + DOCS[::-1]  # positives, then negatives
    grads, losses = [], []
    for cached in (False, True):
        torch.manual_seed(0)
        q, d = _towers(tiny_dirs, kind, pooling)
        q.eval(), d.eval()  # dropout off: the cached prefix was computed without it
        if cached:
            qp = PrefixTower(q, k, tmp_path / "cache", show_progress=False)
            dp = PrefixTower(d, k, tmp_path / "cache", show_progress=False)
            loss = _loss(qp.queries(QUERIES), dp.documents(docs))
        else:
            freeze_prefix(q, k)
            freeze_prefix(d, k)
            qb, db = q.tokenize_queries(QUERIES), d.tokenize_documents(docs)
            loss = _loss(q(qb), d(db))
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({f"{t}.{n}": p.grad.clone() for t, m in (("q", q), ("d", d)) for n, p in m.named_parameters() if p.grad is not None})
    assert abs(losses[0] - losses[1]) < 1e-5
    assert grads[0].keys() == grads[1].keys()
    trainable = {n.split(".", 1)[1] for n in grads[0]}
    assert any(n.startswith("projection") for n in trainable)
    if k == 0:
        assert all(n.startswith("projection") for n in trainable)  # heads only
    else:
        assert any(not n.startswith("projection") for n in trainable)  # the top k layers train
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-5, rtol=1e-4, msg=n)


def test_frozen_layers_are_the_bottom_ones(tiny_dirs):
    q, _ = _towers(tiny_dirs, "llm", "mean")
    freeze_prefix(q, 1)  # 3 layers: 0 and 1 frozen, 2 trains
    train = {n for n, p in q.named_parameters() if p.requires_grad}
    assert any(".layers.2." in n for n in train)
    assert not any(".layers.0." in n or ".layers.1." in n or "embed" in n for n in train)


def test_one_pass_fills_every_depth_with_the_truncated_towers_keys(tiny_dirs, tmp_path):
    full = load_tower(tiny_dirs["llama"], "document", pooling="mean", max_doc_length=64)
    fill_pooled_depths(tmp_path, full, [1, 2, 3], DOCS, show_progress=False)
    for n in (1, 2, 3):
        t = load_tower(tiny_dirs["llama"], "document", pooling="mean", max_doc_length=64, num_layers=n, dim=16, matryoshka_dims=[8, 16])
        pt = PrefixTower(t, 0, tmp_path, show_progress=False)
        assert len(pt.cache) == len(DOCS)  # found, nothing recomputed
        ref = t.pooled(t.tokenize_documents(DOCS))
        torch.testing.assert_close(pt.pooled(DOCS), ref, atol=1e-5, rtol=1e-5)


def test_cache_of_other_weights_or_settings_is_refused(tiny_dirs, tmp_path):
    q, _ = _towers(tiny_dirs, "bert", "mean")
    key = cache_key(q, 1)
    FeatureCache(tmp_path / "c", key)
    other = dict(key, max_length=key["max_length"] + 1)
    with pytest.raises(ScalingNoteError, match="max_length"):
        FeatureCache(tmp_path / "c", other)
    # changed frozen weights give another key: a stale cache can never be read for them
    with torch.no_grad():
        q.backbone.embeddings.word_embeddings.weight.add_(0.01)
    assert cache_key(q, 1)["weights"] != key["weights"]
    # ... but a change in a trainable layer keeps the prefix key
    key2 = cache_key(q, 1)
    with torch.no_grad():
        q.backbone.encoder.layer[-1].output.dense.weight.add_(0.01)
    assert cache_key(q, 1) == key2


def test_interrupted_fill_keeps_finished_parts_and_resumes(tiny_dirs, tmp_path, monkeypatch):
    q, _ = _towers(tiny_dirs, "llm", "mean")
    cache = FeatureCache.for_tower(tmp_path, q, 0)
    calls = {"n": 0}
    orig = FeatureCache.add

    def flaky(self, keys, feats):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # killed while writing the second part
        return orig(self, keys, feats)

    monkeypatch.setattr(FeatureCache, "add", flaky)
    with pytest.raises(KeyboardInterrupt):
        fill_cache(cache, q, 0, QUERIES, part_size=2, show_progress=False)
    monkeypatch.setattr(FeatureCache, "add", orig)
    reopened = FeatureCache.for_tower(tmp_path, q, 0)
    assert len(reopened) == 2  # the first part survived
    assert fill_cache(reopened, q, 0, QUERIES, part_size=2, show_progress=False) == len(QUERIES) - 2
    ref = q.pooled(q.tokenize_queries(QUERIES)).detach().numpy()
    got = reopened.pooled_rows([item_key(x) for x in QUERIES])[:, 0]
    np.testing.assert_allclose(got, ref, atol=1e-6)
    assert not list(tmp_path.rglob("*.tmp*"))  # no half-written file left behind
