"""Ranking metrics: hand-computed cases, conventions, and agreement with pytrec_eval (trec_eval)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import pytrec_eval

from scalingnote.data import load_qrels
from scalingnote.errors import ScalingNoteError
from scalingnote.evaluation import evaluate, evaluate_report, parse_metric, per_query, rank_documents
from scalingnote.sparse.bm25 import bm25_search

ALL = ["ndcg@10", "ndcg@3", "ndcg", "recall@100", "recall@5", "recall", "r@1", "r@10", "r@100",
       "mrr@10", "mrr@3", "mrr", "map", "map@10", "p@5", "p@10"]  # fmt: skip


# --------------------------------------------------------------------------- reference
def reference(run, qrels, metrics, relevance_level=1):
    """Per-query values from pytrec_eval for our metric names, over the queries we evaluate
    (those of run ∩ qrels with at least one relevant document)."""
    ks = {m: parse_metric(m) for m in metrics}
    measures = {"recip_rank", "num_rel_ret", "num_rel"}
    for s in ks.values():
        if s.kind == "ndcg":
            measures.add("ndcg" if s.k is None else f"ndcg_cut.{s.k}")
        elif s.kind == "recall" and s.k is not None:
            measures.add(f"recall.{s.k}")
        elif s.kind == "r":
            measures.add(f"success.{s.k}")
        elif s.kind == "map":
            measures.add("map" if s.k is None else f"map_cut.{s.k}")
        elif s.kind == "p":
            measures.add(f"P.{s.k}")
    ev = pytrec_eval.RelevanceEvaluator(qrels, measures, relevance_level=relevance_level)
    raw = ev.evaluate(run)
    out = {}
    for qid, vals in raw.items():
        if not any(g >= relevance_level for g in qrels[qid].values()):
            continue
        row = {}
        for name, s in ks.items():
            if s.kind == "ndcg":
                row[name] = vals["ndcg" if s.k is None else f"ndcg_cut_{s.k}"]
            elif s.kind == "recall":
                row[name] = vals[f"recall_{s.k}"] if s.k is not None else vals["num_rel_ret"] / vals["num_rel"]
            elif s.kind == "r":
                row[name] = vals[f"success_{s.k}"]
            elif s.kind == "map":
                row[name] = vals["map" if s.k is None else f"map_cut_{s.k}"]
            elif s.kind == "p":
                row[name] = vals[f"P_{s.k}"]
            elif s.kind == "mrr":
                rr = vals["recip_rank"]  # rank of the first relevant doc = 1 / rr
                row[name] = rr if rr > 0 and (s.k is None or round(1 / rr) <= s.k) else 0.0
        out[qid] = row
    return out


def assert_agrees(run, qrels, metrics=ALL, relevance_level=1):
    ours = per_query(run, qrels, metrics, relevance_level=relevance_level)
    ref = reference(run, qrels, metrics, relevance_level)
    assert ours.keys() == ref.keys()
    assert ours, "nothing evaluated"
    for qid in ref:
        for m in metrics:
            assert ours[qid][m] == pytest.approx(ref[qid][m], abs=1e-6), (qid, m, ours[qid][m], ref[qid][m])
    means = evaluate(run, qrels, metrics, relevance_level=relevance_level)
    for m in metrics:
        assert means[m] == pytest.approx(np.mean([ref[q][m] for q in ref]), abs=1e-6), m
    return means


# --------------------------------------------------------------------------- hand-computed
def test_hand_computed_single_query():
    # Ranking: d1 (rel 2), d2 (non), d3 (rel 1), d4 (non); one relevant doc (d9, grade 1) not retrieved.
    qrels = {"q": {"d1": 2, "d3": 1, "d9": 1, "d2": 0}}
    run = {"q": {"d1": 4.0, "d2": 3.0, "d3": 2.0, "d4": 1.0}}
    v = per_query(
        run, qrels, ["r@1", "r@2", "recall@3", "recall", "mrr@10", "p@2", "p@10", "map", "map@2", "ndcg@3", "ndcg"]
    )["q"]
    assert v["r@1"] == 1.0 and v["r@2"] == 1.0
    assert v["recall@3"] == pytest.approx(2 / 3)
    assert v["recall"] == pytest.approx(2 / 3)
    assert v["mrr@10"] == 1.0
    assert v["p@2"] == pytest.approx(0.5)
    assert v["p@10"] == pytest.approx(0.2)  # trec_eval P@K divides by K even if fewer retrieved
    assert v["map"] == pytest.approx((1 / 1 + 2 / 3) / 3)
    assert v["map@2"] == pytest.approx((1 / 1) / 3)
    dcg3 = 2 / math.log2(2) + 1 / math.log2(4)
    idcg3 = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert v["ndcg@3"] == pytest.approx(dcg3 / idcg3)
    assert v["ndcg"] == pytest.approx(dcg3 / idcg3)


def test_r_at_k_is_any_hit_not_fraction():
    # ScalingNote §4.1.2: success if ANY relevant doc is in the top K.
    qrels = {"a": {"x": 1, "y": 1, "z": 1, "w": 1}, "b": {"x": 1}}
    run = {"a": {"x": 3.0, "n1": 2.0, "n2": 1.0}, "b": {"n1": 3.0, "n2": 2.0, "x": 1.0}}
    m = evaluate(run, qrels, ["r@2", "recall@2", "r@3"])
    assert m["r@2"] == pytest.approx(0.5)  # a hits, b misses
    assert m["recall@2"] == pytest.approx((1 / 4 + 0) / 2)
    assert m["r@3"] == 1.0


def test_ties_broken_by_docid_descending_and_float32():
    assert rank_documents({"a": 1.0, "c": 1.0, "b": 1.0, "z": 0.5}) == ["c", "b", "a", "z"]
    # trec_eval stores scores as float32: these two tie, so docid decides ("b" > "a").
    assert rank_documents({"a": 1.0 + 1e-12, "b": 1.0}) == ["b", "a"]
    assert rank_documents({"a": 1.0 + 1e-6, "b": 1.0}) == ["a", "b"]
    qrels = {"q": {"a": 1}}
    assert evaluate({"q": {"a": 1.0 + 1e-12, "b": 1.0}}, qrels, ["mrr"])["mrr"] == 0.5
    assert_agrees({"q": {"a": 1.0 + 1e-12, "b": 1.0, "c": 1.0 + 1e-7}}, qrels)


def test_negative_grades_are_not_relevant_and_give_no_gain():
    qrels = {"q": {"a": -1, "b": 1, "c": 2}}
    run = {"q": {"a": 3.0, "b": 2.0, "c": 1.0}}
    assert_agrees(run, qrels)
    assert per_query(run, qrels, ["mrr"])["q"]["mrr"] == 0.5


def test_query_conventions_and_counts():
    qrels = {
        "rel": {"a": 1},
        "norel": {"a": 0, "b": -1},  # skipped: no relevant document
        "absent": {"a": 1},  # not in the run
        "empty": {"a": 1},  # in the run with no documents -> 0
    }
    run = {"rel": {"a": 1.0}, "norel": {"a": 1.0}, "empty": {}, "extra": {"a": 1.0}}
    rep = evaluate_report(run, qrels, ["ndcg@10", "r@10"])
    assert (rep.num_queries, rep.num_missing, rep.num_no_relevant) == (2, 1, 1)
    assert set(rep.per_query) == {"rel", "empty"}
    assert rep.metrics["ndcg@10"] == pytest.approx(0.5)
    zero = evaluate_report(run, qrels, ["ndcg@10", "r@10"], missing="zero")
    assert zero.num_queries == 3 and zero.per_query["absent"] == {"ndcg@10": 0.0, "r@10": 0.0}
    assert zero.metrics["r@10"] == pytest.approx(1 / 3)
    # pytrec_eval (our reference) also ignores absent queries and scores empty rankings 0
    assert_agrees(run, qrels, ["ndcg@10", "r@10", "map"])


def test_relevance_level():
    qrels = {"q": {"a": 1, "b": 2, "c": 3}, "only_low": {"a": 1}}
    run = {"q": {"a": 3.0, "b": 2.0, "c": 1.0}, "only_low": {"a": 1.0}}
    means = assert_agrees(run, qrels, relevance_level=2)
    assert evaluate(run, qrels, ["mrr"], relevance_level=2)["mrr"] == 0.5
    assert means["mrr"] == 0.5  # "only_low" has nothing relevant at level 2: skipped


def test_metric_names():
    assert parse_metric("NDCG@10").name == "ndcg@10"
    assert parse_metric("precision@5").name == "p@5"
    assert parse_metric("success@100").name == "r@100"
    assert parse_metric("map").k is None
    for bad in ["ndcg@0", "p", "r", "foo@10", "auc@10", "ndcg@x", ""]:
        with pytest.raises(ScalingNoteError):
            parse_metric(bad)
    assert list(evaluate({"q": {"a": 1.0}}, {"q": {"a": 1}}, "map, ndcg@10")) == ["map", "ndcg@10"]


def test_errors():
    with pytest.raises(ScalingNoteError, match="no query of the qrels"):
        evaluate({"x": {"a": 1.0}}, {"q": {"a": 1}})
    with pytest.raises(ScalingNoteError, match="NaN"):
        evaluate({"q": {"a": float("nan")}}, {"q": {"a": 1}})
    with pytest.raises(ScalingNoteError, match="not per query"):
        per_query({"q": {"a": 1.0}}, {"q": {"a": 1}}, ["auc"])


# --------------------------------------------------------------------------- randomised vs pytrec_eval
@pytest.mark.parametrize("seed", range(8))
def test_random_runs_agree_with_pytrec_eval(seed):
    rng = np.random.default_rng(seed)
    docs = [f"d{i}" for i in range(60)]
    qrels, run = {}, {}
    for q in range(25):
        qid = f"q{q}"
        judged = rng.choice(docs, size=rng.integers(1, 12), replace=False)
        qrels[qid] = {str(d): int(rng.integers(-1, 4)) for d in judged}
        if rng.random() < 0.1:
            continue  # absent from the run
        n = int(rng.integers(0, 40))
        ret = rng.choice(docs, size=n, replace=False)
        # coarse scores -> many ties
        run[qid] = {str(d): float(np.round(rng.normal(), 1)) for d in ret}
    assert_agrees(run, qrels)
    assert_agrees(run, qrels, relevance_level=2)


# --------------------------------------------------------------------------- real data
def _corpus_ids(path, limit=None):
    ids = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            ids.append(json.loads(line)["_id"])
            if limit and len(ids) >= limit:
                break
    return ids


def _perturbed_run(qrels, doc_ids, seed, n_random=300, signal=1.0, decimals=2):
    """A real-ish run over real doc ids: judged docs get grade*signal + noise, plus random docs."""
    rng = np.random.default_rng(seed)
    doc_ids = np.asarray(doc_ids)
    run = {}
    for qid, judged in qrels.items():
        cand = set(rng.choice(doc_ids, size=n_random, replace=False).tolist()) | set(judged)
        run[qid] = {
            d: float(np.round(signal * max(judged.get(d, 0), 0) + rng.normal(), decimals)) for d in sorted(cand)
        }
    return run


@pytest.mark.shared_data
def test_scifact_perturbed_runs_agree_with_pytrec_eval(shared_data):
    root = shared_data / "scifact"
    qrels = load_qrels(root / "qrels" / "test.tsv")
    doc_ids = _corpus_ids(root / "corpus.jsonl")
    for seed, signal, decimals in [(0, 1.5, 2), (1, 0.5, 1), (2, 3.0, 6)]:
        run = _perturbed_run(qrels, doc_ids, seed, signal=signal, decimals=decimals)
        means = assert_agrees(run, qrels)
        assert 0 < means["ndcg@10"] < 1


@pytest.mark.shared_data
def test_kuake_graded_runs_agree_with_pytrec_eval(shared_data):
    root = shared_data / "kuake_qtr"
    qrels = load_qrels(root / "qrels_graded" / "test.tsv")
    doc_ids = _corpus_ids(root / "corpus.jsonl", limit=20000)
    run = _perturbed_run(qrels, doc_ids, seed=3, n_random=100, signal=0.7, decimals=1)
    # drop some queries and empty some rankings
    for i, qid in enumerate(sorted(run)):
        if i % 17 == 0:
            del run[qid]
        elif i % 23 == 0:
            run[qid] = {}
    rep = evaluate_report(run, qrels, ["ndcg@10"])
    assert rep.num_no_relevant > 0 and rep.num_missing > 0  # both conventions exercised
    for level in (1, 2, 3):
        assert_agrees(run, qrels, ["ndcg@10", "ndcg", "recall@100", "r@10", "mrr@10", "map", "p@10"], level)


@pytest.mark.shared_data
def test_bm25_scifact_run_agrees_with_pytrec_eval(shared_data):
    run, _ = bm25_search(shared_data / "scifact", "test", k=1000, show_progress=False)
    qrels = load_qrels(shared_data / "scifact" / "qrels" / "test.tsv")
    means = assert_agrees(run, qrels, ["ndcg@10", "recall@100", "r@100", "mrr@10", "map", "p@10"])
    # SPEC reference point for this run (BM25 on SciFact test): nDCG@10 0.686, Recall@100 0.913
    assert means["ndcg@10"] == pytest.approx(0.686, abs=0.005)
    assert means["recall@100"] == pytest.approx(0.913, abs=0.005)
