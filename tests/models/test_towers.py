"""Query and document towers on tiny random Llama / Qwen2 / BERT models."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from scalingnote.data import Document
from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.models import (
    SPECIAL_TOKENS,
    VIEWS,
    DocumentTower,
    QueryTower,
    check_compatible,
    load_tower,
    load_tower_pair,
    orthogonal_projection,
    pair_towers,
)

QUERIES = [
    "fox",
    "what is dense retrieval and why does it need a large language model to encode documents?",
    "vitamin d fractures",
    "",
    "Scaling laws relate model size, data size and retrieval quality.",
]
LONG = " ".join(["The quick brown fox jumps over the lazy dog."] * 40)
DOCS = [
    Document("d1", "Dense retrieval", "ir", "Queries and documents share one vector space."),
    Document("d2", "A long document " * 30, "topic " * 40, LONG),
    Document("d3", "", "", "no title, no topic"),
    Document("d4", "Vitamin D", "", "Vitamin D deficiency is associated with fractures."),
]


def _unbatched_hidden(tower, ids):
    with torch.no_grad():
        return tower.backbone(input_ids=torch.tensor([ids])).last_hidden_state[0]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def llm(request, tiny_dirs):
    return request.param, tiny_dirs[request.param]


# ------------------------------------------------------------------ LLM query tower


def test_llm_query_appends_eos_and_pools_last_position(llm):
    _, path = llm
    q = load_tower(path, "query", device="cpu")
    assert isinstance(q, QueryTower) and q.config.pooling == "last" and q.out_dim == 32
    seqs = q.query_ids(QUERIES)
    assert all(s[-1] == q.tokenizer.eos_token_id for s in seqs)
    for side in ("right", "left"):
        batch = q.tokenize_queries(QUERIES, padding_side=side)
        with torch.no_grad():
            out = q(batch)
        for i, s in enumerate(seqs):
            want = _unbatched_hidden(q, s)[-1]  # hidden state at the EOS (last) position
            torch.testing.assert_close(out[i], want, atol=1e-5, rtol=1e-4)


def test_llm_query_truncation_keeps_eos(llm):
    q = load_tower(llm[1], "query", device="cpu", max_query_length=6)
    seqs = q.query_ids(QUERIES)
    assert max(len(s) for s in seqs) == 6 and all(s[-1] == q.tokenizer.eos_token_id for s in seqs)


# ------------------------------------------------------------------ LLM document tower


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("max_len", [None, 70])
def test_llm_document_views_pool_before_placeholders(llm, side, max_len):
    d = load_tower(llm[1], "document", device="cpu")
    assert isinstance(d, DocumentTower) and d.config.pooling == "prompt"
    encs = d.document_encodings(DOCS, max_length=max_len)
    if max_len is not None:
        assert all(len(e.input_ids) <= max_len for e in encs) and encs[1].truncated
    batch = d.collate_documents(encs, padding_side=side)
    ph = [d.tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    vp = batch["view_positions"]
    for b in range(len(DOCS)):
        # the token after each pooled position is its placeholder, in order, under either padding
        assert batch["input_ids"][b, vp[b] + 1].tolist() == ph
        assert batch["attention_mask"][b, vp[b]].tolist() == [1, 1, 1]
    with torch.no_grad():
        views = d(batch)
    assert set(views) == set(VIEWS)
    for b, e in enumerate(encs):
        h = _unbatched_hidden(d, e.input_ids)
        for j, v in enumerate(VIEWS):
            torch.testing.assert_close(views[v][b], h[e.view_positions[j]], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("side", ["right", "left"])
def test_llm_mean_pooling_query_and_document_segments(llm, side):
    q = load_tower(llm[1], "query", device="cpu", pooling="mean")
    seqs = q.query_ids(QUERIES)
    with torch.no_grad():
        out = q(q.tokenize_queries(QUERIES, padding_side=side))
    for i, s in enumerate(seqs):
        torch.testing.assert_close(out[i], _unbatched_hidden(q, s).mean(0), atol=1e-5, rtol=1e-4)
    d = load_tower(llm[1], "document", device="cpu", pooling="mean")
    encs = d.document_encodings(DOCS, max_length=70)
    with torch.no_grad():
        views = d(d.collate_documents(encs, padding_side=side))
    for b, e in enumerate(encs):
        h = _unbatched_hidden(d, e.input_ids)
        t, c, em = e.view_positions
        want = {"title": h[: t + 1].mean(0), "content": h[t + 1 : c + 1].mean(0), "emb": h[: em + 1].mean(0)}
        for v in VIEWS:
            torch.testing.assert_close(views[v][b], want[v], atol=1e-5, rtol=1e-4)
    # mean-pooled LLM towers form their own embedding space (not the placeholder one)
    assert q.compat_id == d.compat_id != load_tower(llm[1], "query", device="cpu").compat_id


def test_llm_document_forward_rejects_foreign_positions(llm):
    d = load_tower(llm[1], "document", device="cpu")
    batch = d.tokenize_documents(DOCS[:2])
    batch["view_positions"] = batch["view_positions"] + 1
    with pytest.raises(RuntimeError, match="placeholders"):
        d(batch)


def test_placeholders_are_single_added_special_tokens(llm):
    d = load_tower(llm[1], "document", device="cpu")
    emb = d.backbone.get_input_embeddings().weight
    assert emb.shape[0] == len(d.tokenizer)
    ids = [d.tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert d.tokenizer("x [EMB] y", add_special_tokens=False)["input_ids"].count(ids[2]) == 1
    # new rows are initialised deterministically to the mean of the original rows
    base = emb[: min(ids)].mean(0)
    for i in ids:
        torch.testing.assert_close(emb[i], base)


# ------------------------------------------------------------------ batch invariance


@pytest.mark.parametrize("model", ["llama", "qwen2", "bert"])
def test_embedding_does_not_depend_on_batch(tiny_dirs, model):
    q = load_tower(tiny_dirs[model], "query", device="cpu", dim=16)
    d = load_tower(tiny_dirs[model], "document", device="cpu", dim=16)
    alone_q = q.encode_queries(QUERIES[:1], show_progress=False)
    batched_q = q.encode_queries(QUERIES, batch_size=5, show_progress=False)
    np.testing.assert_allclose(batched_q[0], alone_q[0], atol=1e-5)
    alone_d = d.encode_documents(DOCS[:1], show_progress=False)
    batched_d = d.encode_documents(DOCS, batch_size=4, show_progress=False)
    np.testing.assert_allclose(batched_d[0], alone_d[0], atol=1e-5)
    # batch size and order do not matter either
    np.testing.assert_allclose(
        q.encode_queries(QUERIES[::-1], batch_size=2, show_progress=False)[::-1], batched_q, atol=1e-5
    )
    assert batched_q.dtype == np.float32 and batched_d.dtype == np.float32


# ------------------------------------------------------------------ BERT towers


def test_bert_cls_and_mean_pooling(tiny_dirs):
    cls_t = load_tower(tiny_dirs["bert"], "query", device="cpu", pooling="cls")
    mean_t = load_tower(tiny_dirs["bert"], "query", device="cpu", pooling="mean")
    tok = cls_t.tokenizer
    seqs = cls_t.query_ids(QUERIES)
    assert all(s[0] == tok.cls_token_id and s[-1] == tok.sep_token_id for s in seqs)  # [CLS] first (§3.3)
    with torch.no_grad():
        a = cls_t(cls_t.tokenize_queries(QUERIES))
        m = mean_t(mean_t.tokenize_queries(QUERIES))
    for i, s in enumerate(seqs):
        h = _unbatched_hidden(cls_t, s)
        torch.testing.assert_close(a[i], h[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(m[i], h.mean(0), atol=1e-5, rtol=1e-4)


def test_bert_default_pooling_is_cls_without_sentence_transformers_config(tiny_dirs):
    assert load_tower(tiny_dirs["bert"], "query", device="cpu").config.pooling == "cls"
    with pytest.raises(ConfigError, match="pooling"):
        load_tower(tiny_dirs["bert"], "query", device="cpu", pooling="last")


def test_bert_document_tower_returns_one_vector_three_times(tiny_dirs):
    d = load_tower(tiny_dirs["bert"], "document", device="cpu", dim=16, max_doc_length=24)
    batch = d.tokenize_documents(DOCS)
    assert batch["input_ids"].shape[1] <= 24
    with torch.no_grad():
        v = d(batch)
    assert v["title"] is v["content"] is v["emb"]
    q = load_tower(tiny_dirs["bert"], "query", device="cpu", dim=16, max_query_length=24)
    # a document is encoded as its text: same vector as that text through the query path
    text_vec = q.encode_queries([DOCS[0].text], show_progress=False)
    np.testing.assert_allclose(d.encode_documents(DOCS[:1], show_progress=False), text_vec, atol=1e-5)


# ------------------------------------------------------------------ projection, Matryoshka, normalisation


def test_projection_init_and_matryoshka_prefixes(tiny_dirs):
    w = orthogonal_projection(32, 16, seed=0)
    torch.testing.assert_close(w @ w.T, torch.eye(16) * 2.0, atol=1e-5, rtol=0)  # rows orthogonal, scale sqrt(32/16)
    torch.testing.assert_close(w, orthogonal_projection(32, 16, seed=0), rtol=0, atol=0)
    assert not torch.equal(w, orthogonal_projection(32, 16, seed=1))
    q = load_tower(tiny_dirs["llama"], "query", device="cpu", dim=16)
    assert q.config.matryoshka_dims == [16] and q.out_dim == 16
    q32 = load_tower(tiny_dirs["llama"], "query", device="cpu", dim=32)
    assert q32.config.matryoshka_dims == [16, 32]
    raw = q32.encode_queries(QUERIES, normalize=False, show_progress=False)
    full = q32.encode_queries(QUERIES, show_progress=False)
    pre = q32.encode_queries(QUERIES, dim=16, show_progress=False)
    np.testing.assert_allclose(np.linalg.norm(full, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(pre, raw[:, :16] / np.linalg.norm(raw[:, :16], axis=1, keepdims=True), atol=1e-5)
    with torch.no_grad():
        np.testing.assert_allclose(raw, q32(q32.tokenize_queries(QUERIES)).numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="dim"):
        q32.encode_queries(QUERIES, dim=64, show_progress=False)
    with pytest.raises(ConfigError, match="dim"):
        load_tower(tiny_dirs["llama"], "query", device="cpu", dim=64)  # larger than hidden


def test_zero_shot_tower_has_no_projection(tiny_dirs):
    q = load_tower(tiny_dirs["bert"], "query", device="cpu")
    assert q.projection is None and q.config.dim is None and q.out_dim == q.config.hidden_size


def test_forward_has_grad_for_training(tiny_dirs):
    q, d = load_tower_pair(tiny_dirs["llama"], dim=16, device="cpu")
    q.train()
    d.train()
    qv = q(q.tokenize_queries(QUERIES[:3]))
    dv = d(d.tokenize_documents(DOCS[:3]))
    loss = sum((qv * dv[v]).sum() for v in VIEWS)
    loss.backward()
    assert q.projection.weight.grad is not None and d.projection.weight.grad is not None
    assert q.backbone.get_input_embeddings().weight.grad is not None
    # the two towers of a pair are independent copies
    assert q.backbone.get_input_embeddings().weight.data_ptr() != d.backbone.get_input_embeddings().weight.data_ptr()


def test_bad_inputs_are_clear(tiny_dirs):
    q = load_tower(tiny_dirs["bert"], "query", device="cpu")
    with pytest.raises(TypeError, match="list of strings"):
        q.encode_queries("one string", show_progress=False)
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        q.encode_queries(["ok", 3], show_progress=False)
    d = load_tower(tiny_dirs["bert"], "document", device="cpu")
    with pytest.raises(TypeError, match="Document"):
        d.encode_documents([{"id": "x"}], show_progress=False)
    assert q.encode_queries([], show_progress=False).shape == (0, q.out_dim)


# ------------------------------------------------------------------ save / load / identity


@pytest.mark.parametrize(
    "model,role,dim",
    [("llama", "document", 16), ("qwen2", "query", None), ("bert", "document", 16), ("bert", "query", None)],
)
def test_save_load_round_trip(tiny_dirs, tmp_path, model, role, dim):
    t = load_tower(tiny_dirs[model], role, device="cpu", dim=dim, num_layers=2)
    enc = t.encode_documents if role == "document" else t.encode_queries
    inputs = DOCS if role == "document" else QUERIES
    before = enc(inputs, show_progress=False, normalize=False)
    fp = t.fingerprint
    t.save(tmp_path / "tower")
    meta = json.loads((tmp_path / "tower" / "tower.json").read_text())
    assert meta["fingerprint"] == fp and meta["config"]["num_layers"] == 2 and meta["config"]["dim"] == dim
    # an untrained tower stores no backbone tensor: its base is named by path and fingerprint
    assert meta["storage"] == "base+trained" and meta["trained_tensors"] == [] and len(meta["base"]["sha256"]) == 64
    assert not (tmp_path / "tower" / "backbone").exists() and not (tmp_path / "tower" / "trained.safetensors").exists()
    assert (tmp_path / "tower" / "projection.safetensors").is_file() == (dim is not None)
    back = load_tower(tmp_path / "tower", verify=True)
    assert type(back) is type(t) and back.config == t.config
    assert back.fingerprint == fp and back.compat_id == t.compat_id
    after = (back.encode_documents if role == "document" else back.encode_queries)(
        inputs, show_progress=False, normalize=False
    )
    np.testing.assert_array_equal(after, before)
    assert back.refresh_fingerprint() == fp  # recomputed from the loaded weights: same identity
    assert len(back.backbone.encoder.layer if model == "bert" else back.backbone.layers) == 2


def test_saved_tower_refuses_conflicting_settings_and_tampering(tiny_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    t = load_tower(tiny_dirs["llama"], "document", device="cpu", dim=16)
    t.save(tmp_path / "t")
    with pytest.raises(ConfigError, match="config.dim"):
        load_tower(tmp_path / "t", dim=32)
    with pytest.raises(ConfigError, match="config.role"):
        load_tower(tmp_path / "t", role="query")
    pf = tmp_path / "t" / "projection.safetensors"
    w = load_file(str(pf))
    w["weight"][0, 0] += 1.0
    save_file(w, str(pf))
    load_tower(tmp_path / "t")  # the stored fingerprint is trusted by default
    with pytest.raises(ConfigError, match="fingerprint"):
        load_tower(tmp_path / "t", verify=True)
    (tmp_path / "t" / "tower.json").write_text("{not json")
    with pytest.raises(ConfigError, match="tower.json"):
        load_tower(tmp_path / "t")


def test_save_refuses_to_overwrite_a_foreign_directory(tiny_dirs, tmp_path):
    t = load_tower(tiny_dirs["bert"], "query", device="cpu")
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="refusing"):
        t.save(tmp_path / "precious")
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"
    t.save(tmp_path / "tw")
    t.save(tmp_path / "tw")  # replacing a saved tower is fine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious", "tw"]


def test_fingerprint_tracks_weights_and_settings(tiny_dirs):
    a = load_tower(tiny_dirs["llama"], "query", device="cpu", dim=16)
    b = load_tower(tiny_dirs["llama"], "query", device="cpu", dim=16)
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 32
    assert load_tower(tiny_dirs["llama"], "query", device="cpu", dim=16, projection_seed=1).fingerprint != a.fingerprint
    assert (
        load_tower(tiny_dirs["llama"], "query", device="cpu", dim=16, max_query_length=9).fingerprint != a.fingerprint
    )
    assert (
        load_tower(tiny_dirs["llama"], "query", device="cpu", dim=16, padding_side="left").fingerprint == a.fingerprint
    )
    with torch.no_grad():
        b.projection.weight[0, 0] += 1e-3
    assert b.fingerprint == a.fingerprint  # computed once ...
    assert b.refresh_fingerprint() != a.fingerprint  # ... and refreshed after training


def test_compat_id_rule(tiny_dirs):
    # rule 1: zero-shot towers from the same base (same layers/dim/seed) share the space id
    q, d = load_tower_pair(tiny_dirs["llama"], dim=16, device="cpu")
    assert q.compat_id == d.compat_id and q.fingerprint != d.fingerprint
    d_sep = load_tower(tiny_dirs["llama"], "document", device="cpu", dim=16)
    assert d_sep.compat_id == q.compat_id
    assert load_tower(tiny_dirs["llama"], "document", device="cpu", dim=16, num_layers=2).compat_id != q.compat_id
    assert load_tower(tiny_dirs["qwen2"], "document", device="cpu", dim=16).compat_id != q.compat_id
    bq = load_tower(tiny_dirs["bert"], "query", device="cpu", pooling="mean")
    assert load_tower(tiny_dirs["bert"], "document", device="cpu", pooling="mean").compat_id == bq.compat_id
    assert load_tower(tiny_dirs["bert"], "document", device="cpu", pooling="cls").compat_id != bq.compat_id
    check_compatible(q, d.compat_id, out_dim=16)
    # rule 2: towers trained together share the document tower's fingerprint
    with torch.no_grad():
        d.projection.weight.mul_(1.01)
    cid = pair_towers(q, d)
    assert cid == d.fingerprint == q.compat_id == d.compat_id
    with pytest.raises(ScalingNoteError, match="not compatible"):
        check_compatible(q, d_sep.compat_id)
    # rule 3: a student inherits its teacher's compat id
    student = load_tower(tiny_dirs["bert"], "query", device="cpu", dim=16)
    student.compat_id = q.compat_id
    check_compatible(student, d.compat_id, out_dim=16)


def test_explicit_compat_id_survives_save_load(tiny_dirs, tmp_path):
    q, d = load_tower_pair(tiny_dirs["qwen2"], dim=16, device="cpu")
    cid = pair_towers(q, d)
    q.save(tmp_path / "q")
    d.save(tmp_path / "d")
    q2, d2 = load_tower(tmp_path / "q"), load_tower(tmp_path / "d")
    assert q2.compat_id == d2.compat_id == cid
    assert json.loads((tmp_path / "q" / "tower.json").read_text())["compat_source"] == "explicit"


def test_bf16_keeps_the_fp32_identity(tiny_dirs):
    a = load_tower(tiny_dirs["llama"], "query", device="cpu", dim=16)
    b = load_tower(tiny_dirs["llama"], "query", device="cpu", dim=16, dtype="bf16")
    assert b.dtype == torch.bfloat16 and b.fingerprint == a.fingerprint and b.compat_id == a.compat_id
    out = b.encode_queries(QUERIES, show_progress=False)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, a.encode_queries(QUERIES, show_progress=False), atol=0.05)
