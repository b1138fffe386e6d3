"""The pooling table (models/towers/pooling.py): every built-in mode gives bit for bit what a
reference implementation written out per tower kind and role gives (below, the oracle),
registration and its errors, dotted paths, and what the export paths read from an entry.

Tests that register a mode use names of their own (``test_pooling_*``) inside the scoped table
and check the built-in entries by name, never the whole table: a mode a user registers beside
them changes nothing here."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from scalingnote.data import Document
from scalingnote.errors import ConfigError
from scalingnote.models import POOLING_MODES, PoolingMode, load_tower, pooling_mode, register_pooling
from scalingnote.models.prompt import PROMPT_PRESETS
from scalingnote.models.towers.pooling import default_pooling, from_st_mode, pooling_modes
from scalingnote.utils.registry import RegistryError

QUERIES = [
    "fox",
    "what is dense retrieval and why does it need a large language model",
    "",
    "Scaling laws relate model size",
]
DOCS = [
    Document("d1", "Dense retrieval", "ir", "Queries and documents share one vector space."),
    Document("d2", "A long document " * 30, "topic " * 40, "The quick brown fox. " * 40),
    Document("d3", "", "", "no title, no topic"),
]


@pytest.fixture()
def table():
    """The pooling table, restored after a test that registers modes."""
    with POOLING_MODES.scoped() as t:
        yield t


# ------------------------------------------------------------------ the reference implementation (oracle)


def _ref_segment_means(h, mask, ends):
    m = mask.to(h.dtype).unsqueeze(-1)
    csum = torch.cumsum(h * m, dim=1)
    ccount = torch.cumsum(m, dim=1)
    idx = ends.long()
    sums = csum.gather(1, idx.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
    counts = ccount.gather(1, idx.unsqueeze(-1))
    prev_sums = torch.cat([torch.zeros_like(sums[:, :1]), sums[:, :-1]], dim=1)
    prev_counts = torch.cat([torch.zeros_like(counts[:, :1]), counts[:, :-1]], dim=1)
    return (sums - prev_sums) / (counts - prev_counts).clamp(min=1)


def _ref_preset_pool(prompt, h, batch, pooling):
    vp, mask = batch["view_positions"], batch["attention_mask"]
    rows = torch.arange(h.shape[0])
    last = torch.where(mask.bool(), torch.arange(mask.shape[1]), -1).max(dim=1).values
    present = prompt.views_present
    if pooling == "mean":
        m = mask.to(h.dtype).unsqueeze(-1)
        csum = torch.cat([torch.zeros_like(h[:, :1]), torch.cumsum(h * m, dim=1)], dim=1)
        cnt = torch.cat([torch.zeros_like(m[:, :1]), torch.cumsum(m, dim=1)], dim=1)

        def span(a, b):
            return (csum[rows, b + 1] - csum[rows, a + 1]) / (cnt[rows, b + 1] - cnt[rows, a + 1]).clamp(min=1)

        start = torch.full_like(last, -1)
        t = span(start, vp[:, 0]) if "title" in present else None
        c = span(vp[:, 0] if "title" in present else start, vp[:, 1]) if "content" in present else None
        e = span(start, vp[:, 2]) if "emb" in present else (c if c is not None else span(start, last))
    else:
        t = h[rows, vp[:, 0]] if "title" in present else None
        c = h[rows, vp[:, 1]] if "content" in present else None
        e = h[rows, vp[:, 2]] if "emb" in present else (c if c is not None else h[rows, last])
    return torch.stack([t if t is not None else e, c if c is not None else e, e], dim=1)


def _reference_pool(tower, h, batch):
    """The built-in modes written out per tower kind, role and pooling, without the table."""
    mask, c = batch["attention_mask"], tower.config
    if c.kind == "bert":
        if c.pooling == "cls":
            return h[:, 0]
        m = mask.to(h.dtype).unsqueeze(-1)
        return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    if c.role == "query":
        last = (mask * torch.arange(mask.shape[1])).argmax(-1)
        if c.pooling == "mean":
            return _ref_segment_means(h, mask, last.unsqueeze(1))[:, 0]
        return h[torch.arange(h.shape[0]), last]
    if tower.prompt.absent_views:
        return _ref_preset_pool(tower.prompt, h, batch, c.pooling)
    vp = batch["view_positions"]
    if c.pooling == "mean":
        return torch.cat([_ref_segment_means(h, mask, vp[:, :2]), _ref_segment_means(h, mask, vp[:, 2:])], dim=1)
    return h[torch.arange(h.shape[0]).unsqueeze(1), vp]


def _same_as_reference(tower, batches):
    for batch in batches:
        with torch.no_grad():
            h = tower.hidden_states(batch)
            new, ref = tower.pool_hidden(h, batch), _reference_pool(tower, h, batch)
        assert new.shape == ref.shape and torch.equal(new, ref), (tower.config.pooling, (new - ref).abs().max())


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_llm_query_modes_match_the_reference(tiny_dirs, pooling):
    q = load_tower(tiny_dirs["llama"], "query", pooling=pooling, device="cpu", dtype="float32")
    _same_as_reference(q, [q.tokenize_queries(QUERIES, padding_side=side) for side in ("right", "left")])


@pytest.mark.parametrize("pooling", ["prompt", "mean"])
@pytest.mark.parametrize("preset", sorted(PROMPT_PRESETS))
def test_llm_document_modes_match_the_reference(tiny_dirs, pooling, preset):
    d = load_tower(
        tiny_dirs["llama"],
        "document",
        pooling=pooling,
        max_doc_length=96,
        doc_prompt=PROMPT_PRESETS[preset],
        device="cpu",
        dtype="float32",
    )
    _same_as_reference(d, [d.tokenize_documents(DOCS, padding_side=side) for side in ("right", "left")])


@pytest.mark.parametrize("role", ["query", "document"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_bert_modes_match_the_reference(tiny_dirs, role, pooling):
    t = load_tower(tiny_dirs["bert"], role, pooling=pooling, device="cpu", dtype="float32")
    _same_as_reference(t, [t.tokenize_queries(QUERIES) if role == "query" else t.tokenize_documents(DOCS)])


# ------------------------------------------------------------------ the table


BUILTIN = {"cls", "mean", "last", "prompt"}


def test_builtin_entries_say_what_the_code_needs():
    pairs = [(k, r) for k in ("llm", "bert") for r in ("query", "document")]
    allowed = {(k, r): {m.name for m in pooling_modes(k, r)} & BUILTIN for k, r in pairs}
    assert allowed == {
        ("llm", "query"): {"last", "mean"},
        ("llm", "document"): {"prompt", "mean"},
        ("bert", "query"): {"cls", "mean"},
        ("bert", "document"): {"cls", "mean"},
    }
    assert {n: pooling_mode(n).st_mode for n in BUILTIN} == {
        "cls": "cls",
        "mean": "mean",
        "last": "lasttoken",
        "prompt": None,
    }
    assert {n: pooling_mode(n).reads for n in BUILTIN} == {
        "cls": "first",
        "mean": "span",
        "last": "end",
        "prompt": "end",
    }
    assert [default_pooling(k, r) for k, r in pairs] == ["last", "prompt", "cls", "cls"]
    assert default_pooling("bert", "query", "mean") == "mean" and default_pooling("bert", "query", "last") == "cls"
    assert (
        from_st_mode("lasttoken") == "last" and from_st_mode("lasttoken", "bert") is None and from_st_mode(None) is None
    )


def test_unknown_and_misplaced_modes_are_clear_errors(tiny_dirs):
    with pytest.raises(ConfigError, match=r"field 'pooling': unknown pooling mode 'nope'; known: ") as e:
        pooling_mode("nope")
    assert all(n in str(e.value) for n in BUILTIN)  # the message lists the table
    with pytest.raises(
        ConfigError, match=r"pooling 'prompt' is not for a bert query tower; use one of: .*\bcls\b.*\bmean\b"
    ) as e:
        load_tower(tiny_dirs["bert"], "query", pooling="prompt", device="cpu")
    offered = str(e.value).split("use one of: ")[1].split(" (or a dotted path")[0].split(", ")
    assert set(offered) >= {"cls", "mean"} and not set(offered) & {
        "last",
        "prompt",
    }  # the names offered, not substrings
    with pytest.raises(ConfigError, match="unknown pooling mode 'nope'"):
        load_tower(tiny_dirs["llama"], "query", pooling="nope", device="cpu")


def test_register_refuses_taken_names_unless_replace(table):
    fn = pooling_mode("mean").pool
    with pytest.raises(RegistryError, match="'mean' is already registered"):
        register_pooling("mean", fn)
    with pytest.raises(RegistryError, match="without ':'"):
        register_pooling("a:b", fn)
    with pytest.raises(ValueError, match="named 'x', registered as 'y'"):
        register_pooling("y", PoolingMode("x", fn))
    with pytest.raises(ValueError, match="kinds must be among"):
        register_pooling("z", fn, kinds=("gpt",))
    with pytest.raises(ValueError, match="reads must be one of"):
        register_pooling("z", fn, reads="middle")
    new = register_pooling("mean", fn, replace=True, description="replaced")
    assert pooling_mode("mean") is new and new.description == "replaced"


def _max_pool(h, mask, spans):
    pos = torch.arange(h.shape[1], device=h.device)
    inside = (pos > spans[..., :1]) & (pos <= spans[..., 1:]) & mask.bool().unsqueeze(1)
    return h.unsqueeze(1).masked_fill(~inside.unsqueeze(-1), float("-inf")).amax(dim=2)


def test_a_registered_mode_pools_every_view_of_an_llm_document(tiny_dirs, table):
    register_pooling("test_pooling_max", _max_pool)
    d = load_tower(tiny_dirs["llama"], "document", pooling="test_pooling_max", device="cpu", dtype="float32")
    assert (
        d.space_id != load_tower(tiny_dirs["llama"], "document", pooling="mean", device="cpu").space_id
    )  # its own space
    batch = d.tokenize_documents(DOCS, padding_side="left")
    with torch.no_grad():
        h, views = d.hidden_states(batch), d(batch)
    first = batch["attention_mask"].argmax(1)
    for i in range(len(DOCS)):
        t, c, e = (int(x) for x in batch["view_positions"][i])
        want = {"title": h[i, first[i] : t + 1], "content": h[i, t + 1 : c + 1], "emb": h[i, first[i] : e + 1]}
        for v, rows in want.items():
            assert torch.equal(views[v][i], rows.amax(0))


def test_dotted_path_names_a_mode_and_survives_save_load(tiny_dirs, tmp_path, monkeypatch):
    (tmp_path / "user_pool.py").write_text(
        "import torch\n"
        "from scalingnote.models import PoolingMode\n\n\n"
        + inspect.getsource(_max_pool)
        + "\n\nMAX = PoolingMode('max', _max_pool, kinds=('bert',), st_mode='max')\n"
        "NOT_A_MODE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    t = load_tower(tiny_dirs["bert"], "query", pooling="user_pool:MAX", device="cpu", dtype="float32")
    batch = t.tokenize_queries(QUERIES)
    with torch.no_grad():
        got = t(batch)
        want = _max_pool(
            t.hidden_states(batch), batch["attention_mask"], torch.tensor([[[-1, batch["input_ids"].shape[1] - 1]]])
        )
    assert torch.equal(got, want[:, 0])
    t.save(tmp_path / "saved")
    again = load_tower(tmp_path / "saved", device="cpu", dtype="float32")
    assert again.config.pooling == "user_pool:MAX"
    np.testing.assert_array_equal(
        again.encode_queries(QUERIES, show_progress=False), t.encode_queries(QUERIES, show_progress=False)
    )
    with pytest.raises(ConfigError, match=r"field 'pooling': cannot import pooling mode 'user_pool:MISSING'"):
        pooling_mode("user_pool:MISSING")
    with pytest.raises(ConfigError, match="cannot import pooling mode 'no_such_module_xyz:M'"):
        load_tower(tiny_dirs["bert"], "query", pooling="no_such_module_xyz:M", device="cpu")
    with pytest.raises(ConfigError, match="is a int, not a scalingnote PoolingMode"):
        pooling_mode("user_pool:NOT_A_MODE")
    with pytest.raises(ConfigError, match="not for a llm query tower"):
        load_tower(tiny_dirs["llama"], "query", pooling="user_pool:MAX", device="cpu")


# ------------------------------------------------------------------ what the exports read from the table


def test_sentence_transformers_export_refuses_a_mode_without_st_mode(tiny_dirs, tmp_path, table):
    from scalingnote.models.export import ExportRefused, export_sentence_transformers

    register_pooling("test_pooling_max_no_st", _max_pool, kinds=("bert",))
    t = load_tower(tiny_dirs["bert"], "query", pooling="test_pooling_max_no_st", device="cpu", dtype="float32")
    with pytest.raises(
        ExportRefused, match="pooling 'test_pooling_max_no_st' has no sentence-transformers Pooling mode"
    ):
        export_sentence_transformers(t, tmp_path / "st")
    assert not (tmp_path / "st").exists()


def test_import_maps_a_st_mode_through_the_table(tiny_dirs, tmp_path, table):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    tr = Transformer(str(tiny_dirs["bert"]))
    SentenceTransformer(modules=[tr, Pooling(32, pooling_mode="max"), Normalize()], device="cpu").save(
        str(tmp_path / "st")
    )
    if from_st_mode("max", "bert") is None:  # no mode in the table computes sentence-transformers' "max"
        with pytest.raises(
            ConfigError, match=r"pooling mode 'max': a BERT tower pools with one of \[.*'cls'.*'mean'.*\]"
        ):
            load_tower(tmp_path / "st", "query", device="cpu")
    register_pooling("test_pooling_st_max", _max_pool, kinds=("bert",), st_mode="max")
    t = load_tower(tmp_path / "st", "query", device="cpu", dtype="float32")
    assert t.config.pooling == from_st_mode("max", "bert") and pooling_mode(t.config.pooling).st_mode == "max"
    ref = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(QUERIES, convert_to_numpy=True)
    np.testing.assert_allclose(t.encode_queries(QUERIES, show_progress=False), ref, atol=1e-5)


def test_onnx_export_traces_a_registered_mode(tiny_dirs, tmp_path, table):
    from scalingnote.models.export import export_onnx, onnx_embed, ort_session

    register_pooling("test_pooling_onnx_max", _max_pool, kinds=("bert",))  # no st_mode: ONNX needs none
    t = load_tower(
        tiny_dirs["bert"],
        "query",
        pooling="test_pooling_onnx_max",
        dim=16,
        max_query_length=24,
        device="cpu",
        dtype="float32",
    )
    out = export_onnx(t, tmp_path / "onnx")
    got = onnx_embed(ort_session(out / "model.onnx"), t, QUERIES, batch_size=4)
    assert np.abs(got - t.encode_queries(QUERIES, show_progress=False)).max() <= 1e-4
