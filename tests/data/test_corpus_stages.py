"""Every stage reads documents through the corpus entry point: a BEIR directory whose corpus is
in a user-registered format (TSV) gives each stage the same documents as its JSONL twin."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalingnote.data import Document, Query, corpus, write_beir
from scalingnote.data.corpus import register_corpus_format

WORDS = "vitamin fracture knee running obesity attention sleep coffee heart liver lung brain".split()


def read_tsv(path: Path):
    from scalingnote.data.jsonl import iter_text_lines

    for _, line in iter_text_lines(path):
        doc_id, title, text = line.rstrip("\n").split("\t")
        yield Document(doc_id, title, "", text)


@pytest.fixture()
def twins(tmp_path):
    """Two BEIR directories with the same documents: corpus.jsonl and corpus.testtsv (the format
    "test_stages_tsv" is registered for the test only; a user's own "tsv" never collides with it)."""
    with corpus.FORMATS.scoped():
        yield _write_twins(tmp_path)


def _write_twins(tmp_path):
    register_corpus_format("test_stages_tsv", read_tsv, suffixes=(".testtsv",))
    docs = [
        Document(f"d{i}", f"{w} study", "", f"{w} {WORDS[(i + 3) % len(WORDS)]} and {w} in adults")
        for i, w in enumerate(WORDS)
    ]
    queries = [Query(f"q{i}", f"{w} effects") for i, w in enumerate(WORDS)]
    train = {f"q{i}": {f"d{i}": 1} for i in range(8)}
    test = {f"q{i}": {f"d{i}": 1} for i in range(8, 12)}
    jsonl, tsv = tmp_path / "jsonl", tmp_path / "tsv"
    write_beir(jsonl, docs, queries, {"train": train, "test": test})
    write_beir(tsv, docs, queries, {"train": train, "test": test})
    (tsv / "corpus.jsonl").unlink()
    (tsv / "corpus.testtsv").write_text("".join(f"{d.id}\t{d.title}\t{d.content}\n" for d in docs), encoding="utf-8")
    return jsonl, tsv, docs


def test_beir_training_and_tmj_data(twins):
    from scalingnote.data import load_beir
    from scalingnote.pq.config import PQDataSpec
    from scalingnote.pq.data import load_pq_data
    from scalingnote.training.config import DataSpec
    from scalingnote.training.data import load_training_data

    jsonl, tsv, docs = twins
    a, b = load_beir(jsonl, "test"), load_beir(tsv, "test")
    assert list(b.corpus.values()) == docs and (a.queries, a.qrels) == (b.queries, b.qrels)
    ta = load_training_data(
        DataSpec(str(jsonl), negatives="bm25", neg_skip_top=1, neg_max_rank=5), seed=3, show_progress=False
    )
    tb = load_training_data(
        DataSpec(str(tsv), negatives="bm25", neg_skip_top=1, neg_max_rank=5), seed=3, show_progress=False
    )
    assert list(tb.corpus.values()) == docs
    assert (ta.train, ta.validation, ta.eval_qrels) == (tb.train, tb.validation, tb.eval_qrels)
    assert all(e.neg is not None for e in tb.train)  # BM25 mined negatives over the TSV documents
    pa, pb = load_pq_data(PQDataSpec(str(jsonl))), load_pq_data(PQDataSpec(str(tsv)))
    assert pb.docs == docs and (pa.train_pos, pa.eval_qrels) == (pb.train_pos, pb.eval_qrels)


def test_bm25_serve_and_pseudo_queries(twins, tmp_path):
    from scalingnote.data.pseudo import select_documents
    from scalingnote.serve.corpus import load_documents, resolve_corpus_path
    from scalingnote.sparse.bm25 import bm25_search, open_or_build_bm25

    jsonl, tsv, docs = twins
    run_a, _ = bm25_search(jsonl, "test", k=5, show_progress=False)
    run_b, _ = bm25_search(tsv, "test", k=5, show_progress=False)
    assert run_a == run_b and max(run_b["q9"], key=run_b["q9"].get) == "d9"
    ra = open_or_build_bm25(tmp_path / "ia", jsonl / "corpus.jsonl", show_progress=False)
    rb = open_or_build_bm25(tmp_path / "ib", tsv, show_progress=False)
    assert ra.search({"q": "knee running"}, k=3) == rb.search({"q": "knee running"}, k=3)
    path = resolve_corpus_path({}, tsv)
    assert path == tsv / "corpus.testtsv"
    assert load_documents(path, ["d2", "d5"]) == load_documents(jsonl / "corpus.jsonl", ["d2", "d5"])
    assert select_documents(tsv, 4, seed=1) == select_documents(jsonl, 4, seed=1)
