"""``serve --query-backend onnx``: ONNX Runtime encodes the queries, the answers equal
the torch backend's; an export of another tower is refused; settings are validated."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from scalingnote.errors import ConfigError
from scalingnote.serve import BackgroundServer, ServeSettings, create_app


@pytest.fixture(scope="module")
def onnx_export(tiny_bert_dir, tmp_path_factory):
    from scalingnote.models import load_tower
    from scalingnote.models.export import export_onnx

    tower = load_tower(tiny_bert_dir, role="query", device="cpu", dtype="float32")
    return export_onnx(tower, tmp_path_factory.mktemp("onnx") / "q")


def test_onnx_query_tower_matches_torch(tiny_bert_dir, onnx_export):
    from scalingnote.models import load_tower
    from scalingnote.serve.query_backend import OnnxQueryTower

    tower = load_tower(tiny_bert_dir, role="query", device="cpu", dtype="float32")
    enc = OnnxQueryTower(tower, onnx_export, threads=1)
    texts = ["quick brown fox", "vitamin deficiency risk", "dense retrieval", "糖尿病 水果", "x " * 300]
    ref = tower.encode_queries(texts, show_progress=False)
    assert np.abs(enc.encode_queries(texts, batch_size=2) - ref).max() < 1e-4
    # Matryoshka prefix, re-normalised, as the torch tower does
    assert (
        np.abs(enc.encode_queries(texts, dim=8) - tower.encode_queries(texts, dim=8, show_progress=False)).max() < 1e-4
    )
    assert enc.fingerprint == tower.fingerprint and enc.compat_id == tower.compat_id and enc.out_dim == tower.out_dim


def test_export_of_another_tower_is_refused(other_bert_dir, onnx_export):
    from scalingnote.models import load_tower
    from scalingnote.serve.query_backend import OnnxQueryTower

    other = load_tower(other_bert_dir, role="query", device="cpu", dtype="float32")
    with pytest.raises(ConfigError, match="another tower"):
        OnnxQueryTower(other, onnx_export)


def test_settings_validate_the_query_backend():
    with pytest.raises(ConfigError, match="query_backend"):
        ServeSettings(query_backend="tensorrt")
    with pytest.raises(ConfigError, match="onnx_threads"):
        ServeSettings(query_backend="onnx", onnx_threads=0)
    with pytest.raises(ConfigError, match="onnx_model"):
        ServeSettings(onnx_model="/x")


def test_service_with_onnx_backend_answers_like_torch(serve_index, tiny_bert_dir, onnx_export):
    results = {}
    for backend, extra in (("torch", {}), ("onnx", {"onnx_model": str(onnx_export), "onnx_threads": 1})):
        app = create_app(
            serve_index, tiny_bert_dir, ServeSettings(port=0, max_wait_ms=20, query_backend=backend, **extra)
        )
        with BackgroundServer(app) as srv:
            srv.wait_ready()
            with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
                h = c.get("/healthz").json()
                assert h["status"] == "ok"
                texts = ["quick brown fox", "vitamin deficiency risk", "product quantization codes"]
                r = c.post("/search/batch", json={"queries": texts, "k": 5})
                assert r.status_code == 200, r.text
                results[backend] = r.json()["results"]
    for a, b in zip(results["torch"], results["onnx"], strict=True):
        assert [h["doc_id"] for h in a][:3] == [h["doc_id"] for h in b][:3]
        assert np.allclose([h["score"] for h in a], [h["score"] for h in b], atol=1e-3)
