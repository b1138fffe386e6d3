"""The Python API (``scalingnote.load`` / ``scalingnote.quickstart``) on a tiny quick start's own
output: the same answers as the service (nDCG@10 of the served row), the docstrings' examples
run, the live index changed through the write-ahead log, and clear errors for bad input."""

from __future__ import annotations

import doctest
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scalingnote
from scalingnote.config import load_config
from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.evaluation import evaluate
from scalingnote.quickstart import QuickstartConfig
from scalingnote.quickstart import runs as qs_runs
from scalingnote.quickstart.scoring import load_eval_set


def _eval_set(out: Path):
    """The run's own test queries and qrels (those its results table is scored on)."""
    res = json.loads((out / "results.json").read_text(encoding="utf-8"))
    cfg = load_config(QuickstartConfig, out / "quickstart.yaml")
    data = qs_runs.prepare_data(cfg, out)  # a finished step: read back
    return load_eval_set(
        Path(data["beir"]), cfg.eval_split, Path(res["choices"]["teacher"]["dir"]), cfg.max_eval_queries
    ), res["rows"]


def test_search_answers_the_served_row_and_dense_the_compressed_index_row(tiny_quickstart):
    out, _, _ = tiny_quickstart
    ev, rows = _eval_set(out)
    served = next(r for r in rows if r.get("chosen") == "served")
    ivf = next(r for r in rows if r["method"] == "scalingnote+ivfpq")  # the student alone over the same index
    with scalingnote.load(out) as r:
        assert r.default_mode == json.loads((out / "index" / "ivfpq" / "fusion.json").read_text())["default_mode"]
        scores = {}
        for mode in (None, "dense"):
            hits = r.search(ev.texts, k=100, mode=mode)
            assert len(hits) == len(ev.qids) and all(len(h) == min(100, len(r)) for h in hits)
            run = {q: {h.id: h.score for h in hs} for q, hs in zip(ev.qids, hits, strict=True)}
            scores[mode] = evaluate(run, ev.qrels, ["ndcg@10"])["ndcg@10"]
    assert scores[None] == pytest.approx(served["ndcg@10"], abs=1e-4)
    assert scores["dense"] == pytest.approx(ivf["ndcg@10"], abs=1e-4)


def test_docstring_examples_run(tiny_quickstart, tmp_path):
    """Every example in the API's docstrings, on a copy of the run (moved runs load too; adding
    and deleting documents leaves the original untouched)."""
    out, options, _ = tiny_quickstart
    copy = tmp_path / "moved_run"
    shutil.copytree(out, copy)
    import scalingnote.api as api
    import scalingnote.quickstart.results as results

    failed = tried = 0
    for mod, run_dir in (
        (api, copy),
        (results, out),
    ):  # the quick start resumes in place (same options: every step reused)
        globs = {"scalingnote": scalingnote, "np": np, "run_dir": str(run_dir), "tiny": options}
        for test in doctest.DocTestFinder().find(mod, globs=globs):
            res = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test)
            failed, tried = failed + res.failed, tried + res.attempted
    assert failed == 0 and tried >= 20, (failed, tried)


def test_add_and_delete_go_through_the_write_ahead_log(tiny_quickstart, tmp_path):
    out, _, _ = tiny_quickstart
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    doc = {"_id": "api-new", "title": "quorvantine", "text": "the quorvantine note about a canal trip"}
    with scalingnote.load(copy) as r:
        n = len(r)
        assert r.add([doc])["documents"] == [{"index": 0, "_id": "api-new", "status": "added"}]
        assert r.add([doc])["documents"][0]["status"] == "replaced" and len(r) == n + 1
        vec = r.encode_documents([f"{doc['title']} {doc['text']}"])
        assert vec.shape == (1, r.encode_queries(["x"]).shape[1])
    with scalingnote.load(copy) as r:  # replayed from the log after a restart
        assert len(r) == n + 1 and r.search(["quorvantine"], k=1, mode="bm25")[0][0].id == "api-new"
        assert r.delete(["api-new", "never-there"]) == {"seq": 3, "deleted": 1, "missing": ["never-there"]}
    with scalingnote.load(copy) as r:
        assert len(r) == n and all(h.id != "api-new" for h in r.search(["quorvantine"], k=5, mode="bm25")[0])


def test_bad_input_is_a_clear_error_and_changes_nothing(tiny_quickstart, tmp_path):
    out, _, _ = tiny_quickstart
    with pytest.raises(ScalingNoteError, match="results.json: not found"):
        scalingnote.load(tmp_path)
    with pytest.raises(ScalingNoteError, match="no such directory"):
        scalingnote.load(tmp_path / "nowhere")
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    with scalingnote.load(copy) as r:
        n = len(r)
        with pytest.raises(ScalingNoteError, match="one string"):
            r.search("a query")
        with pytest.raises(ScalingNoteError, match=r"queries\[1\]: empty query"):
            r.search(["fine", "  "])
        with pytest.raises(ScalingNoteError, match="k: must be"):
            r.search(["fine"], k=0)
        with pytest.raises(ScalingNoteError, match="mode: 'sparse' is not available: unknown mode"):
            r.search(["fine"], mode="sparse")
        with pytest.raises(DataError, match=r"document 1 \(_id 'b'\), field 'title'"):
            r.add([{"_id": "a", "text": "fine"}, {"_id": "b", "title": 3, "text": "x"}])
        with pytest.raises(DataError, match=r"ids\[0\]"):
            r.delete([""])
        assert len(r) == n and "a" not in {h.id for h in r.search(["fine"], k=n, mode="bm25")[0]}


def test_import_is_cheap_and_quickstart_is_callable_after_its_package_is_imported():
    code = (
        "import sys, scalingnote; heavy = [m for m in ('torch', 'numpy', 'scalingnote.api') if m in sys.modules]; "
        "import scalingnote.quickstart.runs as runs; import inspect; "
        "print(heavy, callable(scalingnote.quickstart), "
        "list(inspect.signature(scalingnote.quickstart).parameters), scalingnote.load.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[] True ['data', 'out', 'budget_minutes', 'options'] scalingnote.api", out


@pytest.mark.parametrize("fmt", ["sentence-transformers", "onnx"])
def test_an_exported_student_carries_its_model_card(tiny_quickstart, tmp_path, fmt):
    from scalingnote.models.export import export_tower

    out, _, _ = tiny_quickstart
    result = scalingnote.quickstart.read_results(out)
    student = next(r for r in result.rows if r.get("chosen") == "student")
    export = export_tower(result.query_tower, tmp_path / "exported", fmt)
    card = (export / "README.md").read_text(encoding="utf-8")
    assert (
        f"| nDCG@10 | {student['ndcg@10']:.4f} |" in card
        and f"| served configuration nDCG@10 | {result.served['ndcg@10']:.4f} |" in card
    )
    assert f"# {result.choices['student']['chosen']}: scalingnote query tower ({fmt})" in card
    assert (
        "base_model: bert\n" in card
        and "synthetic note-search log" in card
        and "Teacher (large dual tower, Stage I): the bert family" in card
    )
    assert (
        'SentenceTransformer("exported")'
        if fmt == "sentence-transformers"
        else 'InferenceSession("exported/model.onnx")'
    ) in card
    # the retention is the run's own student / teacher nDCG@10, or "not measured" without a teacher row (never invented)
    teacher = next((r for r in result.rows if "teacher" in str(r.get("chosen") or "").split("+")), None)
    expected = "not measured" if teacher is None else format(student["ndcg@10"] / teacher["ndcg@10"], ".1%")
    assert f"| retention of the teacher | {expected} |" in card
