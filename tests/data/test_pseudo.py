"""Pseudo-queries: sentence splitting, inverse cloze task (LLM generation: tests/augment)."""

from __future__ import annotations

import json
import random

from typer.testing import CliRunner

from scalingnote.data import Document, load_corpus, load_qrels, load_queries, load_triplets, write_corpus
from scalingnote.data.pseudo import (
    ICTConfig,
    corpus_texts,
    ict_example,
    ict_queries,
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
    assert split_sentences("The value was 3.5 mg, e.g. small. Next one.") == [
        "The value was 3.5 mg, e.g. small.",
        "Next one.",
    ]
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
    pairs = ict_queries(
        tmp_path / "corpus.jsonl", out, ICTConfig(seed=1, write_corpus=True, min_words=2), progress=False
    )
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


def test_corpus_texts_are_titles_and_sentences_deduplicated_and_sampled_with_the_seed(tmp_path):
    title = "Vitamin D in winter"
    b_text = "Too short. Low levels are common in winter! Teeth come late sometimes."
    write_corpus(
        tmp_path / "corpus.jsonl",
        [Document("a", title, "", EN), Document("b", title, "", b_text), Document("c", "", "", ZH)],
    )
    got = corpus_texts(tmp_path / "corpus.jsonl", tmp_path / "t", max_texts=100, min_words=3)
    texts = [q.text for q in got]
    # every title and every long-enough sentence once (b's title and its second sentence repeat a's)
    assert texts == ["Vitamin D in winter", *split_sentences(EN), "Teeth come late sometimes.", *split_sentences(ZH)]
    assert [q.id for q in got][:2] == ["title-a", "sent-a-0"] and "Too short." not in texts
    assert set(load_queries(tmp_path / "t" / "queries.jsonl")) == {q.id for q in got}
    assert not (tmp_path / "t" / "qrels").exists()  # unlabelled: nothing here is a relevance judgement
    stats = json.loads((tmp_path / "t" / "stats.json").read_text())
    assert stats["distinct_texts"] == len(texts) and stats["titles"] == 1
    # a cap keeps a seeded sample, in corpus order
    a = corpus_texts(tmp_path / "corpus.jsonl", tmp_path / "s1", max_texts=3, seed=5, min_words=3)
    b = corpus_texts(tmp_path / "corpus.jsonl", tmp_path / "s2", max_texts=3, seed=5, min_words=3)
    assert [q.id for q in a] == [q.id for q in b] and len(a) == 3
    assert [texts.index(q.text) for q in a] == sorted(texts.index(q.text) for q in a)
    try:
        corpus_texts(tmp_path / "corpus.jsonl", tmp_path / "bad", max_texts=0)
    except ValueError as e:
        assert "max_texts" in str(e)
    else:
        raise AssertionError("max_texts=0 accepted")


def test_cli_pseudo_ict(tmp_path):
    import typer

    from scalingnote.cli.data import register

    write_corpus(tmp_path / "corpus.jsonl", [Document("a", "t", "", EN)])
    app = typer.Typer()
    register(app)
    r = CliRunner().invoke(
        app, ["data", "pseudo", "--data", str(tmp_path), "--method", "ict", "--out", str(tmp_path / "o")]
    )
    assert r.exit_code == 0, r.output
    assert len(load_queries(tmp_path / "o" / "queries.jsonl")) == 1
    r = CliRunner().invoke(
        app, ["data", "pseudo", "--data", str(tmp_path), "--method", "bogus", "--out", str(tmp_path / "o")]
    )
    assert r.exit_code != 0
