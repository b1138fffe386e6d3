"""Milvus serving back end (scalingnote.index.milvus.milvus) on Milvus Lite: export, search equal to a
FAISS Flat index, manifest recorded in the collection, query-tower compatibility check."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index import DenseIndex, IndexBuildSettings, build_index, encode_corpus

pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'pymilvus==3.0.2' 'milvus-lite==3.2.2')")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install 'milvus-lite==3.2.2')")

from scalingnote.index.backends import open_searcher
from scalingnote.index.milvus.milvus import MilvusSearcher, connect, read_collection_manifest
from scalingnote.index.milvus.milvus_export import default_index_params, export_to_milvus, resolve_index_type

TOWER = {"name": "synthetic", "compat_id": "space-1", "fingerprint": "fp-1", "dim": 32}


def _same_topk(ref, got, k: int, tol: float = 1e-5) -> None:
    """Top-k lists equal up to ties: the same scores, and the same ids wherever the
    reference score is not tied (within ``tol``) with a neighbour or the k-th score."""
    np.testing.assert_allclose(got.scores[:, :k], ref.scores[:, :k], rtol=0, atol=tol)
    for q in range(len(ref.doc_ids)):
        r, g, s = ref.doc_ids[q][:k], got.doc_ids[q][:k], ref.scores[q, :k]
        kth = s[-1]
        untied = {
            r[i]
            for i in range(k)
            if abs(s[i] - kth) > tol
            and (i == 0 or abs(s[i] - s[i - 1]) > tol)
            and (i == k - 1 or abs(s[i] - s[i + 1]) > tol)
        }
        assert untied <= set(g), f"query {q}: {sorted(untied - set(g))} missing from the Milvus top-{k}"
        strict = {r[i] for i in range(k) if abs(s[i] - kth) > tol}
        assert strict <= set(g), f"query {q}: documents above the k-th score missing"


@pytest.fixture(scope="module")
def flat_index(tmp_path_factory, syn_vectors):
    out = tmp_path_factory.mktemp("milvus-faiss") / "flat"
    ids = [f"doc-{i}" for i in range(len(syn_vectors))]
    return build_index(
        syn_vectors, out, "Flat", doc_ids=ids, tower_info=TOWER, semantic_ids_layers=3, codebook_size=16, progress=False
    )


@pytest.fixture(scope="module")
def lite_db(tmp_path_factory):
    return str(tmp_path_factory.mktemp("milvus-lite") / "milvus.db")


@pytest.fixture(scope="module")
def exported(flat_index, lite_db):
    """The FAISS Flat index exported with the default index type (HNSW on Milvus Lite)."""
    return export_to_milvus(flat_index, lite_db, "syn_auto", progress=False)


def test_auto_export_to_lite_is_hnsw_and_recorded(exported, lite_db):
    assert exported["index_type"] == "HNSW"
    assert exported["requested_index_type"] == "auto"
    assert "does not implement IVF_PQ" in exported["fallback_reason"]
    assert exported["index_params"] == {"M": 32, "efConstruction": 200}
    assert exported["server_version"].startswith("milvus_lite")
    client = connect(lite_db)
    try:
        man = read_collection_manifest(client, "syn_auto")
        assert man["tower"] == TOWER  # fingerprint / compat id stored in the collection
        assert (man["index_type"], man["index_params"], man["n_vectors"], man["dim"]) == (
            "HNSW",
            {"M": 32, "efConstruction": 200},
            3000,
            32,
        )
        assert man["semantic_ids"]["n_layers"] == 3
        assert client.get_collection_stats("syn_auto")["row_count"] == 3000
        assert not [c for c in client.list_collections() if "__tmp_" in c]  # temporary collection renamed away
    finally:
        client.close()


def test_hnsw_search_matches_faiss_flat(exported, flat_index, lite_db, syn_queries):
    ref = DenseIndex.open(flat_index).search(syn_queries, 10)
    with MilvusSearcher.open(lite_db, "syn_auto") as ms:
        got = ms.search(syn_queries, 10)
        from scalingnote.index import Searcher

        assert isinstance(ms, Searcher)  # the shared search_run of every back end
        qids = [f"q{i}" for i in range(len(syn_queries))]
        assert ms.search_run(qids, syn_queries, k=10, batch_size=7) == got.to_run(qids)
        assert len(ms) == 3000 and ms.dim == 32 and ms.factory == "milvus:HNSW" and ms.has_hnsw and not ms.has_ivf
        assert ms.doc_ids == DenseIndex.open(flat_index).doc_ids
    _same_topk(ref, got, 10)
    # semantic IDs of each hit are the FAISS index's
    sem = np.load(flat_index / "semantic_ids.npy")
    for q in range(len(got.doc_ids)):
        for r, d in enumerate(got.doc_ids[q]):
            assert got.semantic_ids[q, r].tolist() == sem[int(d.split("-")[1])].tolist()
    assert (got.indices == np.array([[int(d.split("-")[1]) for d in row] for row in got.doc_ids])).all()


def test_flat_and_ivf_flat_exports(flat_index, lite_db, syn_queries):
    ref = DenseIndex.open(flat_index).search(syn_queries, 10)
    export_to_milvus(flat_index, lite_db, "syn_flat", index_type="FLAT", progress=False)
    with MilvusSearcher.open(lite_db, "syn_flat") as ms:
        _same_topk(ref, ms.search(syn_queries, 10), 10)
        with pytest.raises(ScalingNoteError, match="has no IVF layer"):
            ms.search(syn_queries, 10, nprobe=4)
    m = export_to_milvus(
        flat_index, lite_db, "syn_ivf", index_type="IVF_FLAT", index_params={"nlist": 16}, progress=False
    )
    assert m["index_params"] == {"nlist": 16} and m["search_defaults"] == {"nprobe": 16}
    with MilvusSearcher.open(lite_db, "syn_ivf") as ms:
        _same_topk(ref, ms.search(syn_queries, 10, nprobe=16), 10)  # all lists probed: exact
        few = ms.search(syn_queries, 10, nprobe=1)
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ref.doc_ids, few.doc_ids, strict=True)])
        assert recall < 1.0  # one list of 16: an approximate search really happened
        # rerank: candidates re-scored with the stored full-precision vectors
        rr = ms.search(syn_queries, 10, nprobe=1, rerank=50)
        valid = rr.indices >= 0
        assert valid[:, 0].all()
        exact = np.einsum("qd,qkd->qk", syn_queries, np.load(flat_index / "vectors.npy")[np.maximum(rr.indices, 0)])
        np.testing.assert_allclose(rr.scores[valid], exact[valid], rtol=0, atol=1e-5)
        assert np.isneginf(rr.scores[~valid]).all()
        assert (np.diff(np.where(valid, rr.scores, -10.0), axis=1) <= 1e-7).all()
        assert [len(d) for d in rr.doc_ids] == valid.sum(axis=1).tolist()
        with pytest.raises(ScalingNoteError, match="has no HNSW graph"):
            ms.search(syn_queries, 10, ef_search=64)


def test_lite_refuses_ivf_pq_explicitly(flat_index, lite_db):
    with pytest.raises(
        ScalingNoteError, match=r"index type 'IVF_PQ': not supported by Milvus Lite; choose one of: HNSW"
    ):
        export_to_milvus(flat_index, lite_db, "syn_pq", index_type="IVF_PQ", progress=False)
    assert resolve_index_type("auto", lite=False) == ("IVF_PQ", None)
    # PQ sizes follow the FAISS index when exported from one; else >= 8 dims per sub-quantiser
    assert default_index_params("IVF_PQ", 100_000, 384, {"factory": "IVF256,PQ48", "nlist": 256}) == {
        "nlist": 256,
        "m": 48,
        "nbits": 8,
    }
    assert default_index_params("IVF_PQ", 100_000, 128) == {"nlist": 1265, "m": 16, "nbits": 8}


def test_existing_collection_needs_overwrite(flat_index, lite_db, exported):
    with pytest.raises(ScalingNoteError, match="already exists"):
        export_to_milvus(flat_index, lite_db, "syn_auto", progress=False)
    with pytest.raises(ScalingNoteError, match="collection name"):
        export_to_milvus(flat_index, lite_db, "bad-name!", progress=False)
    with pytest.raises(ScalingNoteError, match="no such collection"):
        MilvusSearcher.open(lite_db, "nope")


def test_overwrite_replaces_the_collection(tmp_path, flat_index, syn_vectors):
    db = str(tmp_path / "o.db")
    export_to_milvus(flat_index, db, "c", index_type="FLAT", progress=False)
    m = export_to_milvus(
        flat_index, db, "c", index_type="IVF_FLAT", index_params={"nlist": 8}, overwrite=True, progress=False
    )
    with MilvusSearcher.open(db, "c") as ms:
        assert ms.index_type == "IVF_FLAT" and ms.manifest["created"] == m["created"] and len(ms) == len(syn_vectors)


def test_export_from_embeddings_fits_the_same_semantic_ids(
    tmp_path, doc_tower, query_tower, other_bert_dir, tiny_corpus
):
    """Embeddings directory -> Milvus (Matryoshka prefix, semantic IDs as build_index fits them);
    text search with a compatible query tower; an incompatible tower is refused."""
    from scalingnote.models import load_tower

    emb = tmp_path / "emb"
    encode_corpus(doc_tower, tiny_corpus, emb, shard_size=25, batch_size=16, progress=False)
    # the build takes the settings object, the export the same settings as keywords
    shared = IndexBuildSettings(dim=16, semantic_ids_layers=2, codebook_size=4, seed=3)
    idx = build_index(emb, tmp_path / "idx", "Flat", settings=shared, progress=False)
    db = str(tmp_path / "e.db")
    m = export_to_milvus(
        emb, db, "docs", dim=16, semantic_ids_layers=2, codebook_size=4, seed=3, index_type="FLAT", progress=False
    )
    assert m["tower"]["compat_id"] == doc_tower.compat_id and m["tower"]["fingerprint"] == doc_tower.fingerprint
    assert (m["dim"], m["source_dim"], m["matryoshka_prefix"]) == (16, doc_tower.out_dim, True)

    faiss_index = DenseIndex.open(idx, query_tower=query_tower)
    texts = ["vitamin fracture risk", "product quantization codes"]
    with MilvusSearcher.open(db, "docs", query_tower=query_tower) as ms:
        got = ms.search(texts, 5)
    ref = faiss_index.search(texts, 5)
    _same_topk(ref, got, 5)
    sem = dict(zip(faiss_index.doc_ids, np.asarray(faiss_index.semantic_ids).tolist(), strict=True))
    assert [[sem[d] for d in row] for row in got.doc_ids] == got.semantic_ids.tolist()

    other = load_tower(other_bert_dir, role="query")
    with pytest.raises(ScalingNoteError, match="is not compatible with the index's document tower"):
        MilvusSearcher.open(db, "docs", query_tower=other)
    with pytest.raises(ScalingNoteError, match="is not compatible"):
        open_searcher("milvus", uri=db, collection="docs", query_tower=other)
    with pytest.raises(ScalingNoteError, match="needs a query tower"):
        with MilvusSearcher.open(db, "docs") as ms:
            ms.search(texts, 5)


def test_missing_pymilvus_gives_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "pymilvus", None)  # import pymilvus -> ImportError
    with pytest.raises(ScalingNoteError, match=r"pip install 'pymilvus==3\.0\.2' 'milvus-lite==3\.2\.2'"):
        connect("/tmp/never.db")


def test_unreachable_server_is_a_clear_error():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ScalingNoteError, match=rf"cannot connect to Milvus at http://127.0.0.1:{port}"):
        from pymilvus import MilvusClient  # noqa: F401 - connect() imports it the same way

        connect(f"http://127.0.0.1:{port}", token=None)


def test_cli_export(tmp_path, flat_index):
    from typer.testing import CliRunner

    from scalingnote.cli import app

    db = str(tmp_path / "cli.db")
    r = CliRunner().invoke(
        app, ["index", "export", "--to", "milvus", "--uri", db, "--collection", "cli_c", "--index", str(flat_index)]
    )
    assert r.exit_code == 0, r.output
    assert "3000 x 32-d vectors, HNSW" in r.output and "does not implement IVF_PQ" in r.output
    client = connect(db)
    try:
        assert json.loads(client.describe_collection("cli_c")["properties"]["scalingnote.manifest"])["tower"] == TOWER
    finally:
        client.close()


# --------------------------------------------------------------------------- serving


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_bert_dir):
    """A tiny BEIR corpus encoded with the tiny BERT, a FAISS Flat index with semantic IDs,
    and the same index exported to Milvus Lite (FLAT: exact, comparable hit for hit)."""
    from scalingnote.index.pipeline import encode_with_tower
    from tests.helpers.tiny_data import write_tiny_beir

    root = tmp_path_factory.mktemp("milvus-serve")
    beir = write_tiny_beir(root / "beir")
    encode_with_tower(tiny_bert_dir, beir, root / "emb", shard_size=32, batch_size=16, progress=False)
    index = build_index(root / "emb", root / "idx", "Flat", semantic_ids_layers=2, codebook_size=4, progress=False)
    db = str(root / "serve.db")
    export_to_milvus(index, db, "served", index_type="FLAT", progress=False)
    return {"beir": beir, "index": index, "db": db}


def test_service_with_milvus_backend_answers_like_faiss(served, tiny_bert_dir, other_bert_dir):
    import httpx

    from scalingnote.index.pipeline import read_search_queries
    from scalingnote.serve import BackgroundServer, ServeSettings, create_app

    texts = [q.text for q in read_search_queries(served["beir"], "test")]
    answers = {}
    for backend in ("faiss", "milvus"):
        settings = ServeSettings(port=0, backend=backend, uri=served["db"], collection="served")
        where = served["index"] if backend == "faiss" else served["db"]
        app = create_app(where, tiny_bert_dir, settings)
        with BackgroundServer(app) as srv:
            health = srv.wait_ready()
            assert (
                health["index"]["n_vectors"] == 48 and health["titles"]["n"] == 48
            )  # titles found via the recorded embeddings dir
            with httpx.Client(base_url=srv.url, trust_env=False, timeout=30) as c:
                r = c.post("/search/batch", json={"queries": texts, "k": 5})
                assert r.status_code == 200, r.text
                answers[backend] = r.json()["results"]
                if backend == "milvus":
                    assert health["index"]["factory"] == "milvus:FLAT" and health["index"]["path"].endswith(
                        "serve.db#served"
                    )
                    r = c.post("/search", json={"query": texts[0], "k": 5, "nprobe": 2})
                    assert r.status_code == 422 and "no IVF layer" in r.json()["detail"]
                    r = c.post(
                        "/admin/reload",
                        json={"query_tower": str(other_bert_dir)},
                        headers={"Authorization": f"Bearer {app.state.admin_token}"},
                    )
                    assert r.status_code == 409 and "not compatible" in r.json()["detail"]
    for fa, mi in zip(answers["faiss"], answers["milvus"], strict=True):
        # the tiny corpus repeats texts: equal scores may come in either order (and swap at
        # the k-th place); every hit must carry the same score, semantic ID and title
        np.testing.assert_allclose([h["score"] for h in mi], [h["score"] for h in fa], rtol=0, atol=1e-5)
        kth = fa[-1]["score"]
        assert {h["doc_id"] for h in fa if h["score"] > kth + 1e-5} <= {h["doc_id"] for h in mi}
        by_id = {h["doc_id"]: h for h in fa}
        for h in mi:
            if h["doc_id"] in by_id:
                ref = by_id[h["doc_id"]]
                assert (h["semantic_id"], h["title"]) == (ref["semantic_id"], ref["title"])
                assert abs(h["score"] - ref["score"]) <= 1e-5
            else:
                assert abs(h["score"] - kth) <= 1e-5  # only a tie at the k-th place may differ

    # an incompatible query tower: the service never becomes ready
    settings = ServeSettings(port=0, backend="milvus", uri=served["db"], collection="served")
    with BackgroundServer(create_app(served["db"], other_bert_dir, settings)) as srv:
        with pytest.raises(ScalingNoteError, match="not compatible"):
            srv.wait_ready()


def test_serve_settings_need_a_milvus_uri():
    from scalingnote.errors import ConfigError
    from scalingnote.serve import ServeSettings

    with pytest.raises(ConfigError, match="uri"):
        ServeSettings(backend="milvus")
    with pytest.raises(ConfigError, match="backend"):
        ServeSettings(backend="elastic")


def test_cli_serve_backend_milvus_refuses_an_incompatible_tower(served, other_bert_dir, tmp_path):
    from typer.testing import CliRunner

    from scalingnote.cli import app

    args = [
        "serve",
        "--backend",
        "milvus",
        "--uri",
        served["db"],
        "--collection",
        "served",
        "--query-tower",
        str(other_bert_dir),
        "--port",
        "0",
    ]
    r = CliRunner().invoke(app, args)
    assert r.exit_code != 0
    assert isinstance(r.exception, ScalingNoteError) and "not compatible" in str(r.exception)
    r = CliRunner().invoke(app, ["serve", "--query-tower", str(other_bert_dir), "--port", "0"])
    assert isinstance(r.exception, ScalingNoteError) and "--index DIR is required" in str(r.exception)


def test_routed_indexes_export_mapped_or_refused(tmp_path, syn_vectors, lite_db):
    """hnsw_pq / hnsw export as Milvus HNSW types (HNSW_PQ on a server, HNSW on Lite, the
    graph's M kept); ivf_qmetric under ``auto`` is refused naming what would be lost (its lists)."""
    from scalingnote.index.milvus.milvus_export import _method_index_type

    ids = [f"doc-{i}" for i in range(len(syn_vectors))]
    tq = np.random.default_rng(3).standard_normal((50, syn_vectors.shape[1])).astype(np.float32)

    def built(name, method, **kw):
        opts = dict(doc_ids=ids, tower_info=TOWER, semantic_ids_layers=0, progress=False)
        return build_index(syn_vectors, tmp_path / name, method=method, **opts, **kw)

    qm = built("qm", "ivf_qmetric", train_queries=tq)
    with pytest.raises(ScalingNoteError, match="ivf_qmetric.*would be lost.*--index-type"):
        export_to_milvus(qm, lite_db, "syn_qm", progress=False)
    m = export_to_milvus(
        qm, lite_db, "syn_qm", index_type="HNSW", progress=False
    )  # explicit: the vectors, with Milvus's own index
    assert m["index_type"] == "HNSW" and "not exported" in m["fallback_reason"]
    hp = built("hp", "hnsw_pq")
    m = export_to_milvus(hp, lite_db, "syn_hp", progress=False)
    built_m = json.loads((hp / "manifest.json").read_text())["routing"]["config"][
        "hnsw_m"
    ]  # sized to the memory bound of these vectors
    assert m["index_type"] == "HNSW" and m["index_params"]["M"] == built_m and "no HNSW_PQ" in m["fallback_reason"]
    assert (
        _method_index_type("auto", "hnsw_pq", lite=False) == "HNSW_PQ"
        and _method_index_type("auto", "ivf", lite=False) == "auto"
    )
    hs = built("hs", "hnsw_sq")
    m = export_to_milvus(hs, lite_db, "syn_hs", progress=False)  # Lite has HNSW_SQ; 4-bit goes out as SQ6, said so
    built_m = json.loads((hs / "manifest.json").read_text())["routing"]["config"]["hnsw_m"]
    assert m["index_type"] == "HNSW_SQ" and m["index_params"]["M"] == built_m and m["index_params"]["sq_type"] == "SQ6"
    assert "no 4-bit" in m["fallback_reason"]
    qg = built("qg", "hnsw_sq_qg", train_queries=tq)
    m = export_to_milvus(
        qg, lite_db, "syn_qg", progress=False
    )  # the vectors and M go out; the query-guided edges cannot
    assert m["index_type"] == "HNSW_SQ" and "query-guided edges are not exported" in m["fallback_reason"]
    lean = built("lean", "hnsw_lean", train_queries=tq)
    m = export_to_milvus(lean, lite_db, "syn_lean", progress=False)  # the vectors and M; no projected graph
    built_m = json.loads((lean / "manifest.json").read_text())["routing"]["config"]["hnsw_m"]
    assert m["index_type"] == "HNSW_SQ" and m["index_params"] == {"M": built_m, "efConstruction": 200, "sq_type": "SQ8"}
    assert "projection" in m["fallback_reason"] and "query-guided edges" in m["fallback_reason"]
    # ivf_rabitq: Milvus's SCANN (IVF + 4-bit fast-scan codes + re-rank) on a server; Lite has no fast scan:
    # IVF_SQ8, the lists kept
    assert (
        _method_index_type("auto", "ivf_rabitq", lite=False) == "SCANN"
        and _method_index_type("auto", "ivf_rabitq", lite=True) == "IVF_SQ8"
    )
    rq = built("rq", "ivf_rabitq")
    m = export_to_milvus(rq, lite_db, "syn_rq", progress=False)
    assert (
        m["index_type"] == "IVF_SQ8"
        and m["index_params"]["nlist"] == json.loads((rq / "manifest.json").read_text())["routing"]["config"]["nlist"]
    )
