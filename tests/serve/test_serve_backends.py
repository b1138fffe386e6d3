"""The service asks the back-end table for its searcher and reads what it can do from the
searcher's capability flags: a back end registered from user code (exact numpy search, no IVF,
no HNSW, no re-rank, no upsert) is served, answers like FAISS Flat, and refuses what it lacks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scalingnote.index import backends
from scalingnote.index.layout import check_query_tower, read_manifest
from scalingnote.index.searcher import SearchResult, VectorSearcher
from tests.serve.conftest import ready


class NumpySearcher(VectorSearcher):
    """Exact inner products over the full-precision vectors of an index directory (numpy only)."""

    def __init__(self, root: Path, query_tower=None):
        self.root = Path(root)
        self.manifest = {**read_manifest(root), "factory": "numpy:exact"}
        self.vectors = np.load(self.root / "vectors.npy")
        self.doc_ids = json.loads((self.root / "doc_ids.json").read_text(encoding="utf-8"))
        self.query_tower = query_tower

    @classmethod
    def open(cls, location, query_tower=None):
        if query_tower is not None:
            check_query_tower(read_manifest(location), query_tower, location)
        return cls(location, query_tower)

    def search(self, queries, k: int = 10) -> SearchResult:
        q = self.query_vectors(queries)
        scores = q @ self.vectors.T
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return SearchResult(
            np.take_along_axis(scores, top, 1).astype(np.float32),
            [[self.doc_ids[i] for i in row] for row in top],
            None,
            top,
        )


@pytest.fixture
def numpy_backend():
    with backends.BACKENDS.scoped():
        yield backends.register_backend("numpy", NumpySearcher.open, help="exact numpy search over an index directory")


@pytest.fixture(scope="module")
def flat_index(tmp_path_factory, tiny_bert_dir, serve_beir):
    from scalingnote.index import build_index
    from scalingnote.index.pipeline import encode_with_tower

    root = tmp_path_factory.mktemp("numpy-backend")
    encode_with_tower(tiny_bert_dir, serve_beir, root / "emb", shard_size=64, batch_size=16, progress=False)
    return build_index(root / "emb", root / "idx", "Flat", semantic_ids_layers=0, progress=False)


def test_a_registered_back_end_is_served_and_its_flags_drive_the_service(
    numpy_backend, flat_index, tiny_bert_dir, serve_beir
):
    from fastapi.testclient import TestClient

    from scalingnote.index import DenseIndex
    from scalingnote.index.pipeline import load_tower_for, read_search_queries
    from scalingnote.serve import ServeSettings, create_app

    texts = [q.text for q in read_search_queries(serve_beir, "test")]
    app = create_app(flat_index, tiny_bert_dir, ServeSettings(port=0, backend="numpy", admin_token="t" * 16))
    with TestClient(app, client=("127.0.0.1", 50000)) as c:  # a loopback peer (the admin rule)
        health = ready(c)
        assert health["index"]["factory"] == "numpy:exact" and health["index"]["path"] == str(flat_index)
        assert health["modes"] == ["dense"]  # no index directory declared (local_dir None): no bm25 / hybrid
        assert type(app.state.service.index) is NumpySearcher
        r = c.post("/search/batch", json={"queries": texts, "k": 5})
        assert r.status_code == 200, r.text
        served = r.json()["results"]
        # what the back end lacks is refused with a clear message, before any search
        for option, value, why in (
            ("nprobe", 2, "has no IVF layer"),
            ("ef_search", 16, "has no HNSW graph"),
            ("rerank", 10, "does not re-rank"),
        ):
            r = c.post("/search", json={"query": texts[0], "k": 5, option: value})
            assert (
                r.status_code == 422
                and r.json()["detail"].startswith(f"{option}: index 'numpy:exact'")
                and why in r.json()["detail"]
            ), r.text
        r = c.post(
            "/documents",
            json={"documents": [{"_id": "new", "title": "t", "text": "fox"}]},
            headers={"Authorization": "Bearer " + "t" * 16},
        )
        assert r.status_code == 409 and r.json()["error"] == "not_live" and "'numpy'" in r.json()["detail"]
        r = c.delete("/documents/d0", headers={"Authorization": "Bearer " + "t" * 16})
        assert r.status_code == 409 and "cannot delete" in r.json()["detail"]

    # FAISS Flat's score of every document: the served hits are its top 5 (the same scores, each
    # hit with its own FAISS score; the tiny random tower makes near-ties, which may swap)
    ref = DenseIndex.open(flat_index, query_tower=load_tower_for(tiny_bert_dir, "query")).search(texts, 48)
    for hits, ids, scores in zip(served, ref.doc_ids, ref.scores, strict=True):
        np.testing.assert_allclose([h["score"] for h in hits], scores[:5], rtol=0, atol=1e-5)
        by_id = dict(zip(ids, scores, strict=True))
        np.testing.assert_allclose([by_id[h["doc_id"]] for h in hits], [h["score"] for h in hits], rtol=0, atol=1e-5)
        assert all(h["title"] for h in hits)  # titles from the corpus the index records


def test_the_faiss_back_end_serves_its_live_form(flat_index, tiny_bert_dir, tmp_path):
    """faiss's entry names a live opener: with ``live`` on the service serves a LiveIndex (upsert /
    delete), with it off the read-only DenseIndex, whose flags refuse POST /documents."""
    import shutil

    from fastapi.testclient import TestClient

    from scalingnote.live import LiveIndex
    from scalingnote.serve import ServeSettings, create_app

    idx = shutil.copytree(flat_index, tmp_path / "idx")
    for live, kind in ((True, LiveIndex), (False, backends.DenseIndex)):
        app = create_app(idx, tiny_bert_dir, ServeSettings(port=0, live=live, admin_token="t" * 16))
        with TestClient(app, client=("127.0.0.1", 50000)) as c:  # a loopback peer (the admin rule)
            ready(c)
            index = app.state.service.index
            assert type(index) is kind and index.supports_upsert is live and index.supports_delete is live
            r = c.delete("/documents/d0", headers={"Authorization": "Bearer " + "t" * 16})
            assert r.status_code == (200 if live else 409), r.text
        if live:
            index.close()


def test_a_back_end_located_by_uri_is_served_from_the_collection_given(flat_index, tiny_bert_dir, serve_beir):
    """``serve --collection other``: the back end's manifest reader and opener get that collection
    (and the token), at start, and a collection it does not have is refused with its own message."""
    from fastapi.testclient import TestClient

    from scalingnote.errors import ScalingNoteError
    from scalingnote.serve import ServeSettings, create_app
    from scalingnote.serve.server import serve

    seen: list[tuple[str, str, str | None]] = []

    def manifest(location, *, collection, token=None):
        seen.append(("manifest", collection, token))
        if collection != "other":
            raise ScalingNoteError(f"{location}: no collection {collection!r}")
        return read_manifest(flat_index)

    def open_(location, query_tower=None, *, collection, token=None):
        seen.append(("open", collection, token))
        return NumpySearcher.open(flat_index, query_tower)

    with backends.BACKENDS.scoped():
        backends.register_backend("numpy_uri", open_, location="uri", manifest=manifest)
        settings = ServeSettings(
            port=0,
            backend="numpy_uri",
            uri="mem://store",
            collection="other",
            backend_token="s3cret",
            admin_token="t" * 16,
        )
        app = create_app("mem://store", tiny_bert_dir, settings)
        with TestClient(app, client=("127.0.0.1", 50000)) as c:
            assert ready(c)["index"]["factory"] == "numpy:exact"
            r = c.post("/search", json={"query": "fox", "k": 3})
            assert r.status_code == 200 and len(r.json()["results"]) == 3, r.text
        assert ("manifest", "other", "s3cret") in seen and ("open", "other", "s3cret") in seen
        # the CLI's server checks the same collection before it binds: a missing one is refused there
        missing = ServeSettings(
            port=0, backend="numpy_uri", uri="mem://store", collection="absent", admin_token="t" * 16
        )
        with pytest.raises(ScalingNoteError, match="mem://store: no collection 'absent'"):
            serve("mem://store", tiny_bert_dir, missing)
