"""Pseudo-queries: sentence splitting, inverse cloze task, resumable LLM generation."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from scalingnote.data import Document, load_corpus, load_qrels, load_queries, load_triplets, write_corpus
from scalingnote.data.pseudo import (
    ICTConfig,
    LLMQueryConfig,
    clean_generation,
    ict_example,
    ict_queries,
    llm_queries,
    remove_span,
    sentence_spans,
    split_sentences,
)

EN = "Vitamin D is made in the skin. Low levels are common in winter! Do supplements help? We ran a trial in 2019."
ZH = "宝宝十个月还没长牙。这是正常的吗？医生说不用担心！"


def test_english_and_chinese_sentence_splitting():
    assert split_sentences(EN) == [
        "Vitamin D is made in the skin.",
        "Low levels are common in winter!",
        "Do supplements help?",
        "We ran a trial in 2019.",
    ]
    assert split_sentences(ZH) == ["宝宝十个月还没长牙。", "这是正常的吗？", "医生说不用担心！"]
    assert split_sentences("The value was 3.5 mg, e.g. small. Next one.") == ["The value was 3.5 mg, e.g. small.", "Next one."]
    assert split_sentences("") == []


def test_remove_span_joins_neighbours():
    spans = sentence_spans(EN)
    assert remove_span(EN, spans[1]) == "Vitamin D is made in the skin. Do supplements help? We ran a trial in 2019."
    zs = sentence_spans(ZH)
    assert remove_span(ZH, zs[1]) == "宝宝十个月还没长牙。医生说不用担心！"


def test_ict_removes_the_query_sentence_from_the_document():
    doc = Document("d1", "Vitamin D", "", EN)
    for seed in range(10):
        sentence, new = ict_example(doc, random.Random(seed), min_words=4)
        assert sentence in split_sentences(EN)
        assert sentence not in new.content
        assert len(split_sentences(new.content)) == 3
        assert new.title == doc.title and new.id == doc.id
    # "Do supplements help?" has 3 words: never chosen with min_words=4
    assert all(ict_example(doc, random.Random(s), 4)[0] != "Do supplements help?" for s in range(30))
    kept = ict_example(doc, random.Random(0), 4, keep_sentence_prob=1.0)
    assert kept[1] == doc
    assert ict_example(Document("x", "", "", "Only one sentence here."), random.Random(0)) is None


def test_ict_queries_writes_queries_qrels_and_modified_corpus(tmp_path):
    docs = [
        Document("a", "t", "", EN),
        Document("b", "t", "", "Single sentence only here."),
        Document("c", "t", "", ZH),
    ]
    write_corpus(tmp_path / "corpus.jsonl", docs)
    out = tmp_path / "ict"
    pairs = ict_queries(tmp_path / "corpus.jsonl", out, ICTConfig(seed=1, write_corpus=True, min_words=2), progress=False)
    assert [p.doc_id for p in pairs] == ["a", "c"]
    queries = load_queries(out / "queries.jsonl")
    qrels = load_qrels(out / "qrels" / "train.tsv", queries, {"a", "b", "c"})
    assert qrels == {"ict-a": {"a": 1}, "ict-c": {"c": 1}}
    corpus = load_corpus(out / "corpus.jsonl")
    assert set(corpus) == {"a", "b", "c"} and corpus["b"].content == docs[1].content
    assert queries["ict-a"].text not in corpus["a"].content and queries["ict-a"].text in EN
    assert queries["ict-c"].text not in corpus["c"].content
    assert [t.source for t in load_triplets(out / "triplets.jsonl")] == ["ict", "ict"]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["queries"] == 2 and stats["skipped_documents"] == 1
    # seeded
    again = ict_queries(tmp_path / "corpus.jsonl", tmp_path / "ict2", ICTConfig(seed=1, min_words=2), progress=False)
    assert [p.query for p in again] == [p.query for p in pairs]


def test_clean_generation():
    assert clean_generation('Query: "vitamin d and fractures"\nmore') == "vitamin d and fractures"
    assert clean_generation("Here is a search query that answers it:\n\n1. knee pain running") == "knee pain running"
    assert clean_generation("The search query: ikaros lymphoid priming") == "ikaros lymphoid priming"
    assert clean_generation("  \n ") == ""
    loop = "broad antibody broad neutralizing antibody broad antibody broad antibody monoclonal antibody"
    assert clean_generation(loop) == "broad antibody broad neutralizing antibody"
    assert clean_generation("obesity and ADHD: association between obesity and attention deficit") == (
        "obesity and ADHD: association between obesity and attention deficit"  # a repeated bigram is fine
    )


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from scalingnote.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tinylm") / "lm", "llm", num_layers=2, hidden_size=32)


def _corpus(path, n):
    write_corpus(path, [Document(f"d{i}", f"title {i}", "", f"The quick brown fox number {i} jumps. It is fast.") for i in range(n)])


def test_llm_generation_is_resumable_and_deterministic(tmp_path, tiny_lm):
    _corpus(tmp_path / "corpus.jsonl", 4)
    cfg = LLMQueryConfig(model=str(tiny_lm), batch_size=3, max_new_tokens=6)
    out = tmp_path / "llm"
    llm_queries(tmp_path / "corpus.jsonl", out, cfg, progress=False)
    log = out / "generations.jsonl"
    first = log.read_text().splitlines()
    assert [json.loads(x)["doc_id"] for x in first] == ["d0", "d1", "d2", "d3"]
    # simulate an interruption while writing, then a bigger corpus: only new docs are generated
    with open(log, "a") as fh:
        fh.write('{"doc_id": "d4", "que')
    _corpus(tmp_path / "corpus.jsonl", 6)
    llm_queries(tmp_path / "corpus.jsonl", out, cfg, progress=False)
    second = log.read_text().splitlines()
    assert second[:4] == first
    assert [json.loads(x)["doc_id"] for x in second[4:]] == ["d4", "d5"]
    # greedy decoding: a fresh run gives the same generations
    fresh = tmp_path / "llm_fresh"
    llm_queries(tmp_path / "corpus.jsonl", fresh, cfg, progress=False)
    assert [json.loads(x)["raw"] for x in (fresh / "generations.jsonl").read_text().splitlines()] == [
        json.loads(x)["raw"] for x in second
    ]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["documents"] == 6 and stats["queries"] + stats["empty_generations"] == 6
    queries = load_queries(out / "queries.jsonl") if stats["queries"] else {}
    assert all(q.startswith("llm-d") for q in queries)


def test_llm_seeded_sampling_and_settings_guard(tmp_path, tiny_lm):
    from scalingnote.errors import ConfigError

    _corpus(tmp_path / "corpus.jsonl", 3)

    def raw(out, seed):
        cfg = LLMQueryConfig(model=str(tiny_lm), max_new_tokens=6, do_sample=True, temperature=1.0, seed=seed)
        llm_queries(tmp_path / "corpus.jsonl", tmp_path / out, cfg, progress=False)
        return [json.loads(x)["raw"] for x in (tmp_path / out / "generations.jsonl").read_text().splitlines()]

    assert raw("a", 1) == raw("b", 1)
    assert raw("c", 2) != raw("a", 1)
    # resuming into a directory made with other settings is refused
    with pytest.raises(ConfigError, match="different settings"):
        llm_queries(tmp_path / "corpus.jsonl", tmp_path / "a", LLMQueryConfig(model=str(tiny_lm), max_new_tokens=6), progress=False)


def test_llm_rejects_a_non_model(tmp_path):
    from scalingnote.errors import ConfigError

    _corpus(tmp_path / "corpus.jsonl", 1)
    with pytest.raises(ConfigError):
        llm_queries(tmp_path / "corpus.jsonl", tmp_path / "o", LLMQueryConfig(model=str(tmp_path / "missing")), progress=False)


def test_cli_pseudo_ict(tmp_path):
    import typer

    from scalingnote.cli.data import register

    write_corpus(tmp_path / "corpus.jsonl", [Document("a", "t", "", EN)])
    app = typer.Typer()
    register(app)
    r = CliRunner().invoke(app, ["data", "pseudo", "--data", str(tmp_path), "--method", "ict", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert len(load_queries(tmp_path / "o" / "queries.jsonl")) == 1
    r = CliRunner().invoke(app, ["data", "pseudo", "--data", str(tmp_path), "--method", "bogus", "--out", str(tmp_path / "o")])
    assert r.exit_code != 0


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.shared_data
def test_smollm2_writes_queries_for_scifact(tmp_path, shared_data):
    pairs = llm_queries(
        shared_data / "scifact" / "corpus.jsonl", tmp_path, LLMQueryConfig(max_docs=2, max_new_tokens=16), progress=False
    )
    assert len(pairs) >= 1 and all(2 <= len(p.query.text.split()) <= 40 for p in pairs)
