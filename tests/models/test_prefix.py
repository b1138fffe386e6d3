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

DOCS = [
    Document(id=str(i), title=f"title {i} alpha", topic="topic", content=" ".join(f"w{j}" for j in range(2 + 3 * i)))
    for i in range(6)
]
QUERIES = [("how " * (1 + i % 3)) + f"query {i}" for i in range(6)]


def _towers(tiny_dirs, kind, pooling):
    arch = "llama" if kind == "llm" else "bert"
    q = load_tower(tiny_dirs[arch], "query", dim=16, matryoshka_dims=[8, 16], pooling=pooling)
    d = load_tower(tiny_dirs[arch], "document", dim=16, matryoshka_dims=[8, 16], pooling=pooling, max_doc_length=64)
    return q, d


def _step(tiny_dirs, tmp_path, kind, pooling, k, cached, *, dtype="float32", lora=None):
    """Loss and gradients of one training step (query + document tower) with the bottom frozen:
    over the cache (``cached``) or a full forward pass."""
    from scalingnote.models.prefix import add_top_lora

    docs = DOCS + DOCS[::-1]  # positives, then negatives
    torch.manual_seed(0)
    q, d = _towers(tiny_dirs, kind, pooling)
    q.eval(), d.eval()  # dropout off: the cached prefix was computed without it
    if cached:
        qp = PrefixTower(q, k, tmp_path / "cache", show_progress=False, dtype=dtype, lora=lora)
        dp = PrefixTower(d, k, tmp_path / "cache", show_progress=False, dtype=dtype, lora=lora)
    else:
        for t in (q, d):
            freeze_prefix(t, k)
            if lora is not None:
                add_top_lora(t, k, lora)
    if lora is not None:  # B starts at 0 (no gradient for A): give it seeded values so both matter
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for t in (q, d):
                for n, p in t.named_parameters():
                    if "lora_B" in n:
                        p.copy_(0.1 * torch.randn(p.shape, generator=g))
    if cached:
        loss = _loss(qp.queries(QUERIES), dp.documents(docs))
    else:
        loss = _loss(q(q.tokenize_queries(QUERIES)), d(d.tokenize_documents(docs)))
    loss.backward()
    grads = {
        f"{t}.{n}": p.grad.clone()
        for t, m in (("q", q), ("d", d))
        for n, p in m.named_parameters()
        if p.grad is not None
    }
    return float(loss.detach()), grads, (q, d)


def _loss(q, views):
    n = len(QUERIES)
    pos = {k: v[:n] for k, v in views.items()}
    neg = {k: v[n:] for k, v in views.items()}
    loss, _ = scalingnote_loss(q, pos, neg, dims=[8, 16], tau=0.05, margin=0.2, alpha=0.5)
    return loss


@pytest.mark.parametrize("kind,pooling", [("llm", None), ("llm", "mean"), ("bert", "cls"), ("bert", "mean")])
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_prefix_training_equals_full_forward_with_frozen_bottom(tiny_dirs, tmp_path, kind, pooling, k):
    """float32 cache: the loss and every gradient of both towers equal a full forward (1e-5);
    ``llm`` / None is the §3.2 document prompt read at its 3 placeholders; k = 3 caches the embeddings."""
    ref_loss, ref, _ = _step(tiny_dirs, tmp_path, kind, pooling, k, cached=False)
    loss, got, _ = _step(tiny_dirs, tmp_path, kind, pooling, k, cached=True)
    assert abs(ref_loss - loss) < 1e-5
    assert ref.keys() == got.keys()
    trainable = {n.split(".", 1)[1] for n in ref}
    assert any(n.startswith("projection") for n in trainable)
    if k == 0:
        assert all(n.startswith("projection") for n in trainable)  # heads only
    else:
        assert any(not n.startswith("projection") for n in trainable)  # the top k layers train
        assert {t for t in ("q", "d") if any(n.startswith(t + ".backbone") for n in ref)} == {
            "q",
            "d",
        }  # in both towers
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], atol=1e-5, rtol=1e-4, msg=n)


def test_every_layer_trainable_runs_the_embeddings_live_without_dropout(tiny_dirs, tmp_path):
    """k = L: no cache is written; in train mode the embedding block still runs as the cache's
    states would have been computed (no dropout), and its own mode is left as it was."""
    q, _ = _towers(tiny_dirs, "bert", "mean")
    for m in q.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    q.backbone.embeddings.dropout.p = 0.9  # would change the states if it ran
    with torch.no_grad():
        q.eval()
        ref = q(q.tokenize_queries(QUERIES))
        pt = PrefixTower(q, int(q.config.num_layers), tmp_path / "cache", show_progress=False)
        q.train()
        got = pt.queries(QUERIES)
    assert pt.live and not (tmp_path / "cache").exists() and q.backbone.embeddings.training
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
    assert all(not p.requires_grad for n, p in q.backbone.named_parameters() if "embed" in n)


