"""The live index's input checks (:mod:`scalingnote.live.records`) without a server: every
problem of every record of a request batch in one error; a JSONL file's first bad line named;
ids kept exactly as sent (padded, control-character and surrogate ids refused)."""

from __future__ import annotations

import pytest

from scalingnote.errors import DataError
from scalingnote.live.records import BatchError, documents_from_records, id_problem, read_documents, read_ids


def test_a_request_batch_reports_every_problem_and_keeps_ids_exact():
    recs = [
        {"_id": "a b", "title": "inner space kept", "text": "t"},
        {"_id": "x", "id": "y", "text": "t", "content": "c"},
        {"_id": "s", "topic": "to\udfffpic", "text": None},
        {"_id": "a b", "text": "repeat"},
        {"_id": "ok", "text": "   "},
    ]
    with pytest.raises(BatchError) as e:
        documents_from_records(recs)
    got = [(p.index, p.doc_id, p.field) for p in e.value.problems]
    assert got == [
        (1, "x", "id"),
        (1, "x", "content"),
        (2, "s", "topic"),
        (2, "s", "text"),
        (3, "a b", "_id"),
        (4, "ok", "text"),
    ], got
    assert "4 of 5 documents refused, none applied" in str(e.value) and isinstance(e.value, DataError)
    (doc,) = documents_from_records([recs[0]])
    assert doc.id == "a b" and doc.title == "inner space kept"


@pytest.mark.parametrize(
    ("doc_id", "why"),
    [
        (" padded", "leading or trailing whitespace"),
        ("padded\n", "leading or trailing whitespace"),
        ("a\x00b", "control character U+0000"),
        ("a\ud800", "lone surrogate U+D800"),
        ("", "must not be empty"),
        ("x" * 513, "more than the limit of 512"),
    ],
)
def test_id_rule(doc_id, why):
    assert why in id_problem(doc_id)
    with pytest.raises(BatchError) as e:
        documents_from_records([{"_id": doc_id, "text": "t"}])
    assert e.value.problems[0].field == "_id" and why in e.value.problems[0].reason


def test_a_jsonl_file_names_the_first_bad_line_and_field(tmp_path):
    p = tmp_path / "docs.jsonl"
    p.write_text('{"_id": "ok", "text": "fine"}\n{"_id": "bad", "text": "lone \\ud800 surrogate"}\n', encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_documents(p)
    assert e.value.line == 2 and e.value.field == "text" and "lone surrogate" in str(e.value) and str(p) in str(e.value)
    ids = tmp_path / "ids.txt"
    ids.write_text(" padded \nok\n\nok\n", encoding="utf-8")
    assert read_ids(ids) == ["padded", "ok"]  # a line's surrounding whitespace is not part of the id
    ids.write_text("a\x01b\n", encoding="utf-8")
    with pytest.raises(DataError, match="control character"):
        read_ids(ids)
