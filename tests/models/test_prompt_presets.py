"""Named document prompts (ScalingNote Table 5 ablations): parsing, pooling of the
views a preset has, and the loss only over those views."""

from __future__ import annotations

import pytest
import torch

from scalingnote.data import Document
from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.models import PAPER_DOCUMENT_PROMPT, load_tower
from scalingnote.models.prompt import PROMPT_PRESETS, VIEWS, parse_template, resolve_prompt

DOCS = [
    Document("a", "Dense retrieval", "search", "Product quantization compresses embeddings into short codes."),
    Document("b", "Vitamin D", "", "Deficiency is associated with a higher risk of fractures in older adults."),
]


@pytest.fixture(scope="module")
def llm_dir(tiny_dirs):
    return tiny_dirs["llama"]


def _tower(path, preset, pooling="mean"):
    return load_tower(
        path, "document", pooling=pooling, dim=None, max_doc_length=128, doc_prompt=resolve_prompt(preset)
    )


def test_presets_and_resolution():
    assert PROMPT_PRESETS["full"] == PAPER_DOCUMENT_PROMPT
    assert set(PROMPT_PRESETS) == {"full", "no_title", "no_content", "no_summarize", "plain"}
    assert resolve_prompt("no_title") == PROMPT_PRESETS["no_title"]
    assert resolve_prompt(None) is None
    assert resolve_prompt(PAPER_DOCUMENT_PROMPT) == PAPER_DOCUMENT_PROMPT
    with pytest.raises(ConfigError, match="unknown prompt preset 'no_tilte'"):
        resolve_prompt("no_tilte")
    views = {name: [v for k, v in parse_template(t) if k == "view"] for name, t in PROMPT_PRESETS.items()}
    assert views == {
        "full": list(VIEWS),
        "no_title": ["content", "emb"],
        "no_content": ["title", "emb"],
        "no_summarize": ["title", "content"],
        "plain": [],
    }
    assert "summarize" not in PROMPT_PRESETS["no_summarize"] and "compress" not in PROMPT_PRESETS["no_summarize"]
    # a user template must still have every placeholder (only the named presets may lack some)
    with pytest.raises(ConfigError, match="doc_prompt"):
        parse_template(PROMPT_PRESETS["no_title"] + " ")


@pytest.mark.parametrize(
    "preset,loss_views",
    [
        ("full", VIEWS),
        ("no_title", ("content", "emb")),
        ("no_content", ("title", "emb")),
        ("no_summarize", ("title", "content")),
        ("plain", ("emb",)),
    ],
)
def test_loss_views(llm_dir, preset, loss_views):
    assert _tower(llm_dir, preset).prompt.loss_views == loss_views


def _hidden_and_batch(t, docs):
    batch = t.tokenize_documents(docs)
    with torch.no_grad():
        h = t.hidden_states(batch)
    return h, batch


def test_mean_views_of_the_presets(llm_dir):
    for preset in ("no_title", "no_content", "no_summarize", "plain"):
        t = _tower(llm_dir, preset)
        h, batch = _hidden_and_batch(t, DOCS)
        with torch.no_grad():
            p = t.pooled(batch)
        assert p.shape == (len(DOCS), 3, h.shape[-1])
        mask = batch["attention_mask"].bool()
        vp = batch["view_positions"]
        for i in range(len(DOCS)):
            real = torch.nonzero(mask[i]).flatten()
            first, last = int(real[0]), int(real[-1])
            mean = lambda a, b, h=h, i=i: h[i, a : b + 1].mean(0)  # noqa: E731 - tokens a..b inclusive
            if preset == "plain":
                want_emb = mean(first, last)
                assert torch.allclose(p[i, 2], want_emb, atol=1e-5)
            if preset == "no_title":  # content = the whole sentence up to [CONTENT_QUERY]
                assert torch.allclose(p[i, 1], mean(first, int(vp[i, 1])), atol=1e-5)
                assert torch.allclose(p[i, 2], mean(first, int(vp[i, 2])), atol=1e-5)
            if preset == "no_content":
                assert torch.allclose(p[i, 0], mean(first, int(vp[i, 0])), atol=1e-5)
            if preset == "no_summarize":  # the content view is the embedding
                assert torch.allclose(p[i, 1], mean(int(vp[i, 0]) + 1, int(vp[i, 1])), atol=1e-5)
                assert torch.equal(p[i, 2], p[i, 1])
            for v in VIEWS:  # a view the preset lacks repeats the embedding
                if v not in t.prompt.views_present and v != "emb":
                    assert torch.equal(p[i, VIEWS.index(v)], p[i, 2])


