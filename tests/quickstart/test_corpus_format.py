"""``quickstart --data`` over a corpus in a user's own format: a CSV reader named by a dotted path
(``corpus_format``), registered for the directory's ``corpus.testcsv`` (a suffix of the test's own,
so that a user's registered ".csv" format never collides with it) and read by every stage."""

from __future__ import annotations

import csv
import json

from scalingnote.data import load_corpus
from scalingnote.data.corpus import FORMATS
from scalingnote.quickstart import quickstart
from tests.helpers.tiny_data import write_tiny_beir
from tests.quickstart.test_quickstart import _cfg

READER = """
import csv

from scalingnote.data import Document

READ = []


def read_csv(path):
    READ.append(str(path))
    with open(path, newline="", encoding="utf-8") as fh:
        for rec in csv.DictReader(fh):
            yield Document(rec["id"], rec["title"], "", rec["text"])
"""


def test_a_csv_corpus_runs_through_the_quick_start_by_a_dotted_reader(tiny_models, tmp_path, monkeypatch):
    (tmp_path / "h4_csv_reader.py").write_text(READER, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    beir = write_tiny_beir(tmp_path / "beir", docs_per_topic=6)
    docs = load_corpus(beir / "corpus.jsonl")
    with open(beir / "corpus.testcsv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "title", "text"])
        w.writerows([d.id, d.title, d.content] for d in docs.values())
    (beir / "corpus.jsonl").unlink()
    out = tmp_path / "qs"
    small = {
        "qkd_max_pseudo_queries": 30,
        "semantic_id_layers": 1,
        "compare": False,
        "teacher": "bert",
        "families": ["bert"],
    }
    with FORMATS.scoped():
        rows = quickstart(_cfg(tiny_models, out, data=str(beir), corpus_format="h4_csv_reader:read_csv", **small))
        import h4_csv_reader

        assert "h4_csv_reader.read_csv" in FORMATS
    # the CSV was read, by more than one stage (BM25, Stage I, the index's documents, ICT ...)
    assert (
        h4_csv_reader.READ
        and set(h4_csv_reader.READ) == {str(beir / "corpus.testcsv")}
        and len(h4_csv_reader.READ) >= 3
    )
    assert next(r for r in rows if r["method"] == "bm25")["ndcg@10"] > 0
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["corpus_format"] == "h4_csv_reader:read_csv"
    ids = json.loads((out / "stage1" / "bert_zero_shot_Lall" / "doc_ids.json").read_text())
    assert sorted(ids) == sorted(docs)  # every document of the CSV was encoded


def test_check_inputs_detects_the_corpus_file_and_refuses_two(tmp_path):
    import pytest

    from scalingnote.errors import ScalingNoteError
    from scalingnote.quickstart.pipeline import check_inputs
    from tests.data.test_corpus import _write_parquet

    beir = write_tiny_beir(tmp_path / "beir", docs_per_topic=2)
    assert check_inputs(tmp_path / "out", beir) == beir / "corpus.jsonl"
    assert check_inputs(tmp_path / "out", beir, corpus_format="jsonl") == beir / "corpus.jsonl"
    _write_parquet(beir / "corpus.parquet", list(load_corpus(beir / "corpus.jsonl").values()))
    with pytest.raises(
        ScalingNoteError,
        match=r"not a BEIR directory: several corpus files in this directory \(corpus\.jsonl \(jsonl\), "
        r"corpus\.parquet \(parquet\)\): keep one",
    ):
        check_inputs(tmp_path / "out", beir)
    (beir / "corpus.jsonl").unlink()  # a shipped format other than JSONL: detected, not assumed
    assert check_inputs(tmp_path / "out", beir) == beir / "corpus.parquet"
    assert not (tmp_path / "out").exists()
