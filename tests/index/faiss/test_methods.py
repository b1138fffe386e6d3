"""Routed structures built and served through the normal index path, and the method choice
(fastest measured single-query latency within the memory bound): tiny clustered random vectors, real FAISS."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from scalingnote.cli import app as cli
from scalingnote.errors import ScalingNoteError
from scalingnote.index import DenseIndex, build_index
from scalingnote.index.faiss.methods import default_routing, load_state, query_edge_variants
from scalingnote.index.routing.method_tune import (
    DEFAULT_METHODS,
    LATENCY_TIE,
    MEMORY_BOUND,
    choose_method,
    fastest_within_tie,
    memory_bound_for,
)
from scalingnote.index.routing.routing import RoutedIndex
from scalingnote.index.tune import exact_topk, recall_vs_exact, save_search_defaults

N, D = 800, 32


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    c = rng.standard_normal((24, D)).astype(np.float32)

    def draw(n, noise):
        x = c[rng.integers(0, len(c), n)] + noise * rng.standard_normal((n, D)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    return draw(N, 0.3), draw(40, 0.5), draw(200, 0.5)  # documents, validation queries, training queries


@pytest.mark.parametrize("method", ["ivf", "ivf_qmetric", "ivf_pqfs", "hnsw_pq", "hnsw_sq", "hnsw_sq_qg", "hnsw_lean"])
def test_a_built_method_serves_what_the_tuner_measured(tmp_path, data, method):
    x, vq, tq = data
    cfg = default_routing(method, N, D, seed=0)
    out = build_index(
        x,
        tmp_path / method,
        method=method,
        routing=cfg,
        train_queries=tq,
        doc_ids=[f"d{i}" for i in range(N)],
        semantic_ids_layers=0,
        progress=False,
    )
    man = json.loads((out / "manifest.json").read_text())
    assert man["routing"]["method"] == method and man["factory"].startswith(f"{method}:")
    assert man["routing"]["config"]["pq_m"] == cfg.pq_m and (man["routing"]["file"] is not None) == (
        method in ("ivf_qmetric", "hnsw_sq_qg", "hnsw_lean")
    )
    knob = {"ef_search": 32} if method.startswith("hnsw") else {"nprobe": 4}
    # the structure the tuner measured (built in memory the same way) returns the same hits as the saved one
    fit = tq if method in ("ivf_qmetric", "hnsw_sq_qg") else None
    if method == "hnsw_lean":  # its fitting queries as the index keeps them (float16), as compaction refits
        fit = np.asarray(np.asarray(tq, np.float16), np.float32)
    ref = RoutedIndex.build(x, cfg, train_queries=fit).search(vq, 10, rerank=50, **knob)
    got = DenseIndex.open(out).search(vq, 10, rerank=50, **knob)
    assert recall_vs_exact(np.asarray(got.indices), ref.ids) == 1.0


def test_choice_is_cheapest_within_memory_and_served_by_default(tmp_path, data):
    x, vq, tq = data
    rep = choose_method(x, vq, tq, target=0.95, seed=0, memory_bound_above=0)  # the bound held at any size
    rows = {r["method"]: r for r in rep["methods"]}
    assert (
        set(rows)
        == set(DEFAULT_METHODS)
        == {"ivf", "ivf_qmetric", "ivf_rabitq", "hnsw_pq", "hnsw_sq"}
        | {
            "ivf_pqfs",
            "scann_soar",
            "svs_vamana",
        }
    )
    assert all(0 < r["share_scanned"] and 0 < r["memory_ratio"] and r["build_seconds"] >= 0 for r in rows.values())
    # 32-d: an HNSW graph (32 x 2 x 4-byte neighbours per vector on level 0) outweighs 128-byte float vectors
    assert not rows["hnsw_pq"]["within_memory"] and not rows["hnsw_sq"]["within_memory"]
    assert not rows["svs_vamana"]["within_memory"]  # float32 vectors + its graph
    fit = [r for r in rows.values() if r["within_memory"] and r["met"]]
    assert all(r["latency_ms_single"] > 0 for r in fit)  # each met setting timed one query at a time
    fastest = min(r["latency_ms_single"] for r in fit)
    band = [r for r in fit if r["latency_ms_single"] <= fastest * (1 + LATENCY_TIE)]
    # the contenders within the tie margin (and only they) are timed again head to head, paired per query
    paired = [r for r in rep["methods"] if "latency_ms_paired" in r]
    assert paired == (band if len(band) > 1 else []) and all(r["paired_queries"] == len(vq) for r in paired)
    assert rep["met"] and rep["chosen"]["method"] == fastest_within_tie(fit)[0]["method"]
    method = rep["chosen"]["method"]
    out = build_index(
        x,
        tmp_path / "chosen",
        method=method,
        routing=rep["routing"],
        train_queries=tq,
        doc_ids=[f"d{i}" for i in range(N)],
        semantic_ids_layers=0,
        progress=False,
    )
    save_search_defaults(out, rep)
    idx = DenseIndex.open(out)
    tuning = idx.manifest["search_tuning"]
    assert tuning["methods"] and tuning["chosen"]["method"] == method and tuning["queries"] == "validation"
    knob = rep["knob"]
    default = idx.search(vq, 10)  # no flags: the manifest's search defaults
    explicit = idx.search(vq, 10, rerank=rep["chosen"]["rerank"] or 0, **{knob: rep["chosen"][knob]})
    assert np.array_equal(default.indices, explicit.indices)
    # the recall it was chosen with is the recall it serves
    assert recall_vs_exact(np.asarray(default.indices), exact_topk(x, vq, 10)) == pytest.approx(
        rep["chosen"]["recall"], abs=1e-4
    )


def test_edge_count_variants_are_each_swept_and_the_cheaper_one_is_built(tmp_path, data):
    x, vq, tq = data
    assert [v.query_edges for v in query_edge_variants(default_routing("hnsw_sq_qg", N, D, hnsw_m=16))] == [
        16
    ]  # no room for 32 in 2 x 16 slots
    variants = query_edge_variants(default_routing("hnsw_sq_qg", N, D, seed=0, hnsw_m=32))
    assert [v.query_edges for v in variants] == [16, 32]
    rep = choose_method(
        x, vq, tq, methods=("hnsw_sq_qg",), routing={"hnsw_sq_qg": variants}, target=0.95, memory_bound=10.0, seed=0
    )
    rows = rep["methods"]
    assert [r["structure"] for r in rows] == ["hnsw_sq_qg:HNSW32,SQ4,QG16", "hnsw_sq_qg:HNSW32,SQ4,QG32"]
    best = fastest_within_tie([r for r in rows if r["met"]])[0]
    assert rep["chosen"]["structure"] == best["structure"]
    assert rep["routing"]["query_edges"] == int(
        best["structure"].rsplit("QG", 1)[1]
    )  # the chosen variant's config, not the last one's
    # in either order the config built is the winner's, not the last one swept (the winner itself is timed again:
    # it may differ)
    rev = choose_method(
        x,
        vq,
        tq,
        methods=("hnsw_sq_qg",),
        routing={"hnsw_sq_qg": variants[::-1]},
        target=0.95,
        memory_bound=10.0,
        seed=0,
    )
    assert rev["routing"]["query_edges"] == int(rev["chosen"]["structure"].rsplit("QG", 1)[1])
    out = build_index(
        x,
        tmp_path / "qg",
        method="hnsw_sq_qg",
        routing=rep["routing"],
        train_queries=tq,
        doc_ids=[f"d{i}" for i in range(N)],
        semantic_ids_layers=0,
        progress=False,
    )
    assert json.loads((out / "manifest.json").read_text())["factory"] == best["structure"]


def test_no_method_within_the_bound_takes_the_least_memory_and_says_why(data):
    x, vq, tq = data
    rep = choose_method(x, vq, tq, methods=("ivf", "hnsw_pq"), target=0.95, memory_bound=1e-4, memory_bound_above=0)
    assert not rep["met"] and "no method fits" in rep["reason"] and "least memory" in rep["reason"]
    met = [r for r in rep["methods"] if r["met"]]
    assert met and rep["chosen"]["method"] == min(met, key=lambda r: r["memory_ratio"])["method"] == "ivf"


def test_the_memory_bound_holds_above_100k_documents_only(data):
    x, vq, tq = data
    assert memory_bound_for(100_000) is None and memory_bound_for(100_001) == MEMORY_BOUND == 0.25
    # 800 documents: no bound, so the graphs that outweigh 32-d floats stay candidates and may be chosen
    rep = choose_method(x, vq, tq, methods=("ivf", "hnsw_pq"), target=0.95, memory_bound=1e-4)
    assert rep["memory_bound"] is None and rep["memory_bound_above"] == 100_000
    assert all(r["within_memory"] for r in rep["methods"]) and all(r["memory_ratio"] > 1e-4 for r in rep["methods"])
    assert rep["met"] and "no memory bound at this size" in rep["reason"]
    assert rep["chosen"]["method"] == fastest_within_tie([r for r in rep["methods"] if r["met"]])[0]["method"]
    # the same corpus held to the bound: none fits
    held = choose_method(x, vq, tq, methods=("ivf", "hnsw_pq"), target=0.95, memory_bound=1e-4, memory_bound_above=799)
    assert held["memory_bound"] == 1e-4 and not held["met"] and "no method fits" in held["reason"]


def test_query_fitted_methods_without_training_queries_are_skipped_and_routed_refused(data):
    x, vq, _ = data
    rep = choose_method(x, vq, None, methods=("ivf", "ivf_qmetric", "hnsw_sq_qg"), target=0.9)
    skipped = {r["method"]: r.get("skipped") for r in rep["methods"]}
    assert skipped["ivf_qmetric"] and "query-guided" in skipped["hnsw_sq_qg"] and not skipped["ivf"]
    with pytest.raises(ScalingNoteError, match="ivf_routed"):
        choose_method(x, vq, None, methods=("ivf_routed",))
    with pytest.raises(ScalingNoteError, match="ivf_routed needs its own routed search"):
        build_index(x, "/nonexistent/never", method="ivf_routed", doc_ids=[str(i) for i in range(N)], progress=False)


def test_rebuilding_ivf_qmetric_reuses_its_stored_metric(tmp_path, data):
    x, _, tq = data
    ids = [f"d{i}" for i in range(N)]
    a = build_index(
        x, tmp_path / "a", method="ivf_qmetric", train_queries=tq, doc_ids=ids, semantic_ids_layers=0, progress=False
    )
    state = load_state(a, json.loads((a / "manifest.json").read_text()))
    b = build_index(
        x,
        tmp_path / "b",
        method="ivf_qmetric",
        routing_state={"a": state["a"]},
        doc_ids=ids,
        semantic_ids_layers=0,
        progress=False,
    )
    sb = load_state(b, json.loads((b / "manifest.json").read_text()))
    assert np.allclose(sb["a"], state["a"]) and np.allclose(sb["centroids"], state["centroids"], atol=1e-4)


@pytest.fixture(scope="module")
def beir_dir(tmp_path_factory, tiny_corpus, queries_factory):
    from scalingnote.data import write_beir

    root = tmp_path_factory.mktemp("beir") / "toy"
    queries = queries_factory(4)
    write_beir(root, tiny_corpus, queries, {"test": {q.id: {tiny_corpus[i].id: 1} for i, q in enumerate(queries)}})
    return root


def test_index_build_cli_method_then_search_without_flags(tmp_path, beir_dir, tiny_bert_dir):
    idx = tmp_path / "idx"
    r = CliRunner().invoke(
        cli,
        [
            "index",
            "build",
            "--tower",
            str(tiny_bert_dir),
            "--data",
            str(beir_dir),
            "--method",
            "hnsw_pq",
            "--out",
            str(idx),
            "--semantic-ids-layers",
            "0",
        ],
    )
    assert r.exit_code == 0, r.output
    man = json.loads((idx / "manifest.json").read_text())
    assert (
        man["routing"]["method"] == "hnsw_pq"
        and man["faiss_class"] == "IndexHNSWPQ"
        and "ef_search" in man["search_defaults"]
    )
    r = CliRunner().invoke(
        cli,
        ["search", "--index", str(idx), "--query-tower", str(tiny_bert_dir), "--query", "protein folding", "--k", "3"],
    )
    assert r.exit_code == 0, r.output
    hits = [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]
    assert len(hits) == 3 and all(h.get("id") or h.get("doc_id") for h in hits)


def test_index_build_cli_query_guided_graph_needs_and_takes_training_queries(tmp_path, beir_dir, tiny_bert_dir):
    args = [
        "index",
        "build",
        "--tower",
        str(tiny_bert_dir),
        "--data",
        str(beir_dir),
        "--method",
        "hnsw_sq_qg",
        "--semantic-ids-layers",
        "0",
    ]
    r = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "none")])
    assert isinstance(r.exception, ScalingNoteError) and "needs train_queries" in str(
        r.exception
    )  # the CLI prints it as one line
    assert not (tmp_path / "none").exists()  # nothing half-written
    tq = tmp_path / "tq.npy"
    from scalingnote.models import load_tower

    width = load_tower(str(tiny_bert_dir), "query").encode_queries(["x"], show_progress=False).shape[1]
    np.save(tq, np.random.default_rng(1).standard_normal((300, width)).astype(np.float32))
    r = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "qg"), "--train-queries", str(tq)])
    assert r.exit_code == 0, r.output
    man = json.loads((tmp_path / "qg" / "manifest.json").read_text())
    assert (
        man["routing"]["method"] == "hnsw_sq_qg" and ",QG" in man["factory"] and man["routing"]["file"] == "routing.npz"
    )
    r = CliRunner().invoke(
        cli,
        [
            "search",
            "--index",
            str(tmp_path / "qg"),
            "--query-tower",
            str(tiny_bert_dir),
            "--query",
            "protein folding",
            "--k",
            "3",
        ],
    )
    assert r.exit_code == 0 and len([line for line in r.output.splitlines() if line.startswith("{")]) == 3, r.output


def test_the_hnsw_graph_is_sized_to_the_memory_bound_of_the_vectors_it_indexes():
    from scalingnote.index.faiss.methods import hnsw_m_within

    assert default_routing("hnsw_pq", 50_000, 384).hnsw_m == 32  # 0.22 of the floats
    assert default_routing("hnsw_pq", 50_000, 128).hnsw_m == 8  # M=32 would take 0.57 of them
    assert default_routing("hnsw_pq", 50_000, 128, hnsw_m=32).hnsw_m == 32  # asked for: kept
    assert hnsw_m_within(64, 8) == 4
    assert (
        default_routing("hnsw_sq", 50_000, 576).hnsw_m == 32
    )  # 4-bit codes (288 bytes) + the graph: 0.245 of the floats
    assert default_routing("hnsw_sq", 50_000, 384).hnsw_m == 16
    assert (
        default_routing("hnsw_sq", 50_000, 384, sq_bits=8).hnsw_m == 8
    )  # 8-bit codes alone take 1/4: the smallest graph allowed
    rng0 = np.random.default_rng(1)
    z = rng0.standard_normal((3_000, 128)).astype(np.float32)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    small = RoutedIndex.build(z, default_routing("hnsw_sq", len(z), 128))  # 128-d: M=8 is the floor, above the bound
    assert small.config.hnsw_m == 8 and small.memory_bytes() / z.nbytes > 0.25
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12_000, 128)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    r = RoutedIndex.build(x, default_routing("hnsw_pq", len(x), 128))
    assert r.memory_bytes() / x.nbytes <= 0.25  # the estimate holds for the index FAISS serialises
    y = rng.standard_normal((12_000, 576)).astype(np.float32)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    r = RoutedIndex.build(y, default_routing("hnsw_sq", len(y), 576))
    assert r.memory_bytes() / y.nbytes <= 0.25 and r.config.hnsw_m == 32


def test_a_latency_difference_below_the_tie_margin_keeps_the_first_listed_method():
    rows = [
        {"method": "ivf", "latency_ms_single": 1.10},
        {"method": "ivf_rabitq", "latency_ms_single": 1.00},
        {"method": "hnsw_pq", "latency_ms_single": 2.00},
    ]
    best, tied = fastest_within_tie(rows, tie=0.25)
    assert best["method"] == "ivf" and [r["method"] for r in tied] == ["ivf", "ivf_rabitq"]
    # outside the margin the fastest wins whatever its position
    best, tied = fastest_within_tie([{"method": "ivf", "latency_ms_single": 1.30}, *rows[1:]], tie=0.25)
    assert best["method"] == "ivf_rabitq" and len(tied) == 1


def test_every_graph_the_index_step_builds_has_the_wider_construction_beam(data):
    import dataclasses

    from scalingnote.index.faiss.methods import GRAPH_EF_CONSTRUCTION
    from scalingnote.index.routing.lean import graph_of
    from scalingnote.index.routing.routing import RoutingConfig

    x, _, tq = data
    assert GRAPH_EF_CONSTRUCTION > RoutingConfig.ef_construction  # wider than FAISS's default
    for method in ("hnsw", "hnsw_pq", "hnsw_sq", "hnsw_sq_qg", "hnsw_lean"):
        cfg = default_routing(method, N, D)
        assert cfg.ef_construction == GRAPH_EF_CONSTRUCTION, method
        built = RoutedIndex.build(x, cfg, train_queries=tq)
        assert graph_of(built.index).hnsw.efConstruction == GRAPH_EF_CONSTRUCTION, method  # the graph FAISS built
    assert default_routing("ivf", N, D).ef_construction == RoutingConfig.ef_construction  # no graph: untouched
    # a coded graph reuses a flat graph only when it was built with the same beam
    pq = default_routing("hnsw_pq", N, D)
    flat = dataclasses.replace(default_routing("hnsw", N, D), hnsw_m=pq.hnsw_m)
    same = RoutedIndex.build(x, flat)
    assert graph_of(RoutedIndex.build(x, pq, graph=same).index).hnsw.efConstruction == GRAPH_EF_CONSTRUCTION
    other = RoutedIndex.build(x, dataclasses.replace(flat, ef_construction=40))
    with pytest.raises(ScalingNoteError, match="ef_construction"):
        RoutedIndex.build(x, pq, graph=other)
