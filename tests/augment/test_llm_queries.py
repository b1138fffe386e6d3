"""LLM pseudo-queries: output cleaning, resumable and deterministic generation, settings guard."""

from __future__ import annotations

import json

import pytest

from scalingnote.augment.llm_queries import EXAMPLE_QUERY, LLMQueryConfig, clean_generation, llm_queries
from scalingnote.data import Document, load_qrels, load_queries, write_corpus


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
    write_corpus(
        path,
        [Document(f"d{i}", f"title {i}", "", f"The quick brown fox number {i} jumps. It is fast.") for i in range(n)],
    )


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
    # every document got a generation, and the written queries are exactly the cleaned non-empty ones
    recs = [json.loads(x) for x in second]
    assert all(r["raw"].strip() for r in recs), recs
    cleaned = {r["doc_id"]: clean_generation(r["raw"]) for r in recs}
    expected = {f"llm-{d}": q for d, q in cleaned.items() if q and q.lower() != EXAMPLE_QUERY}
    assert expected, f"every generation cleaned to nothing, so nothing below is checked: {recs}"
    assert {q.id: q.text for q in load_queries(out / "queries.jsonl").values()} == expected
    assert load_qrels(out / "qrels" / "train.tsv") == {q: {q.removeprefix("llm-"): 1} for q in expected}
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["documents"], stats["queries"], stats["empty_generations"]) == (6, len(expected), 6 - len(expected))


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
        llm_queries(
            tmp_path / "corpus.jsonl",
            tmp_path / "a",
            LLMQueryConfig(model=str(tiny_lm), max_new_tokens=6),
            progress=False,
        )


def test_llm_rejects_a_non_model(tmp_path):
    from scalingnote.errors import ConfigError

    _corpus(tmp_path / "corpus.jsonl", 1)
    with pytest.raises(ConfigError):
        llm_queries(
            tmp_path / "corpus.jsonl", tmp_path / "o", LLMQueryConfig(model=str(tmp_path / "missing")), progress=False
        )


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.shared_data
def test_smollm2_writes_queries_for_scifact(tmp_path, shared_data):
    pairs = llm_queries(
        shared_data / "scifact" / "corpus.jsonl",
        tmp_path,
        LLMQueryConfig(max_docs=2, max_new_tokens=16),
        progress=False,
    )
    assert len(pairs) >= 1 and all(2 <= len(p.query.text.split()) <= 40 for p in pairs)
