"""The model card of an exported tower: its run's data and choices, nDCG@10, the retention of the
teacher and the speed-up, computed from the run's results table (the export itself on a tiny
quick start: tests/test_api.py)."""

from __future__ import annotations

import json
from pathlib import Path

from scalingnote.models.model_card import evaluation, find_run, model_card

IDENTITY = {
    "fingerprint": "f" * 32,
    "compat_id": "c" * 32,
    "kind": "bert",
    "role": "query",
    "pooling": "mean",
    "base_model": "/models/tiny-bert",
    "num_layers": 1,
    "out_dim": 32,
    "matryoshka_dims": [16, 32],
    "max_length": 16,
}


def _run(tmp_path: Path, teacher_row: bool = True) -> Path:
    out = tmp_path / "run"
    tower = out / "qkd" / "bert1_from_bert_rw1" / "query_tower"
    tower.mkdir(parents=True)
    rows = [
        {"method": "bm25", "ndcg@10": 0.6, "chosen": ""},
        {"method": "scalingnote", "ndcg@10": 0.54, "r@100": 0.9, "query_qps": 900.0, "chosen": "student"},
        {"method": "served", "ndcg@10": 0.7, "chosen": "served"},
    ]
    if teacher_row:
        rows.append({"method": "scaling_dual", "ndcg@10": 0.6, "query_qps": 300.0, "chosen": "teacher+depth"})
    cand = {
        "name": "bert1_from_bert_rw1",
        "layers": 1,
        "rank_weight": 1.0,
        "val": 0.5,
        "p99_ms": 3.2,
        "dir": str(tower),
    }
    choices = {
        "student": {"candidates": [cand], "chosen": cand["name"], "reason": "best validation nDCG@10"},
        "teacher": {"family": "bert", "dir": str(out / "stage1" / "bert_large"), "reason": "best on validation"},
        "families": {"bert": {"model": "/models/tiny-bert"}},
        "served": {"choice": "hybrid", "reason": "cross-fitted"},
    }
    (out / "results.json").write_text(
        json.dumps(
            {
                "rows": rows,
                "choices": choices,
                "config": {"data": None},
                "created": "2026-01-01T00:00:00",
                "machine": "2-core CPU",
            }
        )
    )
    return tower


def test_card_carries_the_runs_figures(tmp_path):
    tower = _run(tmp_path)
    run = find_run(tower)
    assert run is not None and run["role"] == "student"
    ev = evaluation(run)
    assert ev["ndcg@10"] == 0.54 and ev["teacher_ndcg@10"] == 0.6 and ev["served_ndcg@10"] == 0.7
    assert abs(ev["retention"] - 0.9) < 1e-12 and abs(ev["speedup"] - 3.0) < 1e-12
    card = model_card(IDENTITY, "sentence-transformers", tmp_path / "export", tower, {"torch": "2.x"})
    assert card.startswith("---\nlibrary_name: sentence-transformers\nbase_model: tiny-bert\n")
    for needle in (
        "# bert1_from_bert_rw1: scalingnote query tower",
        "| nDCG@10 | 0.5400 |",
        "| teacher nDCG@10 | 0.6000 |",
        "| retention of the teacher | 90.0% |",
        "| speed-up over the teacher | 3.00x |",
        "synthetic note-search log",
        "Teacher (large dual tower, Stage I): the bert family (`tiny-bert`)",
        "Served default: hybrid",
        'SentenceTransformer("export")',
        "model.encode_query",
        "- torch: 2.x",
    ):
        assert needle in card, needle
    assert "/models/" not in card  # a base model's local path is named, not printed


def test_card_says_what_was_not_measured_and_runs_it_cannot_find(tmp_path):
    tower = _run(tmp_path, teacher_row=False)
    card = model_card(IDENTITY, "onnx", tmp_path / "export", tower)
    assert (
        "| retention of the teacher | not measured |" in card and "| speed-up over the teacher | not measured |" in card
    )
    assert "library_name: onnx" in card and 'ort.InferenceSession("export/model.onnx")' in card
    alone = tmp_path / "elsewhere" / "query_tower"
    alone.mkdir(parents=True)
    assert find_run(alone) is None
    card = model_card(IDENTITY, "onnx", tmp_path / "export", alone)
    assert "Not exported from a quick start's output" in card and "No test-set figures" in card
