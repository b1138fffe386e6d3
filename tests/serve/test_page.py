"""The search page and the ``mode`` field over HTTP (real uvicorn server, tiny tower, BM25 beside
the index): the page is served from package files, search answers in every mode with titles and
snippets, and unknown modes are refused."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.serve.conftest import HOSTILE_TITLE


@pytest.fixture()
def client(page_server):
    with httpx.Client(base_url=page_server.url, trust_env=False, timeout=30) as c:
        yield c


def test_page_and_assets_come_from_package_files(client):
    from importlib import resources

    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    static = resources.files("scalingnote.serve").joinpath("static")
    assert r.text == static.joinpath("index.html").read_text(encoding="utf-8")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp  # no inline or third-party script
    assert "http://" not in r.text and "https://" not in r.text  # no CDN: works offline
    js = client.get("/static/app.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in js.text  # document text is only ever set with textContent
    assert "textContent" in js.text
    assert client.get("/static/style.css").headers["content-type"].startswith("text/css")
    assert client.get("/static/../app.py").status_code == 404
    assert client.get("/static/nope.js").json()["error"] == "not_found"


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_search_modes_return_titles_snippets_and_semantic_ids(client, page_beir, mode):
    corpus = {
        json.loads(line)["_id"]: json.loads(line) for line in (page_beir / "corpus.jsonl").read_text().splitlines()
    }
    r = client.post("/search", json={"query": "quick brown fox", "k": 5, "mode": mode})
    assert r.status_code == 200, r.text
    hits = r.json()["results"]
    assert len(hits) == 5
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True)
    for h in hits:
        assert h["title"] == corpus[h["doc_id"]]["title"]
        assert h["snippet"] == " ".join(corpus[h["doc_id"]]["text"].split())
        assert isinstance(h["semantic_id"], list) and len(h["semantic_id"]) == 2
    if mode == "bm25":
        assert HOSTILE_TITLE in [h["title"] for h in hits]  # the hostile document is returned verbatim


def test_hybrid_equals_offline_fusion(client, page_server, page_index, tiny_bert_dir, page_beir):
    from scalingnote.index.hybrid import open_hybrid

    h = open_hybrid(page_index, tiny_bert_dir, progress=False)
    ref = h.search(["quick brown fox"], 5, mode="hybrid")
    hits = client.post("/search", json={"query": "quick brown fox", "k": 5, "mode": "hybrid"}).json()["results"]
    assert [x["doc_id"] for x in hits] == ref.doc_ids[0]
    assert [x["score"] for x in hits] == pytest.approx(ref.scores[0].tolist(), abs=1e-6)


def test_mode_is_validated_and_reported(client):
    r = client.post("/search", json={"query": "fox", "mode": "sparse"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "mode"
    assert client.get("/healthz").json()["modes"] == ["dense", "bm25", "hybrid"]
    r = client.post("/search/batch", json={"queries": ["fox", "vitamin"], "k": 3, "mode": "bm25"})
    assert r.status_code == 200 and [len(x) for x in r.json()["results"]] == [3, 3]


def test_without_bm25_the_modes_are_refused(serve_index, tiny_bert_dir):
    """An index with no BM25 beside it and no corpus given: bm25 / hybrid answer 422, dense works."""
    import shutil
    import tempfile
    from pathlib import Path

    from scalingnote.serve import BackgroundServer, ServeSettings, create_app

    with tempfile.TemporaryDirectory() as d:
        idx = Path(d) / "idx"
        shutil.copytree(serve_index, idx)
        man = json.loads((idx / "manifest.json").read_text())
        man["embeddings_dir"] = None  # no corpus to build BM25 from (titles stay: docs.jsonl)
        man["documents"] = {**(man.get("documents") or {}), "source": None}
        (idx / "manifest.json").write_text(json.dumps(man))
        shutil.rmtree(idx / "bm25", ignore_errors=True)
        app = create_app(idx, tiny_bert_dir, ServeSettings(port=0))
        with BackgroundServer(app) as srv:
            srv.wait_ready()
            with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
                assert c.post("/search", json={"query": "fox", "mode": "dense"}).status_code == 200
                r = c.post("/search", json={"query": "fox", "mode": "hybrid"})
                assert r.status_code == 422 and "no BM25 index" in r.json()["detail"]
                assert c.get("/healthz").json()["modes"] == ["dense"]


def test_mixed_modes_in_one_micro_batch_answer_like_single_requests(page_server):
    """Concurrent requests of different modes share micro-batches (only dense/hybrid texts are
    encoded) and each gets the answer it gets alone (hybrid: up to near-ties of the tiny random
    tower's dense scores, which float rounding may swap)."""
    import asyncio

    bodies = [
        {"query": q, "k": 4, "mode": m}
        for q in ("quick brown fox", "vitamin risk")
        for m in ("dense", "bm25", "hybrid")
    ]

    async def post_all():
        async with httpx.AsyncClient(base_url=page_server.url, trust_env=False, timeout=30) as c:
            return await asyncio.gather(*(c.post("/search", json=b) for b in bodies))

    together = asyncio.run(post_all())
    with httpx.Client(base_url=page_server.url, trust_env=False, timeout=30) as c:
        for b, r in zip(bodies, together, strict=True):
            assert r.status_code == 200, r.text
            alone = c.post("/search", json=b).json()["results"]
            got = r.json()["results"]
            assert len(got) == len(alone) == 4
            if b["mode"] == "bm25":  # no encoder involved: identical
                assert got == alone
            elif b["mode"] == "dense":  # batched vs single encoding: same scores up to float rounding
                assert [h["score"] for h in got] == pytest.approx([h["score"] for h in alone], abs=1e-5)


def test_fusion_json_beside_the_index_sets_the_default_mode_and_weights(page_index, tiny_bert_dir, page_beir, tmp_path):
    """The quick start records its served default (chosen on validation) in fusion.json; a request
    without ``mode`` then gets that weighted hybrid, equal to offline fusion with the same settings."""
    import shutil

    from scalingnote.index.hybrid import FusionConfig, open_hybrid
    from scalingnote.serve import BackgroundServer, ServeSettings, create_app

    idx = tmp_path / "idx"
    shutil.copytree(page_index, idx)
    (idx / "fusion.json").write_text(
        json.dumps({"method": "weighted", "weight": 0.3, "norm": "zscore", "default_mode": "hybrid"})
    )
    h = open_hybrid(idx, tiny_bert_dir, progress=False)
    h.fusion = FusionConfig(method="weighted", weight=0.3, norm="zscore")
    ref = h.search(["quick brown fox"], 5, mode="hybrid")
    app = create_app(idx, tiny_bert_dir, ServeSettings(port=0, corpus=str(page_beir)))
    with BackgroundServer(app) as srv:
        srv.wait_ready()
        with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
            hits = c.post("/search", json={"query": "quick brown fox", "k": 5}).json()["results"]
            assert [x["doc_id"] for x in hits] == ref.doc_ids[0]
            assert [x["score"] for x in hits] == pytest.approx(ref.scores[0].tolist(), abs=1e-6)  # fused, not cosine
            dense = c.post("/search", json={"query": "quick brown fox", "k": 5, "mode": "dense"}).json()["results"]
            assert [x["score"] for x in dense] != pytest.approx([x["score"] for x in hits], abs=1e-3)


def test_a_bad_fusion_json_is_refused_naming_its_field(tmp_path):
    from scalingnote.errors import ConfigError
    from scalingnote.index.hybrid import load_fusion

    (tmp_path / "fusion.json").write_text(json.dumps({"default_mode": "sparse"}))
    with pytest.raises(ConfigError, match="default_mode"):
        load_fusion(tmp_path)
    (tmp_path / "fusion.json").write_text(json.dumps({"method": "weighted", "weight": 3}))
    with pytest.raises(ConfigError, match="weight"):
        load_fusion(tmp_path)
    assert load_fusion(tmp_path / "none")[1] == "dense"
