"""A real Milvus server (the embedded standalone build of the ``milvus`` 2.3.5 package) on
127.0.0.1: IVF_PQ, HNSW and SCANN collections built from a FAISS index, searched through the
same searcher the CLI and the service use, and a clean stop. Skips (with the reason) where the
server cannot run."""

from __future__ import annotations

import os

import numpy as np
import pytest

from scalingnote.index import DenseIndex, build_index

pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'pymilvus==3.0.2')")

from scalingnote.index.backends import open_searcher
from scalingnote.index.milvus.milvus import MilvusSearcher, connect
from scalingnote.index.milvus.milvus_export import export_to_milvus
from tests.helpers.milvus import start_embedded_milvus

TOWER = {"name": "synthetic", "compat_id": "space-1", "fingerprint": "fp-1", "dim": 32}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_embedded_milvus(tmp_path_factory, "milvus-server")
    yield srv
    pid = srv.pid
    srv.stop()
    if pid is not None:  # stopped and reaped: no server process left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, syn_vectors):
    root = tmp_path_factory.mktemp("server-faiss")
    ids = [f"doc-{i}" for i in range(len(syn_vectors))]
    kw = dict(doc_ids=ids, tower_info=TOWER, semantic_ids_layers=2, codebook_size=16, progress=False)
    return {
        "flat": build_index(syn_vectors, root / "flat", "Flat", **kw),
        "ivfpq": build_index(syn_vectors, root / "ivfpq", "IVF32,PQ8", **kw),
    }


def _recall(ref: list[list[str]], got: list[list[str]], k: int) -> float:
    return float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(ref, got, strict=True)]))


def test_server_is_loopback_and_not_lite(server):
    assert server.uri.startswith("http://127.0.0.1:") and server.running and server.startup_seconds > 0
    client = connect(server.uri)
    try:
        assert not str(client.get_server_version()).startswith("milvus_lite")
    finally:
        client.close()


@pytest.mark.slow  # export + IVF_PQ build on the server: ~1 min on a loaded 2-core machine
def test_ivf_pq_matches_faiss_ivfpq(server, indexes, syn_queries):
    man = export_to_milvus(indexes["ivfpq"], server.uri, "syn_ivfpq", progress=False)  # auto -> IVF_PQ on a server
    assert man["index_type"] == "IVF_PQ" and man["fallback_reason"] is None
    assert man["index_params"] == {"nlist": 32, "m": 8, "nbits": 8}  # the FAISS index's own sizes
    exact = DenseIndex.open(indexes["flat"]).search(syn_queries, 10)
    faiss_ivfpq = DenseIndex.open(indexes["ivfpq"]).search(syn_queries, 10, nprobe=8)
    with open_searcher("milvus", uri=server.uri, collection="syn_ivfpq") as ms:
        assert isinstance(ms, MilvusSearcher) and ms.has_ivf
        got = ms.search(syn_queries, 10, nprobe=8)
        reranked = ms.search(syn_queries, 10, nprobe=8, rerank=50)
    # compressed (PQ) scores, not a brute-force scan: they differ from the exact inner products
    assert float(np.abs(got.scores[:, 0] - exact.scores[:, 0]).max()) > 1e-3
    r_milvus, r_faiss = _recall(exact.doc_ids, got.doc_ids, 10), _recall(exact.doc_ids, faiss_ivfpq.doc_ids, 10)
    assert r_milvus > 0.5 and abs(r_milvus - r_faiss) <= 0.05, (r_milvus, r_faiss)
    # exact re-ranking of 50 PQ candidates: scores become exact inner products
    q0 = reranked.indices[0, 0]
    np.testing.assert_allclose(
        reranked.scores[0, 0], float(syn_queries[0] @ DenseIndex.open(indexes["flat"]).vectors[q0]), atol=1e-5
    )
    assert _recall(exact.doc_ids, reranked.doc_ids, 10) >= r_milvus


@pytest.mark.slow  # two more index builds on the server (~1 min on a loaded 2-core machine)
@pytest.mark.parametrize("index_type", ["HNSW", "SCANN"])
def test_hnsw_and_scann_build_and_search(server, indexes, syn_queries, index_type):
    name = f"syn_{index_type.lower()}"
    man = export_to_milvus(indexes["flat"], server.uri, name, index_type=index_type, progress=False)
    assert man["index_type"] == index_type
    exact = DenseIndex.open(indexes["flat"]).search(syn_queries, 10)
    with MilvusSearcher.open(server.uri, name) as ms:
        got = ms.search(syn_queries, 10, **({"nprobe": 16} if index_type == "SCANN" else {"ef_search": 64}))
    assert _recall(exact.doc_ids, got.doc_ids, 10) >= 0.9


@pytest.mark.slow  # a stop and a restart of the server
def test_stop_is_clean_and_data_persist(server, syn_queries):
    pid = server.pid
    assert pid is not None
    server.stop()
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone (and reaped), not a zombie left behind
    server.stop()  # idempotent
    # restart on the same data directory: the collection is still there
    server.start()
    with MilvusSearcher.open(server.uri, "syn_ivfpq") as ms:
        assert len(ms) == 3000 and ms.search(syn_queries[:2], 5).scores.shape == (2, 5)


@pytest.mark.slow  # one more export, a CLI search and a service start against the server
def test_cli_search_and_service_on_the_server(server, tmp_path, tiny_bert_dir):
    import httpx
    from typer.testing import CliRunner

    from scalingnote.cli import app
    from scalingnote.data.trec import read_run as load_run
    from scalingnote.index.pipeline import encode_with_tower, read_search_queries
    from scalingnote.serve import BackgroundServer, ServeSettings, create_app
    from tests.helpers.tiny_data import write_tiny_beir

    if not server.running:
        server.start()
    beir = write_tiny_beir(tmp_path / "beir")
    encode_with_tower(tiny_bert_dir, beir, tmp_path / "emb", shard_size=32, batch_size=16, progress=False)
    index = build_index(
        tmp_path / "emb", tmp_path / "idx", "Flat", semantic_ids_layers=2, codebook_size=4, progress=False
    )
    export_to_milvus(index, server.uri, "served", index_type="HNSW", progress=False)
    runs = {}
    for backend, extra in (
        ("faiss", ["--index", str(index)]),
        ("milvus", ["--uri", server.uri, "--collection", "served"]),
    ):
        out = tmp_path / f"{backend}.trec"
        r = CliRunner().invoke(
            app,
            [
                "search",
                "--backend",
                backend,
                *extra,
                "--query-tower",
                str(tiny_bert_dir),
                "--queries",
                str(beir),
                "--split",
                "test",
                "--out",
                str(out),
                "--k",
                "5",
            ],
            catch_exceptions=False,
        )
        assert r.exit_code == 0, r.output
        runs[backend] = load_run(out)
    assert runs["milvus"].keys() == runs["faiss"].keys()
    for q in runs["faiss"]:  # HNSW on 48 vectors with ef >= k is exact here: same top-1 score
        assert abs(max(runs["milvus"][q].values()) - max(runs["faiss"][q].values())) < 1e-4
    settings = ServeSettings(port=0, backend="milvus", uri=server.uri, collection="served")
    text = read_search_queries(beir, "test")[0].text
    with BackgroundServer(create_app(server.uri, tiny_bert_dir, settings)) as srv:
        health = srv.wait_ready()
        assert health["index"]["factory"] == "milvus:HNSW" and health["index"]["n_vectors"] == 48
        with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
            r = c.post("/search", json={"query": text, "k": 5})
            assert r.status_code == 200, r.text
            assert len(r.json()["results"]) == 5
