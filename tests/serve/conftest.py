"""Fixtures for the service tests: the tiny BERT (``tiny_bert_dir``, tests/conftest.py) used
zero-shot on both sides, a tiny BEIR corpus, an IVF-PQ index with semantic IDs built from it,
and a running service."""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest

from tests.helpers.tiny_data import write_tiny_beir


@pytest.fixture(scope="session")
def serve_beir(tmp_path_factory):
    return write_tiny_beir(tmp_path_factory.mktemp("serve-beir") / "toy", docs_per_topic=8)


@pytest.fixture(scope="session")
def serve_index(tmp_path_factory, tiny_bert_dir, serve_beir):
    """IVF4,PQ8x4 over the 48 tiny documents, 2 semantic-ID layers; the embeddings record the
    corpus path, so the service finds the titles without --corpus."""
    from scalingnote.index import build_index
    from scalingnote.index.pipeline import encode_with_tower

    root = tmp_path_factory.mktemp("serve-index")
    encode_with_tower(tiny_bert_dir, serve_beir, root / "emb", shard_size=32, batch_size=16, progress=False)
    return build_index(
        root / "emb", root / "idx", "IVF4,PQ8x4", semantic_ids_layers=2, codebook_size=4, seed=0, progress=False
    )


# ------------------------------------------------------------------ search page / hybrid

HOSTILE_TITLE = "<script>window.__pwned = 1</script>fox quick brown"
HOSTILE_SNIPPET = 'quick brown fox <img src=x onerror="window.__pwned = 2"> jumps'


@pytest.fixture(scope="session")
def page_beir(tmp_path_factory):
    """The tiny corpus plus two documents whose title / text carry markup (untrusted text)."""
    import json

    root = write_tiny_beir(tmp_path_factory.mktemp("page-beir") / "toy", docs_per_topic=6)
    with open(root / "corpus.jsonl", "a", encoding="utf-8") as fh:
        fh.write(
            json.dumps({"_id": "evil1", "title": HOSTILE_TITLE, "text": "quick brown fox jumps over the dog"}) + "\n"
        )
        fh.write(json.dumps({"_id": "evil2", "title": "fox & <b>bold</b> dog", "text": HOSTILE_SNIPPET}) + "\n")
    return root


@pytest.fixture(scope="session")
def page_index(tmp_path_factory, tiny_bert_dir, page_beir):
    """A Flat index with semantic IDs over ``page_beir``; titles + snippets stored with it."""
    from scalingnote.index import build_index
    from scalingnote.index.pipeline import encode_with_tower

    root = tmp_path_factory.mktemp("page-index")
    encode_with_tower(tiny_bert_dir, page_beir, root / "emb", shard_size=64, batch_size=16, progress=False)
    return build_index(
        root / "emb", root / "idx", "Flat", semantic_ids_layers=2, codebook_size=4, seed=0, progress=False
    )


@pytest.fixture(scope="session")
def page_server(page_index, tiny_bert_dir, page_beir):
    """A running service with a BM25 index beside the dense one (built from --corpus at start)."""
    with running_server(page_index, tiny_bert_dir, max_wait_ms=5, corpus=str(page_beir)) as srv:
        yield srv


@contextmanager
def running_server(index, tower, **settings):
    """The service over ``index`` with ``tower``, in a background thread on a free port, ready."""
    from scalingnote.serve import BackgroundServer, ServeSettings, create_app

    with BackgroundServer(create_app(index, tower, ServeSettings(port=0, **settings))) as srv:
        srv.wait_ready()
        yield srv


@pytest.fixture()
def client(server):
    """A client of the ``server`` fixture of the requesting module."""
    import httpx

    with httpx.Client(base_url=server.url, trust_env=False, timeout=30) as c:
        yield c


def ready(client, timeout: float = 60.0) -> dict:
    """The ``/healthz`` answer of a ``TestClient``'s service once it has loaded (fails on a failed load)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        r = client.get("/healthz")
        if r.status_code == 200:
            return r.json()
        assert r.json().get("status") != "failed", r.json()
        time.sleep(0.05)
    raise AssertionError("service not ready")
