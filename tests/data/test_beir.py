"""Data layer: round trips and one clear error (file, line, field) per kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalingnote.data import (
    Document,
    Query,
    Triplet,
    load_beir,
    load_corpus,
    load_qrels,
    load_queries,
    load_triplets,
    read_run,
    write_beir,
    write_run,
    write_triplets,
)
from scalingnote.data.beir import iter_corpus
from scalingnote.errors import DataError


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _good_dir(tmp_path: Path) -> Path:
    docs = [Document("d1", "Title one", "topicA", "content one"), Document("d2", "", "", "内容 二")]
    queries = [Query("q1", "first query"), Query("q2", "second")]
    write_beir(tmp_path, docs, queries, {"test": {"q1": {"d1": 1}, "q2": {"d2": 2, "d1": 0}}})
    return tmp_path


def test_round_trip(tmp_path):
    root = _good_dir(tmp_path)
    ds = load_beir(root, "test")
    assert ds.corpus["d1"] == Document("d1", "Title one", "topicA", "content one")
    assert ds.corpus["d2"].content == "内容 二"
    assert ds.queries["q2"].text == "second"
    assert ds.qrels == {"q1": {"d1": 1}, "q2": {"d2": 2, "d1": 0}}
    rec = json.loads((root / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert rec == {"_id": "d1", "title": "Title one", "text": "content one", "topic": "topicA"}


def _err(exc: pytest.ExceptionInfo) -> DataError:
    return exc.value


@pytest.mark.parametrize(
    "lines, line, field, words",
    [
        (['{"_id": "a", "text": "x"}', '{"_id": "b", "text": '], 2, None, "malformed JSON"),
        (['{"_id": "a", "text": "x"}', '["not", "an", "object"]'], 2, None, "JSON object"),
        (['{"_id": "a", "text": "x"}', '{"title": "t", "text": "y"}'], 2, "_id", "missing"),
        (['{"_id": "a", "text": "x"}', '{"_id": "a", "text": "y"}'], 2, "_id", "duplicate"),
        (['{"_id": "a", "text": 5}'], 1, "text", "expected a string"),
        (['{"_id": 7, "text": "x"}'], 1, "_id", "expected a string"),
        (['{"_id": "", "text": "x"}'], 1, "_id", "empty"),
        (['{"_id": "a", "title": ["t"], "text": "x"}'], 1, "title", "expected a string"),
        (['{"_id": "a"}'], 1, "text", "missing"),
    ],
)
def test_corpus_errors_name_file_line_field(tmp_path, lines, line, field, words):
    path = _write(tmp_path / "corpus.jsonl", lines)
    with pytest.raises(DataError) as exc:
        load_corpus(path)
    e = _err(exc)
    assert e.path == str(path) and e.line == line and e.field == field
    assert words in str(e) and str(path) in str(e) and f"line {line}" in str(e)


def test_empty_document_skipped_with_count_or_error(tmp_path):
    path = _write(
        tmp_path / "corpus.jsonl",
        ['{"_id": "a", "text": "x"}', '{"_id": "b", "title": "", "text": "  "}', '{"_id": "c", "text": ""}'],
    )
    with pytest.warns(UserWarning, match=r"skipped 2 invalid empty documents.*line 2"):
        docs = load_corpus(path)
    assert list(docs) == ["a"]
    with pytest.raises(DataError) as exc:
        load_corpus(path, on_empty="error")
    assert exc.value.line == 2 and exc.value.field == "text"


def test_on_invalid_skip_warns_with_count(tmp_path):
    path = _write(
        tmp_path / "queries.jsonl", ['{"_id": "a", "text": "x"}', '{"_id": "b", "text": ""}', '{"_id": "c", "text": 3}']
    )
    with pytest.raises(DataError) as exc:
        load_queries(path)
    assert (exc.value.line, exc.value.field) == (2, "text")
    with pytest.warns(UserWarning, match="skipped 2 invalid queries"):
        qs = load_queries(path, on_invalid="skip")
    assert list(qs) == ["a"]


def test_malformed_json_is_an_error_even_when_skipping(tmp_path):
    path = _write(tmp_path / "queries.jsonl", ['{"_id": "a", "text": "x"}', "{oops"])
    with pytest.raises(DataError, match="malformed JSON") as exc:
        load_queries(path, on_invalid="skip")
    assert exc.value.line == 2


def test_not_utf8(tmp_path):
    path = tmp_path / "queries.jsonl"
    path.write_bytes(b'{"_id": "a", "text": "x"}\n{"_id": "b", "text": "\xff\xfe"}\n')
    with pytest.raises(DataError, match="UTF-8") as exc:
        load_queries(path)
    assert exc.value.line == 2


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        load_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="directory not found"):
        load_beir(tmp_path / "nope")


@pytest.mark.parametrize(
    "rows, line, field, words",
    [
        (["query-id\tcorpus-id\tscore", "q1\td1\t1", "q9\td1\t1"], 3, "query-id", "unknown query id 'q9'"),
        (["query-id\tcorpus-id\tscore", "q1\tdX\t1"], 2, "corpus-id", "unknown document id 'dX'"),
        (["query-id\tcorpus-id\tscore", "q1\td1\thigh"], 2, "score", "integer"),
        (["query-id\tcorpus-id\tscore", "q1\td1\t1.5"], 2, "score", "integer"),
        (["query-id\tcorpus-id\tscore", "q1\td1"], 2, None, "3 tab-separated columns"),
        (["query-id\tcorpus-id\tscore", "q1\td1\t1", "q1\td1\t0"], 3, "corpus-id", "duplicate"),
    ],
)
def test_qrels_errors(tmp_path, rows, line, field, words):
    root = _good_dir(tmp_path)
    _write(root / "qrels" / "test.tsv", rows)
    with pytest.raises(DataError) as exc:
        load_beir(root, "test")
    e = exc.value
    assert (e.line, e.field) == (line, field) and words in str(e) and "test.tsv" in str(e)


def test_qrels_without_header_and_trec_format(tmp_path):
    p = _write(tmp_path / "q.tsv", ["q1\td1\t1", "q2 0 d2 2"])
    assert load_qrels(p) == {"q1": {"d1": 1}, "q2": {"d2": 2}}


def test_run_round_trip_and_errors(tmp_path):
    run = {"q1": {"d1": 0.5, "d2": 1.5, "d3": 1.5}, "q2": {"d9": -1.0}}
    path = tmp_path / "run.trec"
    write_run(path, run)
    lines = path.read_text().splitlines()
    assert lines[0].split()[:4] == ["q1", "Q0", "d2", "1"] and lines[1].split()[2] == "d3"
    assert read_run(path) == run
    _write(path, ["q1 Q0 d1 1 notanumber tag"])
    with pytest.raises(DataError) as exc:
        read_run(path)
    assert (exc.value.line, exc.value.field) == (1, "score")
    _write(path, ["q1 Q0 d1 1 1.0 tag", "q1 Q0 d1 2 0.5 tag"])
    with pytest.raises(DataError, match="twice") as exc:
        read_run(path)
    assert exc.value.line == 2


def test_triplets_round_trip_and_validation(tmp_path):
    ts = [Triplet("q1", "d1", "d2", "click_one_hop"), Triplet("q2", "d2", None, "bm25")]
    p = tmp_path / "t.jsonl"
    assert write_triplets(p, ts) == 2
    assert load_triplets(p) == ts
    with pytest.raises(DataError) as exc:
        load_triplets(p, query_ids={"q1"})
    assert (exc.value.line, exc.value.field) == (2, "query_id")
    with pytest.raises(DataError) as exc:
        load_triplets(p, doc_ids={"d1", "d2"} - {"d2"})
    assert (exc.value.line, exc.value.field) == (1, "neg_id")
    _write(p, ['{"query_id": "q1", "pos_id": "d1", "neg_id": 3}'])
    with pytest.raises(DataError) as exc:
        load_triplets(p)
    assert (exc.value.line, exc.value.field) == (1, "neg_id")


def test_streaming_reader_is_lazy(tmp_path):
    path = _write(tmp_path / "corpus.jsonl", ['{"_id": "a", "text": "x"}', "{broken"])
    it = iter_corpus(path)
    assert next(it).id == "a"  # first record is served before the bad line is read
    with pytest.raises(DataError):
        next(it)


@pytest.mark.shared_data
def test_shared_sets_load(shared_data):
    ds = load_beir(shared_data / "scifact", "test")
    assert len(ds.corpus) == 5183 and len(ds.queries) == 300
    with pytest.warns(UserWarning, match="skipped 1 invalid empty documents"):
        kq = load_beir(shared_data / "kuake_qtr", "test")
    assert len(kq.queries) > 1000
