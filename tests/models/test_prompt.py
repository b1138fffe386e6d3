"""The §3.2 document prompt: template parsing, field budgets, placeholder survival."""

from __future__ import annotations

import pytest

from scalingnote.data import Document
from scalingnote.errors import ConfigError
from scalingnote.models import PAPER_DOCUMENT_PROMPT, DocumentPrompt, allocate_budget, tiny_tokenizer
from scalingnote.models.prompt import SPECIAL_TOKENS, parse_template


@pytest.fixture(scope="module")
def tok():
    t = tiny_tokenizer("llm")
    t.add_special_tokens({"extra_special_tokens": list(SPECIAL_TOKENS)}, replace_extra_special_tokens=False)
    return t


def test_paper_template_text():
    # verbatim from ScalingNote §3.2 (curly quotes included)
    assert PAPER_DOCUMENT_PROMPT.startswith("Document: {‘title’: {title}}. Predict a query term: “[TITLE_QUERY]”.")
    assert (
        "‘topic’: {topic}, ‘content’: {content}}. Predict a query term: “[CONTENT_QUERY]”, combine the predicted"
        in PAPER_DOCUMENT_PROMPT
    )
    assert PAPER_DOCUMENT_PROMPT.endswith("compress the above content into one word: “[EMB]”.")
    kinds = [s for s in parse_template(PAPER_DOCUMENT_PROMPT) if s[0] != "text"]
    assert kinds == [
        ("field", "title"),
        ("view", "title"),
        ("field", "topic"),
        ("field", "content"),
        ("view", "content"),
        ("view", "emb"),
    ]


@pytest.mark.parametrize(
    "template",
    [
        "no placeholders {title}",
        "[TITLE_QUERY] [CONTENT_QUERY]",
        "[TITLE_QUERY] [CONTENT_QUERY] [EMB] [EMB]",
        "{title} {title} [TITLE_QUERY][CONTENT_QUERY][EMB]",
    ],
)
def test_bad_templates_are_config_errors(template):
    with pytest.raises(ConfigError, match="doc_prompt"):
        parse_template(template)


def test_allocate_budget_water_filling():
    assert allocate_budget({"title": 3, "topic": 0, "content": 10}, 20) == {"title": 3, "topic": 0, "content": 10}
    assert allocate_budget({"title": 3, "topic": 0, "content": 100}, 20) == {"title": 3, "topic": 0, "content": 17}
    assert allocate_budget({"title": 50, "topic": 2, "content": 100}, 21) == {"title": 10, "topic": 2, "content": 9}
    assert allocate_budget({"title": 5, "topic": 5, "content": 5}, 0) == {"title": 0, "topic": 0, "content": 0}
    for budget in range(0, 40):
        a = allocate_budget({"title": 7, "topic": 13, "content": 29}, budget)
        assert sum(a.values()) == min(budget, 49)
        assert a["title"] <= 7 and a["topic"] <= 13 and a["content"] <= 29


def test_encode_matches_rendered_text_and_positions(tok):
    p = DocumentPrompt(tok)
    doc = Document("d", "Dense retrieval", "search", "Product quantization compresses embeddings.")
    (e,) = p.encode([doc], 512)
    assert not e.truncated
    assert tok.decode(e.input_ids) == p.render(doc)
    ids = {tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    assert [e.input_ids[i + 1] for i in e.view_positions] == [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert sum(1 for t in e.input_ids if t in ids) == 3


@pytest.mark.parametrize("max_length", [None, 0, 1, 5, 17, 40])
def test_truncation_cuts_fields_never_the_template(tok, max_length):
    p = DocumentPrompt(tok)
    long = " ".join(["The quick brown fox jumps over the lazy dog."] * 30)
    doc = Document("d", "A title " * 40, "topic " * 50, long)
    limit = p.fixed_length + (max_length if max_length is not None else 10_000)
    (e,) = p.encode([doc], limit)
    assert len(e.input_ids) <= limit
    assert [e.input_ids[i + 1] for i in e.view_positions] == [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    text = tok.decode(e.input_ids)
    assert text.startswith("Document: {‘title’:") and text.endswith(
        "compress the above content into one word: “[EMB]”."
    )
    if max_length is not None:
        assert e.truncated
        assert sum(e.field_tokens.values()) <= max_length
    else:
        assert e.field_tokens["title"] == 64 and e.field_tokens["topic"] == 32  # default caps


def test_max_length_shorter_than_template_is_a_config_error(tok):
    p = DocumentPrompt(tok)
    with pytest.raises(ConfigError, match="max_doc_length"):
        p.encode([Document("d", "t", "", "c")], p.fixed_length - 1)


def test_missing_placeholder_tokens_is_a_config_error():
    with pytest.raises(ConfigError, match="placeholder"):
        DocumentPrompt(tiny_tokenizer("llm"))