def test_full_prompt_pooling_unchanged(llm_dir):
    """The paper's prompt still goes through the tower's own pooling (same numbers as before)."""
    t = _tower(llm_dir, "full")
    assert t.prompt.absent_views == ()
    h, batch = _hidden_and_batch(t, DOCS)
    with torch.no_grad():
        p = t.pooled(batch)
    vp = batch["view_positions"]
    mask = batch["attention_mask"].bool()
    for i in range(len(DOCS)):
        first = int(torch.nonzero(mask[i]).flatten()[0])
        assert torch.allclose(p[i, 0], h[i, first : int(vp[i, 0]) + 1].mean(0), atol=1e-5)
        assert torch.allclose(p[i, 1], h[i, int(vp[i, 0]) + 1 : int(vp[i, 1]) + 1].mean(0), atol=1e-5)


def test_prompt_pooling_plain_uses_the_last_token(llm_dir):
    t = _tower(llm_dir, "plain", pooling="prompt")
    h, batch = _hidden_and_batch(t, DOCS)
    with torch.no_grad():
        p = t.pooled(batch)
    mask = batch["attention_mask"].bool()
    for i in range(len(DOCS)):
        last = int(torch.nonzero(mask[i]).flatten()[-1])
        assert torch.equal(p[i, 2], h[i, last])


def test_trainer_drops_absent_views_from_the_loss(llm_dir, tiny_dirs, tmp_path):
    from scalingnote.config import load_config
    from scalingnote.training import TrainConfig
    from scalingnote.training.data import Example
    from scalingnote.training.towers import build_towers
    from scalingnote.training.trainer import Trainer

    cfg = load_config(
        TrainConfig,
        {
            "method": "scaling_dual",
            "output_dir": str(tmp_path),
            "query_tower": {"model": str(llm_dir), "max_length": 16, "pooling": "mean"},
            "doc_tower": {"model": str(llm_dir), "max_length": 96, "pooling": "mean", "prompt": "no_title"},
            "dim": 16,
            "loss": {"dims": [8, 16]},
            "data": {"data_dir": str(tmp_path), "negatives": "none"},
            "optim": {"batch_size": 2},
            "show_progress": False,
        },
    )
    qt, dt = build_towers(cfg, torch.device("cpu"))
    assert dt.config.doc_prompt == PROMPT_PRESETS["no_title"]
    tr = Trainer(
        cfg,
        qt,
        dt,
        [Example("q1", "codes", DOCS[0], None), Example("q2", "fractures", DOCS[1], None)],
        torch.device("cpu"),
    )
    comps = tr.compute_gradients(tr.examples)
    assert {k for k in comps if k.startswith("loss_con/")} == {"loss_con/content", "loss_con/emb"}
    bert = str(tiny_dirs["bert"])
    bad = load_config(
        TrainConfig,
        {
            "method": "twinbert",
            "output_dir": str(tmp_path),
            "dim": 16,
            "loss": {"dims": [8, 16]},
            "query_tower": {"model": bert},
            "doc_tower": {"model": bert, "prompt": "plain"},
        },
    )
    with pytest.raises(
        ScalingNoteError, match=r"doc_tower\.prompt 'plain' is for LLM document towers; .* is a bert tower"
    ):
        build_towers(bad, torch.device("cpu"))
