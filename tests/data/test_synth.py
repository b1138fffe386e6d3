"""The synthetic note-search log: determinism, layout, no leakage, vocabulary gap."""

from __future__ import annotations

import hashlib
import warnings

import pytest
from typer.testing import CliRunner

from scalingnote.data import load_beir, load_qrels, load_queries
from scalingnote.data.build import build_triplets, load_build_config
from scalingnote.data.logs import read_click_log, read_relevance_log
from scalingnote.data.synth import SynthConfig, generate, misspell, synthesize
from scalingnote.data.synth_vocab import check_vocabulary, topics

SMALL = dict(num_docs=300, num_queries=120)


def _digest(root) -> dict[str, str]:
    names = [
        "corpus.jsonl",
        "queries.jsonl",
        "qrels/train.tsv",
        "qrels/test.tsv",
        "logs/clicks.tsv",
        "logs/relevance.tsv",
        "build.yaml",
    ]
    return {n: hashlib.sha256((root / n).read_bytes()).hexdigest() for n in names}


def test_deterministic_by_seed(tmp_path):
    synthesize(tmp_path / "a", SynthConfig(seed=7, **SMALL))
    synthesize(tmp_path / "b", SynthConfig(seed=7, **SMALL))
    synthesize(tmp_path / "c", SynthConfig(seed=8, **SMALL))
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    da, dc = _digest(tmp_path / "a"), _digest(tmp_path / "c")
    assert da["corpus.jsonl"] != dc["corpus.jsonl"] and da["logs/clicks.tsv"] != dc["logs/clicks.tsv"]


def test_layout_and_logs_only_for_training_queries(tmp_path):
    log = synthesize(tmp_path, SynthConfig(seed=1, **SMALL))
    ds = load_beir(tmp_path, "test")
    assert len(ds.corpus) == 300 and len(ds.all_queries) == 120
    assert all(d.topic for d in ds.corpus.values())  # BEIR corpus carries the topic field
    test_q = set(load_qrels(tmp_path / "qrels" / "test.tsv"))
    train_q = set(load_qrels(tmp_path / "qrels" / "train.tsv"))
    assert test_q == log.test_ids and not test_q & train_q and len(test_q) == 24
    clicks = read_click_log(tmp_path / "logs" / "clicks.tsv", ds.all_queries, ds.corpus)
    rels = read_relevance_log(tmp_path / "logs" / "relevance.tsv", ds.all_queries, ds.corpus)
    logged = {r.query_id for r in clicks} | {r.query_id for r in rels}
    assert logged and not logged & test_q
    assert any(r.clicked for r in clicks) and not all(r.clicked for r in clicks)
    readme = (tmp_path / "README.md").read_text()
    assert "synthetic" in readme.lower() and "NOT real user data" in readme
    # every query has at least one relevant note (it is built from one)
    assert set(ds.qrels) == test_q and all(max(v.values()) == 2 for v in ds.qrels.values())


def test_position_bias_in_clicks():
    log = generate(SynthConfig(seed=3, num_docs=600, num_queries=300))
    by_pos: dict[int, list[bool]] = {}
    for r in log.clicks:
        by_pos.setdefault(r.position, []).append(r.clicked)
    ctr = {p: sum(v) / len(v) for p, v in by_pos.items()}
    assert ctr[1] > ctr[5] > ctr[10]


def test_vocabulary_gap_synonyms_only_in_queries():
    check_vocabulary()
    tps = topics()
    assert len(tps) >= 30
    synonyms = {s for t in tps for s in t.synonyms.values()}
    log = generate(SynthConfig(seed=0, num_docs=400, num_queries=200, synonym_rate=1.0, typo_rate=0.0))
    doc_words = {w.strip(".,:;!?").lower() for d in log.corpus for w in d.text.split()}
    assert not doc_words & synonyms
    query_words = {w for q in log.queries for w in q.text.split()}
    assert len(query_words & synonyms) > 20
    multi = [v for v in log.meta["intents"].values() if len(v) == 2]
    assert multi  # multi-intent queries exist


def test_misspell_changes_the_word():
    import random

    rng = random.Random(0)
    for w in ("espresso", "grinder", "kettle", "yarn"):
        m = misspell(w, rng)
        assert m != w and abs(len(m) - len(w)) <= 1


def test_generated_build_config_runs_without_leakage(tmp_path):
    synthesize(tmp_path, SynthConfig(seed=2, **SMALL))
    cfg = load_build_config(tmp_path / "build.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no leaked query -> no warning
        res = build_triplets(cfg)
    test_q = set(load_qrels(tmp_path / "qrels" / "test.tsv"))
    assert not {t.query_id for t in res.train + res.validation} & test_q
    assert res.stats["leakage"]["leaked_queries"] == 0
    assert (
        res.stats["sources"]["click_one_hop"]["triplets"] > 0
        and res.stats["sources"]["relevance_one_hop"]["triplets"] > 0
    )
    assert set(load_queries(tmp_path / "queries.jsonl")) >= {t.query_id for t in res.train}


def test_invalid_sizes_rejected():
    with pytest.raises(ValueError, match="num_docs must be >= 50"):
        SynthConfig(num_docs=10)
    with pytest.raises(ValueError, match=r"test_fraction must be in \(0, 1\)"):
        SynthConfig(test_fraction=1.0)


def test_cli_synth(tmp_path):
    import typer

    from scalingnote.cli.data import register

    app = typer.Typer()
    register(app)
    r = CliRunner().invoke(
        app, ["data", "synth", "--out", str(tmp_path), "--seed", "4", "--num-docs", "200", "--num-queries", "60"]
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "build.yaml").exists() and (tmp_path / "logs" / "clicks.tsv").exists()
