"""`scalingnote eval` and `scalingnote compare`."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from scalingnote.cli import main
from scalingnote.cli.evaluate import register
from scalingnote.data import write_qrels, write_run
from scalingnote.errors import DataError
from scalingnote.evaluation import compare_runs, evaluate

QRELS = {"q1": {"a": 1, "b": 2, "z": 0}, "q2": {"c": 1}, "q3": {"d": 1}, "q4": {"x": 0}}
RUN_A = {"q1": {"a": 3.0, "b": 2.0, "z": 1.0}, "q2": {"c": 1.0, "a": 2.0}, "q3": {"z": 2.0, "d": 0.5}}
RUN_B = {"q1": {"z": 3.0, "a": 1.0}, "q2": {"a": 2.0}, "q3": {"d": 5.0}}


@pytest.fixture()
def app():
    a = typer.Typer()
    register(a)
    return a


@pytest.fixture()
def files(tmp_path):
    write_qrels(tmp_path / "qrels.tsv", QRELS)
    write_run(tmp_path / "a.trec", RUN_A)
    write_run(tmp_path / "b.trec", RUN_B)
    return tmp_path


def test_eval_json_stdout_is_one_object(app, files):
    r = CliRunner().invoke(
        app,
        [
            "eval",
            "--run",
            str(files / "a.trec"),
            "--qrels",
            str(files / "qrels.tsv"),
            "--json",
            "-m",
            "ndcg@10,r@1,map,auc",
        ],
    )
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got == pytest.approx(evaluate(RUN_A, QRELS, ["ndcg@10", "r@1", "map", "auc"]))
    assert list(got) == ["ndcg@10", "r@1", "map", "auc"]


def test_eval_table_per_query_and_record(app, files):
    pq = files / "pq.tsv"
    rec = files / "out" / "metrics.json"
    args = [
        "eval",
        "--run",
        str(files / "a.trec"),
        "--qrels",
        str(files / "qrels.tsv"),
        "--per-query",
        str(pq),
        "--out",
        str(rec),
    ]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "ndcg@10" in r.stdout and "3 queries evaluated" in r.stdout and "1 without relevant" in r.stdout
    lines = pq.read_text().splitlines()
    assert lines[0] == "query-id\tndcg@10\trecall@100\tr@100\tmrr@10\tmap"
    assert {ln.split("\t")[0] for ln in lines[1:]} == {"q1", "q2", "q3"}
    record = json.loads(rec.read_text())
    assert record["metrics"] == pytest.approx(evaluate(RUN_A, QRELS))
    assert record["num_queries"] == 3 and record["num_no_relevant"] == 1
    assert "versions" in record and "machine" in record and record["config"]["missing"] == "ignore"


def test_eval_missing_as_zero(app, files):
    write_run(files / "partial.trec", {"q1": RUN_A["q1"]})
    base = ["eval", "--run", str(files / "partial.trec"), "--qrels", str(files / "qrels.tsv"), "--json", "-m", "r@10"]
    assert json.loads(CliRunner().invoke(app, base).stdout) == {"r@10": 1.0}
    assert json.loads(CliRunner().invoke(app, [*base, "--missing-as-zero"]).stdout) == pytest.approx({"r@10": 1 / 3})


def test_eval_bad_file_names_line(app, files):
    bad = files / "bad.trec"
    bad.write_text("q1 Q0 a 1 3.0 t\nq1 Q0 b 2 oops t\n")
    r = CliRunner().invoke(app, ["eval", "--run", str(bad), "--qrels", str(files / "qrels.tsv")])
    assert isinstance(r.exception, DataError)
    assert "line 2" in str(r.exception) and "score" in str(r.exception)


def test_compare_json(app, files):
    r = CliRunner().invoke(
        app,
        ["compare", "--run", str(files / "a.trec"), "--run-b", str(files / "b.trec"),
         "--qrels", str(files / "qrels.tsv"), "--metric", "mrr@10", "--n-resamples", "500", "--json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    ref = compare_runs(RUN_A, RUN_B, QRELS, "mrr@10", n_resamples=500).to_dict()
    assert got == pytest.approx(ref)
    r = CliRunner().invoke(
        app,
        [
            "compare",
            "--run",
            str(files / "a.trec"),
            "--run-b",
            str(files / "b.trec"),
            "--qrels",
            str(files / "qrels.tsv"),
        ],
    )
    assert r.exit_code == 0 and "paired t-test" in r.stdout


def test_main_entry_point_reports_errors(files, capsys):
    """Through the real `scalingnote` entry point: user errors exit 2 with one line, no traceback."""
    with pytest.raises(SystemExit) as ei:
        main(["eval", "--run", str(files / "a.trec"), "--qrels", str(files / "qrels.tsv"), "-m", "ndcg@x"])
    assert ei.value.code == 2
    assert "unknown metric" in capsys.readouterr().err