@pytest.mark.parametrize("kind,pooling", [("llm", None), ("bert", "mean")])
def test_float16_token_cache_is_close_to_the_full_forward(tiny_dirs, tmp_path, kind, pooling):
    ref_loss, ref, _ = _step(tiny_dirs, tmp_path, kind, pooling, 1, cached=False)
    loss, got, _ = _step(tiny_dirs, tmp_path, kind, pooling, 1, cached=True, dtype="float16")
    assert next((tmp_path / "cache").glob("*-tokens-*/part-*.npy")).stat().st_size > 0
    arr = np.load(next((tmp_path / "cache").glob("document-*-tokens-*/part-*.npy")))
    assert arr.dtype == np.float16  # half-precision storage
    assert abs(ref_loss - loss) < 1e-2 * abs(ref_loss)
    for n in ref:  # fp16 rounding (~5e-4 relative) of the cached states, amplified a little by the top layer
        scale = float(ref[n].abs().max())
        torch.testing.assert_close(got[n], ref[n], atol=2e-2 * scale + 1e-6, rtol=0, msg=n)


def test_lora_on_the_top_layers_equals_full_forward_and_merges(tiny_dirs, tmp_path):
    from scalingnote.models.prefix import merge_lora
    from scalingnote.training.config import LoraSpec

    spec = LoraSpec(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    ref_loss, ref, _ = _step(tiny_dirs, tmp_path, "llm", None, 2, cached=False, lora=spec)
    loss, got, (q, d) = _step(tiny_dirs, tmp_path, "llm", None, 2, cached=True, lora=spec)
    assert abs(ref_loss - loss) < 1e-5 and ref.keys() == got.keys()
    backbone = {n for n in ref if ".backbone." in n}
    assert backbone and all("lora_" in n for n in backbone)  # only adapters train in the backbone
    assert all(".layers.1." in n or ".layers.2." in n for n in backbone)  # and only on the top 2 layers
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], atol=1e-5, rtol=1e-4, msg=n)
    batch = d.tokenize_documents(DOCS)
    with torch.no_grad():
        before = d(batch)["emb"]
        assert merge_lora(d) == 4  # 2 layers x (q_proj, v_proj)
        after = d(batch)["emb"]
    assert not any("lora" in n for n, _ in d.named_parameters())
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


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
        t = load_tower(
            tiny_dirs["llama"],
            "document",
            pooling="mean",
            max_doc_length=64,
            num_layers=n,
            dim=16,
            matryoshka_dims=[8, 16],
        )
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


