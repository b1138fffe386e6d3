"""Hybrid lexical + dense search: fusion formulas (hand-computed), weight selection on validation
queries, the BM25 index saved beside the dense index (fingerprinted), titles + snippets stored
with the index, and ``scalingnote search --mode``."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from scalingnote.data import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index.hybrid import (
    FusionConfig,
    HybridSearcher,
    choose_weight,
    fuse_runs,
    hybrid_search_run,
    normalize_scores,
    open_hybrid,
    rrf_scores,
    weighted_scores,
)
from tests.helpers.tiny_data import write_tiny_beir

# ------------------------------------------------------------------ fusion formulas


def test_rrf_matches_hand_computation():
    dense = {"a": 0.9, "b": 0.5, "c": 0.1}
    bm25 = {"c": 12.0, "d": 3.0}
    got = rrf_scores([dense, bm25], k=60)
    want = {"a": 1 / 61, "b": 1 / 62, "c": 1 / 63 + 1 / 61, "d": 1 / 62}
    assert got.keys() == want.keys()
    for d in want:
        assert got[d] == pytest.approx(want[d], rel=1e-12)
    # depth cuts each list before fusing; ties in score are broken by document id
    assert rrf_scores([{"x": 1.0, "y": 1.0, "z": 0.5}], k=0, depth=2) == {"x": 1.0, "y": 0.5}


def test_normalisations():
    s = {"a": 2.0, "b": 4.0, "c": 6.0}
    assert normalize_scores(s, "minmax") == {"a": 0.0, "b": 0.5, "c": 1.0}
    z = normalize_scores(s, "zscore")
    sd = np.std([2.0, 4.0, 6.0])
    assert z["a"] == pytest.approx(-2.0 / sd) and z["b"] == pytest.approx(0.0) and z["c"] == pytest.approx(2.0 / sd)
    assert normalize_scores({"a": 3.0, "b": 3.0}, "minmax") == {"a": 1.0, "b": 1.0}
    assert normalize_scores({"a": 3.0, "b": 3.0}, "zscore") == {"a": 0.0, "b": 0.0}
    with pytest.raises(ScalingNoteError, match="minmax or zscore"):
        normalize_scores(s, "l2")  # type: ignore[arg-type]


def test_weighted_fusion_hand_computed_and_missing_documents_get_the_floor():
    dense = {"a": 0.9, "b": 0.5, "c": 0.1}  # minmax: a 1, b 0.5, c 0; d (unlisted) gets the lowest, 0
    bm25 = {"c": 12.0, "d": 3.0}  # over the candidates a, b, c, d with a, b at BM25's floor 0: c 1, d 0.25, a = b = 0
    got = weighted_scores(dense, bm25, weight=0.7, norm="minmax")
    assert got == pytest.approx({"a": 0.7, "b": 0.35, "c": 0.3, "d": 0.075})
    # weight 1 ranks by dense alone, weight 0 by BM25 alone
    assert max(weighted_scores(dense, bm25, 1.0), key=weighted_scores(dense, bm25, 1.0).get) == "a"
    w0 = weighted_scores(dense, bm25, 0.0)
    assert max(w0, key=w0.get) == "c"
    # z-score: the BM25 side is standardised over every candidate (unlisted ones at 0); a document
    # absent from the dense list gets the dense list's lowest z
    z = weighted_scores(dense, bm25, 0.5, norm="zscore")
    zd = normalize_scores(dense, "zscore")
    zb = normalize_scores({"a": 0.0, "b": 0.0, "c": 12.0, "d": 3.0}, "zscore")
    assert z["a"] == pytest.approx(0.5 * zd["a"] + 0.5 * zb["a"])
    assert z["d"] == pytest.approx(0.5 * min(zd.values()) + 0.5 * zb["d"])


@pytest.mark.parametrize("norm", ["minmax", "zscore"])
@pytest.mark.parametrize("hits", [{"d10": 7.5}, {"d10": 4.0, "d12": 4.0}], ids=["one_hit", "equal_scores"])
def test_a_degenerate_bm25_list_keeps_its_lexical_credit(norm, hits):
    """One BM25 hit (a word only one document holds) or hits of equal score: normalising the BM25
    list alone gave them the value of every unlisted document (z-score of one score is 0), so an
    exact lexical match got no credit and stayed at its dense rank."""
    dense = {f"d{i:02d}" if i < 10 else f"d{i}": 0.5 - 0.001 * i for i in range(20)}  # an uninformative dense side
    fused = weighted_scores(dense, hits, 0.5, norm=norm)
    for hit in hits:
        assert fused[hit] > max(v for doc, v in fused.items() if doc not in hits)  # from dense rank 10/12 to the top
    # a hit the dense list does not hold gets the side's full lexical credit over every non-hit
    fused = weighted_scores(dense, {"new": 7.5}, 0.5, norm=norm)
    zd = normalize_scores(dense, norm)
    lexical_part = {doc: fused[doc] - 0.5 * zd.get(doc, min(zd.values())) for doc in fused}
    assert lexical_part["new"] > max(v for doc, v in lexical_part.items() if doc != "new")
    # an empty BM25 side leaves the dense order as it is
    alone = weighted_scores(dense, {}, 0.7, norm=norm)
    assert sorted(alone, key=lambda doc: -alone[doc]) == list(dense)


def test_fuse_runs_keeps_every_query_and_cuts_at_k():
    dense = {"q1": {"a": 0.9, "b": 0.2}, "q2": {"c": 0.5}}
    bm25 = {"q1": {"b": 5.0}, "q3": {"d": 1.0}}
    run = fuse_runs(dense, bm25, FusionConfig(), k=1)
    assert set(run) == {"q1", "q2", "q3"}
    assert run["q1"] == {"b": pytest.approx(1 / 62 + 1 / 61)} and list(run["q2"]) == ["c"] and list(run["q3"]) == ["d"]


def test_fusion_config_rejects_bad_values():
    for kw, msg in [
        ({"method": "max"}, "rrf or weighted"),
        ({"weight": 1.5}, r"\[0, 1\]"),
        ({"norm": "l2"}, "minmax or zscore"),
        ({"rrf_k": -1}, "rrf_k"),
        ({"depth": 0}, "depth"),
    ]:
        with pytest.raises(ScalingNoteError, match=msg):
            FusionConfig(**kw)


def test_choose_weight_uses_only_the_validation_queries():
    # validation: dense finds the relevant doc at rank 1, BM25 ranks it last -> a dense-heavy weight wins
    dense_val = {f"v{i}": {"rel": 0.9, "x": 0.5, "y": 0.1} for i in range(5)}
    bm25_val = {f"v{i}": {"x": 9.0, "y": 8.0, "rel": 1.0} for i in range(5)}
    qrels_val = {f"v{i}": {"rel": 1} for i in range(5)}
    c = choose_weight(dense_val, bm25_val, qrels_val, norm="minmax", grid=[0.0, 0.25, 0.5, 0.75, 1.0])
    assert c.n_queries == 5 and c.weight >= 0.75 and c.value == pytest.approx(1.0)
    assert c.grid[0.0] < c.grid[1.0]
    # the opposite validation evidence flips the choice
    c2 = choose_weight(bm25_val, dense_val, qrels_val, norm="minmax", grid=[0.0, 0.25, 0.5, 0.75, 1.0])
    assert c2.weight <= 0.25
    # test-only queries in the runs are never looked at
    dense_mixed = {**dense_val, "t1": {"a": 1.0}}
    assert choose_weight(dense_mixed, bm25_val, qrels_val, grid=[0.0, 0.5, 1.0]).n_queries == 5
    with pytest.raises(ScalingNoteError, match="no validation query"):
        choose_weight(dense_val, bm25_val, {"other": {"rel": 1}})


def test_hybrid_search_run_api():
    dense = {"q": {"a": 0.9, "b": 0.5}}
    bm25 = {"q": {"b": 3.0, "c": 1.0}}
    run, info = hybrid_search_run(dense, bm25, "rrf", k=2)
    assert info["fusion"] == "rrf" and info["rrf_k"] == 60 and list(run["q"]) == ["b", "a"]
    run, info = hybrid_search_run(dense, bm25, "weighted", weight=1.0, k=3)
    assert list(run["q"])[0] == "a" and info["weight"] == 1.0
    val = ({"v": {"r": 1.0, "s": 0.0}}, {"v": {"s": 2.0, "r": 1.0}}, {"v": {"r": 1}})
    run, info = hybrid_search_run(dense, bm25, "weighted", validation=val, k=3)
    assert "weight_chosen_on" in info and info["weight"] > 0.5
    with pytest.raises(ScalingNoteError, match="validation"):
        hybrid_search_run(dense, bm25, "weighted")


# ------------------------------------------------------------------ index: titles, BM25 beside it, searcher


@pytest.fixture(scope="module")
def hybrid_env(tmp_path_factory, tiny_bert_dir):
    """A tiny BEIR corpus, its embeddings (which record the corpus path) and a Flat index."""
    from scalingnote.index import build_index
    from scalingnote.index.pipeline import encode_with_tower

    root = tmp_path_factory.mktemp("hybrid")
    beir = write_tiny_beir(root / "toy", docs_per_topic=6)
    encode_with_tower(tiny_bert_dir, beir, root / "emb", shard_size=16, batch_size=16, progress=False)
    idx = build_index(root / "emb", root / "idx", "Flat", semantic_ids_layers=2, codebook_size=4, progress=False)
    corpus = {json.loads(line)["_id"]: json.loads(line) for line in (beir / "corpus.jsonl").read_text().splitlines()}
    return {"root": root, "beir": beir, "index": idx, "corpus": corpus, "tower": tiny_bert_dir}


def test_index_stores_titles_and_snippets_and_search_returns_them(hybrid_env):
    from scalingnote.index import DenseIndex

    idx, corpus = hybrid_env["index"], hybrid_env["corpus"]
    man = json.loads((idx / "manifest.json").read_text())
    assert man["files"]["docs"] == "docs.jsonl" and man["documents"]["n_titles"] == len(corpus)
    di = DenseIndex.open(idx)
    res = di.search(np.asarray(di.vectors[:2]), k=5)
    assert res.titles is not None and res.snippets is not None
    for docs, titles, snippets in zip(res.doc_ids, res.titles, res.snippets, strict=True):
        assert len(docs) == len(titles) == len(snippets) == 5
        for d, t, s in zip(docs, titles, snippets, strict=True):
            assert t == corpus[d]["title"] and s == " ".join(corpus[d]["text"].split())


def test_build_from_array_with_documents_and_attach_later(tmp_path):
    from scalingnote.index import DenseIndex, build_index
    from scalingnote.index.docstore import SNIPPET_CHARS, attach_documents

    long_text = "word " * 200
    docs = [Document("a", "Alpha <b>title</b>", "", long_text), Document("b", "", "", "short text")]
    vecs = np.eye(2, 4, dtype=np.float32)
    idx = build_index(
        vecs, tmp_path / "i1", "Flat", doc_ids=["a", "b"], semantic_ids_layers=0, documents=docs, progress=False
    )
    res = DenseIndex.open(idx).search(vecs[:1], k=2)
    assert res.titles[0] == ["Alpha <b>title</b>", ""]
    snip = res.snippets[0][0]
    assert len(snip) <= SNIPPET_CHARS + 1 and snip.endswith("\u2026") and res.snippets[0][1] == "short text"
    # an index built without documents has none (titles None) until they are attached
    idx2 = build_index(vecs, tmp_path / "i2", "Flat", doc_ids=["a", "b"], semantic_ids_layers=0, progress=False)
    assert DenseIndex.open(idx2).search(vecs[:1], k=1).titles is None
    info = attach_documents(idx2, {"a": docs[0]})
    assert info["n_found"] == 1
    assert DenseIndex.open(idx2).search(vecs[1:2], k=2).titles[0] == ["", "Alpha <b>title</b>"]
    # a store that does not match the index rows is refused with the file and line
    (idx2 / "docs.jsonl").write_text(
        '{"id": "b", "title": "x", "snippet": ""}\n{"id": "a", "title": "", "snippet": ""}\n'
    )
    with pytest.raises(ScalingNoteError, match=r"docs.jsonl: line 1: field 'id'"):
        DenseIndex.open(idx2)


def test_bm25_saved_beside_the_index_reused_while_fingerprint_matches(hybrid_env, tmp_path):
    import shutil

    from scalingnote.sparse.bm25 import BM25Retriever, open_or_build_bm25

    idx = tmp_path / "idx"
    shutil.copytree(hybrid_env["index"], idx)
    beir = hybrid_env["beir"]
    assert open_or_build_bm25(idx) is None  # nothing saved, no corpus given
    bm = open_or_build_bm25(idx, beir, show_progress=False)
    meta = idx / "bm25" / "bm25.json"
    fp, mtime = json.loads(meta.read_text())["fingerprint"], meta.stat().st_mtime_ns
    assert fp == bm.fingerprint and len(fp) == 64
    time.sleep(0.01)
    again = open_or_build_bm25(idx, beir, show_progress=False)  # same corpus: reloaded, not rebuilt
    assert meta.stat().st_mtime_ns == mtime and again.fingerprint == fp
    q = {"q": "quick brown fox"}
    assert again.search(q, k=5, show_progress=False) == bm.search(q, k=5, show_progress=False)
    assert open_or_build_bm25(idx).fingerprint == fp  # reload without a corpus
    # a changed corpus changes the fingerprint: rebuilt
    docs = [Document(d, c["title"], c.get("topic", ""), c["text"] + " extra") for d, c in hybrid_env["corpus"].items()]
    changed = open_or_build_bm25(idx, docs, show_progress=False)
    assert changed.fingerprint != fp and json.loads(meta.read_text())["fingerprint"] == changed.fingerprint
    (meta).write_text("{not json")
    with pytest.raises(ScalingNoteError, match="bm25.json: line 1"):
        BM25Retriever.load(idx / "bm25")


def test_chinese_corpus_uses_character_bigrams(tmp_path):
    from scalingnote.sparse.bm25 import open_or_build_bm25

    docs = [
        Document("d0", "", "", "宝宝发烧怎么办"),
        Document("d1", "", "", "感冒咳嗽吃什么药"),
        Document("d2", "", "", "宝宝咳嗽"),
    ]
    bm = open_or_build_bm25(tmp_path, docs, show_progress=False)
    assert bm.language == "zh"
    run = bm.search({"q": "宝宝发烧"}, k=3, show_progress=False)
    assert max(run["q"], key=run["q"].get) == "d0"


def test_hybrid_searcher_modes(hybrid_env):
    from scalingnote.index.hybrid import fuse_scores

    h = open_hybrid(
        hybrid_env["index"], hybrid_env["tower"], progress=False
    )  # corpus found via the embeddings manifest
    assert h.bm25 is not None and h.modes == ("dense", "bm25", "hybrid")
    q = "quick brown fox"
    dense = h.search([q], 5, mode="dense")
    bm = h.search([q], 5, mode="bm25")
    hy = h.search([q], 5, mode="hybrid")
    ref_bm = h.bm25.search({"q": q}, k=5, show_progress=False)["q"]
    assert bm.doc_ids[0] == list(ref_bm) and np.allclose(bm.scores[0], list(ref_bm.values()))
    d100 = h.dense.search([q], 100)
    b100 = h.bm25.search({"q": q}, k=100, show_progress=False)["q"]
    fused = fuse_scores(dict(zip(d100.doc_ids[0], d100.scores[0].tolist(), strict=False)), b100, FusionConfig())
    want = sorted(fused.items(), key=lambda x: (-x[1], x[0]))[:5]
    assert hy.doc_ids[0] == [d for d, _ in want] and np.allclose(hy.scores[0], [s for _, s in want])
    corpus = hybrid_env["corpus"]
    for res in (dense, bm, hy):
        assert res.titles[0] == [corpus[d]["title"] for d in res.doc_ids[0]]
        assert res.semantic_ids.shape == (1, 5, 2) and (res.semantic_ids >= 0).all()
        assert res.indices[0].tolist() == [h.dense.doc_ids.index(d) for d in res.doc_ids[0]]
    # k beyond the fusion depth: every side is fetched and fused at k, so hybrid returns k hits like dense
    n = len(h.dense.doc_ids)
    small = HybridSearcher(h.dense, h.bm25, FusionConfig(method="weighted", weight=0.7, norm="zscore", depth=5))
    assert len(small.search([q], n, mode="hybrid").doc_ids[0]) == len(h.search([q], n, mode="dense").doc_ids[0]) == n
    # no BM25 index: bm25 / hybrid refused with a clear message
    no_bm = HybridSearcher(h.dense, None)
    with pytest.raises(ScalingNoteError, match="needs a BM25 index"):
        no_bm.search([q], 5, mode="hybrid")
    with pytest.raises(ScalingNoteError, match="mode must be one of"):
        h.search([q], 5, mode="sparse")  # type: ignore[arg-type]


def test_cli_search_modes_and_titles(hybrid_env, tmp_path):
    import shutil

    from scalingnote.cli import app
    from scalingnote.data import read_run

    idx = tmp_path / "idx"
    shutil.copytree(hybrid_env["index"], idx)
    runner = CliRunner()
    r = runner.invoke(app, ["index", "bm25", "--index", str(idx), "--data", str(hybrid_env["beir"])])
    assert r.exit_code == 0, r.output
    assert (idx / "bm25" / "bm25.json").exists()
    r = runner.invoke(
        app,
        [
            "search",
            "--index",
            str(idx),
            "--query-tower",
            str(hybrid_env["tower"]),
            "--query",
            "quick brown fox",
            "--k",
            "3",
            "--mode",
            "hybrid",
        ],
    )
    assert r.exit_code == 0, r.output
    hits = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [h["rank"] for h in hits] == [1, 2, 3]
    for h in hits:
        assert h["title"] == hybrid_env["corpus"][h["doc_id"]]["title"] and h["snippet"] and len(h["semantic_id"]) == 2
    out = tmp_path / "bm25.trec"
    r = runner.invoke(
        app,
        [
            "search",
            "--index",
            str(idx),
            "--mode",
            "bm25",
            "--queries",
            str(hybrid_env["beir"]),
            "--split",
            "test",
            "--out",
            str(out),
            "--k",
            "5",
        ],
    )
    assert r.exit_code == 0, r.output
    run = read_run(out)
    assert len(run) == 6 and all(len(v) <= 5 for v in run.values())
    assert json.loads(out.with_name(out.name + ".meta.json").read_text())["config"]["mode"] == "bm25"
    r = runner.invoke(app, ["search", "--index", str(idx), "--mode", "hybrid", "--query", "fox"])
    assert isinstance(r.exception, ScalingNoteError) and "needs --query-tower" in str(r.exception)
    # no flags: the index's served default (fusion.json), as `scalingnote serve` answers
    (idx / "fusion.json").write_text(
        json.dumps({"method": "weighted", "weight": 0.2, "norm": "zscore", "default_mode": "hybrid"})
    )
    r = runner.invoke(
        app,
        [
            "search",
            "--index",
            str(idx),
            "--query-tower",
            str(hybrid_env["tower"]),
            "--query",
            "quick brown fox",
            "--k",
            "5",
        ],
    )
    assert r.exit_code == 0, r.output
    got = [json.loads(line)["doc_id"] for line in r.stdout.splitlines() if line.startswith("{")]
    served = open_hybrid(
        idx, hybrid_env["tower"], fusion=FusionConfig(method="weighted", weight=0.2, norm="zscore"), progress=False
    )
    assert got == served.search(["quick brown fox"], 5, mode="hybrid").doc_ids[0]
    assert (
        got != served.search(["quick brown fox"], 5, mode="hybrid", fusion=FusionConfig()).doc_ids[0]
    )  # RRF (FusionConfig's default) ranks differently here


def test_every_back_end_is_a_searcher_with_the_shared_search_run(hybrid_env):
    """DenseIndex, BM25 and hybrid answer the one Searcher interface; search_run (one shared
    implementation) gives the run that per-query search gives, batch size aside."""
    from scalingnote.index import BM25Searcher, DenseIndex, Searcher

    h = open_hybrid(hybrid_env["index"], hybrid_env["tower"], progress=False)
    bm = BM25Searcher(h.bm25)
    dense = DenseIndex.open(hybrid_env["index"], query_tower=h.dense.query_tower)
    texts = ["quick brown fox", "lazy dog sleeps", "zzzz-no-such-term", "fox dog"]
    qids = [f"q{i}" for i in range(len(texts))]
    for searcher, kw in ((dense, {}), (bm, {}), (h, {"mode": "hybrid"}), (h, {"mode": "bm25"})):
        assert isinstance(searcher, Searcher)
        one_by_one = {}
        for qid, t in zip(qids, texts, strict=True):
            one_by_one.update(searcher.search([t], 7, **kw).to_run([qid]))
        for bs in (1, 3):
            got = searcher.search_run(qids, texts, k=7, batch_size=bs, **kw)
            assert got.keys() == one_by_one.keys()
            # batched query encoding may differ in the last float bits; under RRF (rank-based) that can
            # swap two near-tied dense neighbours, which moves their fused scores by one rank step
            # (1/(60+r) - 1/(61+r) < 3e-4), not by a float-rounding amount
            atol = 3e-4 if kw.get("mode") == "hybrid" else 1e-5
            for q in qids:
                assert list(got[q]) == list(one_by_one[q]) or sorted(got[q]) == sorted(one_by_one[q])
                assert np.allclose(sorted(got[q].values()), sorted(one_by_one[q].values()), rtol=0, atol=atol)
    # BM25 through the interface: the retriever's own ranking, rows of its doc ids, no unknown-term hits
    ref = h.bm25.search({"q": "quick brown fox"}, k=7, show_progress=False)["q"]
    res = bm.search(["quick brown fox"], 7)
    assert res.doc_ids[0] == sorted(ref, key=lambda d: (-ref[d], d)) and res.semantic_ids is None
    assert [bm.doc_ids[i] for i in res.indices[0] if i >= 0] == res.doc_ids[0]
    assert bm.search(["zzzz-no-such-term"], 3).doc_ids == [[]]
    with pytest.raises(ScalingNoteError, match="query texts, not vectors"):
        bm.search(np.zeros((1, 4), np.float32), 3)
    with pytest.raises(ScalingNoteError, match="takes no nprobe"):
        bm.search(["fox"], 3, nprobe=4)
