"""The quick-start pipeline end to end on tiny random models (the real run uses SmolLM2 + MiniLM)."""

from __future__ import annotations

import json

import pytest

from scalingnote.errors import ConfigError
from scalingnote.models import build_tiny_model
from scalingnote.quickstart import QuickstartConfig, default_factory, quickstart


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("qs_models")
    return str(build_tiny_model(root / "llm", "llm", num_layers=2)), str(build_tiny_model(root / "bert", "bert", num_layers=2))


def _cfg(tiny_models, out, **over):
    llm, bert = tiny_models
    base = dict(
        out=str(out), llm=llm, bert=bert, llm_layers=2, student_layers=1, dim=32, synth_docs=120, synth_queries=60,
        steps=3, batch_size=4, qkd_epochs=1.0, qkd_batch_size=16, qkd_max_pseudo_queries=60, semantic_id_layers=2,
        query_max_length=16, doc_max_length=64, show_progress=False, evaluate_start=True,
    )
    base.update(over)
    return QuickstartConfig(**base)


def test_quickstart_runs_end_to_end_and_resumes(tiny_models, tmp_path, capsys):
    out = tmp_path / "qs"
    rows = quickstart(_cfg(tiny_models, out))
    methods = [r["method"] for r in rows]
    assert methods[0] == "bm25" and methods[-4:] == ["scalingnote", "scalingnote+bm25", "scalingnote+bm25_weighted", "scalingnote+ivfpq"]
    hybrid = rows[methods.index("scalingnote+bm25")]
    assert hybrid["search"].startswith("exact + bm25s, rrf") and hybrid["query_qps"] is None
    weighted = rows[methods.index("scalingnote+bm25_weighted")]
    assert "held-out queries" in weighted["search"] and 0.0 <= weighted["ndcg@10"] <= 1.0
    assert {"twinbert", "scaling_doc", "scaling_dual"} <= set(methods)
    for r in rows:
        assert 0.0 <= r["ndcg@10"] <= 1.0 and 0.0 <= r["r@100"] <= 1.0, r
    assert all(0.0 <= r["start_ndcg@10"] <= 1.0 for r in rows if r["method"] in ("twinbert", "scaling_doc", "scaling_dual"))
    printed = capsys.readouterr().out
    assert "scalingnote serve --index" in printed and str(out / "qkd" / "query_tower") in printed
    res = json.loads((out / "results.json").read_text())
    assert res["rows"] == json.loads(json.dumps(rows)) and "torch" in res["versions"]
    assert (out / "quickstart.yaml").exists()
    # the index stores the corpus titles, and search returns them
    from scalingnote.index import DenseIndex

    idx = DenseIndex.open(out / "index" / "ivfpq")
    assert idx.titles is not None and len(idx.titles) == len(idx.doc_ids) and sum(bool(t) for t in idx.titles) > 0
    # every step recorded completion; a re-run resumes instead of retraining
    steps = [out / "data", out / "stage1" / "scaling_dual", out / "stage1" / "scaling_doc", out / "stage1" / "twinbert", out / "qkd", out / "index"]
    assert all((s / "DONE").exists() for s in steps)
    stamps = {s: (s / "DONE").stat().st_mtime_ns for s in steps}
    quickstart(_cfg(tiny_models, out))
    assert {s: (s / "DONE").stat().st_mtime_ns for s in steps} == stamps
    # the SmolLM2 towers used the configured (mean) pooling
    tower = json.loads((out / "stage1" / "scaling_dual" / "query_tower" / "tower.json").read_text())
    assert tower["config"]["pooling"] == "mean"


def test_quickstart_rejects_a_bad_pooling(tiny_models, tmp_path):
    with pytest.raises(ConfigError, match="llm_pooling"):
        quickstart(_cfg(tiny_models, tmp_path / "bad", llm_pooling="avg"))


def test_default_factory_uses_4_bit_codes_below_10k_vectors():
    assert default_factory(1500, 128) == "IVF154,PQ16x4"
    assert default_factory(32176, 128) == "IVF717,PQ16x8"
