"""Click / relevance log readers (validation) and the one-hop triplet builders."""

from __future__ import annotations

import json

import pytest

from scalingnote.data import logs as L
from scalingnote.data.logs import (
    ClickRecord,
    RelevanceRecord,
    read_click_log,
    read_relevance_log,
    write_click_log,
    write_relevance_log,
)
from scalingnote.errors import DataError

QIDS = {"q1", "q2"}
DIDS = {"d1", "d2", "d3", "d4"}


def _tsv(tmp_path, name, rows, header=None):
    p = tmp_path / name
    lines = ([header] if header else []) + rows
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def _err(fn, *args) -> DataError:
    with pytest.raises(DataError) as ei:
        fn(*args)
    return ei.value


def test_click_tsv_with_and_without_header(tmp_path):
    rows = ["q1\td1\t1\t1", "q1\td2\t2\t0"]
    a = read_click_log(_tsv(tmp_path, "a.tsv", rows, "query_id\tdoc_id\tposition\tclicked"), QIDS, DIDS)
    b = read_click_log(_tsv(tmp_path, "b.tsv", rows), QIDS, DIDS)
    assert [(r.query_id, r.doc_id, r.position, r.clicked) for r in a] == [("q1", "d1", 1, True), ("q1", "d2", 2, False)]
    assert [(r.query_id, r.doc_id, r.position, r.clicked) for r in b] == [
        (r.query_id, r.doc_id, r.position, r.clicked) for r in a
    ]
    assert a[0].line == 2 and b[0].line == 1


def test_header_may_reorder_columns(tmp_path):
    p = _tsv(tmp_path, "c.tsv", ["1\t0\td1\tq1\textra"], "clicked\tposition\tdoc_id\tquery_id\tsession")
    (r,) = read_click_log(p, QIDS, DIDS)
    assert (r.query_id, r.doc_id, r.position, r.clicked) == ("q1", "d1", 0, True)


# kind -> (reader, file name, header, a valid first row)
_LOGS = {
    "click": (read_click_log, "clicks.tsv", "query_id\tdoc_id\tposition\tclicked", "q1\td1\t1\t1"),
    "relevance": (read_relevance_log, "rel.tsv", "query_id\tdoc_id\tscore", "q1\td1\t0.9"),
}


#: malformed rows of each log, grouped by the field the error names and what it says
_BAD_ROWS = {
    ("click", "position", "non-negative integer"): ["q1\td1\tx\t1", "q1\td1\t1.5\t1", "q1\td1\t-1\t1"],
    ("click", "clicked", "0 or 1"): ["q1\td1\t1\t2", "q1\td1\t1\tyes"],
    ("click", "query_id", "unknown query id 'q9'"): ["q9\td1\t1\t1"],
    ("click", "doc_id", "unknown document id 'd9'"): ["q1\td9\t1\t1"],
    ("click", "query_id", "empty id"): ["\td1\t1\t1"],
    ("relevance", "score", "expected a number"): ["q1\td2\thigh"],
    ("relevance", "score", "finite"): ["q1\td2\tnan"],
    ("relevance", "doc_id", "second score"): ["q1\td1\t0.3"],
    ("relevance", "query_id", "unknown query id"): ["q7\td2\t0.3"],
}


@pytest.mark.parametrize(
    "kind, row, field, needle", [(k, row, f, n) for (k, f, n), rows in _BAD_ROWS.items() for row in rows]
)
def test_malformed_log_row_names_file_line_field(tmp_path, kind, row, field, needle):
    reader, name, header, good = _LOGS[kind]
    p = _tsv(tmp_path, name, [good, row], header)
    e = _err(reader, p, QIDS, DIDS)
    assert e.path == str(p) and e.line == 3 and e.field == field
    assert needle in str(e) and name in str(e) and "line 3" in str(e)


def test_wrong_column_count(tmp_path):
    e = _err(read_click_log, _tsv(tmp_path, "c.tsv", ["q1\td1\t1"]), QIDS, DIDS)
    assert e.line == 1 and "4 tab-separated columns" in str(e)