@pytest.mark.parametrize("k", [0, 1])
def test_interrupted_fill_keeps_finished_parts_and_resumes(tiny_dirs, tmp_path, monkeypatch, k):
    _, d = _towers(tiny_dirs, "llm", None)
    items = DOCS
    full = FeatureCache.for_tower(tmp_path / "ref", d, k)
    fill_cache(full, d, k, items, part_size=2, show_progress=False)
    cache = FeatureCache.for_tower(tmp_path / "c", d, k)
    calls = {"n": 0}
    orig = FeatureCache.add

    def flaky(self, keys, feats, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # killed while writing the second part
        return orig(self, keys, feats, **kw)

    monkeypatch.setattr(FeatureCache, "add", flaky)
    with pytest.raises(KeyboardInterrupt):
        fill_cache(cache, d, k, items, part_size=2, show_progress=False)
    monkeypatch.setattr(FeatureCache, "add", orig)
    reopened = FeatureCache.for_tower(tmp_path / "c", d, k)
    assert len(reopened) == 2  # the first part survived
    assert fill_cache(reopened, d, k, items, part_size=2, show_progress=False) == len(items) - 2
    keys = [item_key(x) for x in items]
    if k == 0:
        np.testing.assert_array_equal(reopened.pooled_rows(keys), full.pooled_rows(keys))
        ref = d.pooled(d.tokenize_documents(items)).detach().numpy()
        np.testing.assert_allclose(reopened.pooled_rows(keys), ref, atol=1e-6)
    else:
        for a, b in zip(reopened.token_rows(keys), full.token_rows(keys), strict=True):
            np.testing.assert_array_equal(a, b)
        assert reopened.view_positions(keys) == [list(e.view_positions) for e in d.document_encodings(items)]
    assert not list(tmp_path.rglob("*.tmp*"))  # no half-written file left behind


def test_token_cache_of_other_dtype_or_weights_is_refused(tiny_dirs, tmp_path):
    _, d = _towers(tiny_dirs, "llm", None)
    pt = PrefixTower(d, 1, tmp_path, show_progress=False)
    pt.ensure(DOCS)
    with pytest.raises(ScalingNoteError, match="dtype"):
        FeatureCache(pt.cache.root, dict(pt.cache.key, dtype="float32"))
    with torch.no_grad():
        d.backbone.layers[0].mlp.down_proj.weight.add_(0.01)  # a frozen layer changed: a new key, never the old rows
    assert FeatureCache.for_tower(tmp_path, d, 1).root != pt.cache.root
    with pytest.raises(ScalingNoteError, match="weights"):
        FeatureCache(pt.cache.root, cache_key(d, 1))


@pytest.mark.parametrize("role", ["query", "document"])
def test_multi_depth_fill_equals_separate_fills(tiny_dirs, tmp_path, role):
    from scalingnote.models.prefix import fill_depths

    items = DOCS if role == "document" else QUERIES
    kw = dict(pooling="mean" if role == "query" else None, dim=16, matryoshka_dims=[8, 16], max_doc_length=64)
    pairs = [(3, 0), (3, 1), (3, 2), (2, 0), (2, 1), (1, 1)]  # (2, 1) and (3, 2) share the depth-1 token cache
    full = load_tower(tiny_dirs["llama"], role, **kw)
    caches = fill_depths(tmp_path / "one", full, pairs, items, show_progress=False)
    assert caches[(2, 1)] is caches[(3, 2)]
    keys = [item_key(x) for x in items]
    for n, k in pairs:
        t = load_tower(tiny_dirs["llama"], role, num_layers=n, **kw)
        sep = PrefixTower(t, k, tmp_path / f"sep-{n}-{k}", show_progress=False)  # its own fill
        if k == n:  # every layer trainable: the embeddings run live, nothing is cached or read
            assert sep.live and sep.ensure(items) == 0 and not (tmp_path / f"sep-{n}-{k}").exists()
            continue
        assert sep.ensure(items) == len(items)
        one = PrefixTower(t, k, tmp_path / "one", show_progress=False)
        assert one.cache.root.name == caches[(n, k)].root.name and one.ensure(items) == 0  # found, nothing recomputed
        if k == 0:
            np.testing.assert_allclose(one.cache.pooled_rows(keys), sep.cache.pooled_rows(keys), atol=1e-6, rtol=0)
        else:
            for a, b in zip(one.cache.token_rows(keys), sep.cache.token_rows(keys), strict=True):
                assert a.dtype == np.float16 and a.shape == b.shape
                np.testing.assert_array_equal(a, b)
            assert one.cache.view_positions(keys) == sep.cache.view_positions(keys)


def test_cache_size_is_reported_before_the_fill(tiny_dirs, tmp_path, monkeypatch, caplog):
    import logging

    from scalingnote.models.prefix import estimate_cache_bytes

    _, d = _towers(tiny_dirs, "llm", None)
    est = estimate_cache_bytes(d, 1, DOCS)
    tokens = sum(len(e.input_ids) for e in d.document_encodings(DOCS))
    assert est["rows"] == len(DOCS) and est["tokens"] == tokens
    assert est["bytes"] >= tokens * d.config.hidden_size * 2  # token count x hidden x 2 bytes (+ the index)
    pt = PrefixTower(d, 1, tmp_path, show_progress=False)
    seen = []
    orig = FeatureCache.add

    def add(self, *a, **kw):  # what was reported when the first rows are written
        seen.append([r.getMessage() for r in caplog.records if "GB on disk" in r.getMessage()])
        return orig(self, *a, **kw)

    monkeypatch.setattr(FeatureCache, "add", add)
    with caplog.at_level(logging.INFO, logger="scalingnote.models.prefix.fill"):
        pt.ensure(DOCS)
    assert seen and seen[0], "the size was not logged before the first part was written"
    assert pt.cache.planned == est  # returned / kept: the same estimate
    actual = pt.cache.disk_bytes()
    assert 0.8 * est["bytes"] < actual < 1.2 * est["bytes"] + 4096, (actual, est)