def test_click_jsonl_validation(tmp_path):
    p = tmp_path / "clicks.jsonl"
    recs = [
        {"query_id": "q1", "doc_id": "d1", "position": 1, "clicked": True},
        {"query_id": "q1", "doc_id": "d2", "position": 2, "clicked": 0},
    ]
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert [r.clicked for r in read_click_log(p, QIDS, DIDS)] == [True, False]
    for bad, field in (
        ({"query_id": "q1", "doc_id": "d1", "position": 2.5, "clicked": 1}, "position"),
        ({"query_id": "q1", "doc_id": "d1", "position": 2, "clicked": 3}, "clicked"),
        ({"query_id": "q1", "doc_id": "d1", "position": 2}, "clicked"),
        ({"query_id": "q1", "doc_id": ["d1"], "position": 2, "clicked": 1}, "doc_id"),
    ):
        p.write_text(json.dumps(recs[0]) + "\n" + json.dumps(bad) + "\n")
        e = _err(read_click_log, p, QIDS, DIDS)
        assert (e.line, e.field) == (2, field)
    p.write_text(json.dumps(recs[0]) + "\n{not json\n")
    assert _err(read_click_log, p, QIDS, DIDS).line == 2


def test_missing_file_is_a_data_error(tmp_path):
    e = _err(read_click_log, tmp_path / "nope.tsv")
    assert "file not found" in str(e)


def test_write_read_roundtrip(tmp_path):
    clicks = [ClickRecord("q1", "d1", 1, True), ClickRecord("q2", "d3", 4, False)]
    rels = [RelevanceRecord("q1", "d1", 0.25), RelevanceRecord("q1", "d2", -1.5)]
    for ext in ("tsv", "jsonl"):
        write_click_log(tmp_path / f"c.{ext}", clicks)
        write_relevance_log(tmp_path / f"r.{ext}", rels)
        got = read_click_log(tmp_path / f"c.{ext}")
        assert [(r.query_id, r.doc_id, r.position, r.clicked) for r in got] == [
            (c.query_id, c.doc_id, c.position, c.clicked) for c in clicks
        ]
        assert [(r.doc_id, r.score) for r in read_relevance_log(tmp_path / f"r.{ext}")] == [("d1", 0.25), ("d2", -1.5)]


def test_click_one_hop_clicked_is_positive_unclicked_exposed_is_negative():
    recs = [
        ClickRecord("q1", "d1", 1, False),
        ClickRecord("q1", "d2", 2, True),
        ClickRecord("q1", "d3", 3, False),
        ClickRecord("q1", "d1", 2, True),  # clicked in another impression -> positive
        ClickRecord("q2", "d4", 1, False),  # never clicked -> no triplet
        ClickRecord("q3", "d4", 1, True),  # no exposed-not-clicked doc -> neg None
    ]
    agg = L.aggregate_clicks(recs)
    assert agg["q1"].positives == ["d1", "d2"] and agg["q1"].negatives == ["d3"]
    trip = L.click_one_hop(agg, seed=0)
    assert set(trip) == {"q1", "q3"}
    assert [(t.pos_id, t.neg_id, t.source) for t in trip["q1"]] == [
        ("d1", "d3", "click_one_hop"),
        ("d2", "d3", "click_one_hop"),
    ]
    assert trip["q3"][0].neg_id is None


def test_click_negative_is_random_but_seeded():
    recs = [ClickRecord("q", "pos", 1, True)] + [ClickRecord("q", f"n{i}", i + 2, False) for i in range(20)]
    agg = L.aggregate_clicks(recs)
    negs = {L.click_one_hop(agg, seed=s)["q"][0].neg_id for s in range(30)}
    assert len(negs) > 5 and negs <= {f"n{i}" for i in range(20)}
    assert L.click_one_hop(agg, seed=3) == L.click_one_hop(agg, seed=3)
    assert L.click_one_hop(L.aggregate_clicks(list(reversed(recs))), seed=3) == L.click_one_hop(
        agg, seed=3
    )  # order-free


def test_relevance_one_hop_top1_positive_and_negative_from_ranks_k_to_t():
    recs = [RelevanceRecord("q", f"d{i:02d}", 100.0 - i) for i in range(40)]  # d00 best
    ranked = L.rank_relevance(recs)
    seen = set()
    for seed in range(60):
        (t,) = L.relevance_one_hop(ranked, skip_top_k=5, top_t=12, seed=seed)["q"]
        assert t.pos_id == "d00" and t.source == "relevance_one_hop"
        seen.add(t.neg_id)
    assert seen == {f"d{i:02d}" for i in range(5, 12)}  # ranks 6..12 (1-based), never the top 5
    short = L.rank_relevance(recs[:5])
    assert L.relevance_one_hop(short, 5, 12)["q"][0].neg_id is None
    with pytest.raises(ValueError, match="need 1 <= skip_top_k < top_t, got K=5, T=5"):
        L.relevance_one_hop(ranked, skip_top_k=5, top_t=5)
