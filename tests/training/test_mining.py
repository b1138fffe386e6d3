"""Dense-mined hard negatives on a tiny corpus with a tiny random tower: the window, the cache,
the audit file and its CLI table, ``mixed``; the guard measured on a constructed case."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import scalingnote.training.mining as mining
from scalingnote.cli.data import data_app
from scalingnote.config import load_config
from scalingnote.data import Document, load_corpus, load_qrels, load_queries, load_triplets
from scalingnote.models import build_tiny_model, load_tower_pair
from scalingnote.sparse.bm25 import BM25Retriever
from scalingnote.training import TrainConfig
from scalingnote.training.audit import read_audit
from scalingnote.training.config import DataSpec, MiningSpec
from scalingnote.training.data import load_training_data
from scalingnote.training.guard import Candidate, MinedQuery, apply_guard, guard_counts
from scalingnote.training.guard_eval import hide_positives, measure_guard
from tests.helpers.tiny_data import write_tiny_beir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_mining")
    bert = build_tiny_model(root / "bert", "bert", num_layers=2)
    qt, dt = load_tower_pair(str(bert), dim=32)
    qt.save(root / "run" / "query_tower")  # a Stage I run directory as mining tower
    dt.save(root / "run" / "doc_tower")
    return {"run": str(root / "run"), "data": str(write_tiny_beir(root / "beir")), "root": root}


def _positives(data_dir):
    qrels = load_qrels(f"{data_dir}/qrels/train.tsv")
    return {q: [d for d, g in docs.items() if g > 0] for q, docs in qrels.items()}


def _dense_windows(run, data_dir, k, t, eps=1e-5):
    """The dense window of every training query, recomputed in NumPy from the saved towers: the
    documents whose score lies within that of ranks k+1 .. t (ties at the edges count as inside)."""
    qt, dt = mining.load_mining_towers(run)
    queries = {q.id: q.text for q in load_queries(f"{data_dir}/queries.jsonl").values()}
    corpus = load_corpus(data_dir)
    ids = list(corpus)
    d = dt.encode_documents(list(corpus.values()), show_progress=False)
    pos = _positives(data_dir)
    qids = sorted(pos)
    q = qt.encode_queries([queries[x] for x in qids], show_progress=False)
    s = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (d / np.linalg.norm(d, axis=1, keepdims=True)).T
    out = {}
    for i, qid in enumerate(qids):
        ranked = np.sort(s[i])[::-1]
        hi, lo = ranked[k] + eps, ranked[t - 1] - eps
        out[qid] = [ids[j] for j in range(len(ids)) if lo <= s[i, j] <= hi and ids[j] not in pos[qid]]
    return out


def _spec(tiny, tmp_path, **kw):
    mine = {"tower": tiny["run"], "cache_dir": str(tmp_path / "cache"), "audit_queries": 5, **kw.pop("mining", {})}
    return DataSpec(
        tiny["data"], neg_skip_top=2, neg_max_rank=12, validation_fraction=0.0, mining=MiningSpec(**mine), **kw
    )


def test_dense_negatives_come_from_the_towers_window_and_the_cache_is_reused(tiny, tmp_path, monkeypatch):
    spec = _spec(tiny, tmp_path, negatives="dense", num_negatives=3)
    data = load_training_data(spec, seed=1, show_progress=False, out_dir=tmp_path / "run1")
    windows = _dense_windows(tiny["run"], tiny["data"], 2, 12)
    assert data.train and all(len(e.negs) == 3 and len({d.id for d in e.negs}) == 3 for e in data.train)
    for e in data.train:
        assert {d.id for d in e.negs} <= set(windows[e.query_id]), e.query_id
    assert data.mining["examples"] == len(data.train) and data.mining["dropped"] == 0
    # the mined triplets: data-build JSONL (one line per negative) in a cache keyed by tower + settings
    (cached,) = list((tmp_path / "cache").iterdir())
    lines = load_triplets(cached / "triplets.jsonl")
    assert len(lines) == 3 * len(data.train) and {t.source for t in lines} == {"dense"}
    # a rerun reuses them: mining is not called again, the examples are the same
    monkeypatch.setattr(mining, "mine_windows", lambda *a, **k: pytest.fail("mined again"))
    again = load_training_data(spec, seed=1, show_progress=False, out_dir=tmp_path / "run2")
    assert [(e.query_id, e.pos.id, [d.id for d in e.negs]) for e in again.train] == [
        (e.query_id, e.pos.id, [d.id for d in e.negs]) for e in data.train
    ]
    assert (tmp_path / "run2" / "mining_audit.jsonl").is_file()
    # other settings (here the window) are another cache entry
    monkeypatch.undo()
    load_training_data(
        _spec(tiny, tmp_path, negatives="dense", num_negatives=3, mining={"skip_top": 3}), seed=1, show_progress=False
    )
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_mixed_draws_from_the_union_of_the_bm25_and_dense_windows(tiny, tmp_path):
    spec = _spec(tiny, tmp_path, negatives="mixed", num_negatives=2)
    data = load_training_data(spec, seed=0, show_progress=False)
    dense = _dense_windows(tiny["run"], tiny["data"], 2, 12)
    queries = {q.id: q.text for q in load_queries(f"{tiny['data']}/queries.jsonl").values()}
    pos = _positives(tiny["data"])
    run = BM25Retriever.fit(data.corpus.values(), show_progress=False).search(
        {q: queries[q] for q in pos}, k=12, show_progress=False
    )
    for e in data.train:
        bm = [d for d, _ in sorted(run[e.query_id].items(), key=lambda x: (-x[1], x[0]))][2:12]
        assert {d.id for d in e.negs} <= (set(dense[e.query_id]) | set(bm)) - set(pos[e.query_id])
    assert {e.source for e in data.train} == {"mixed"}


def test_audit_file_lines_and_cli_table(tiny, tmp_path):
    spec = _spec(tiny, tmp_path, negatives="dense", mining={"guard": ["near_positive"], "guard_margin": 0.3})
    load_training_data(spec, seed=0, show_progress=False, out_dir=tmp_path / "run")
    records, summary = read_audit(tmp_path / "run")
    assert len({r["query_id"] for r in records}) == 5  # audit_queries
    for r in records:
        assert r["query"] and r["candidate"] and r["positive"] and r["rule"] in ("kept", "near_positive")
        assert (r["rule"] == "near_positive") == (r["dense"] >= r["positive_score"] - 0.3 - 1e-4)
    assert (
        summary["dropped"] == summary["by_rule"].get("near_positive", 0)
        and summary["candidates"] == summary["kept"] + summary["dropped"]
    )
    assert summary["dropped"] > 0 and summary["mining_seconds"] >= 0
    res = CliRunner().invoke(data_app, ["audit", str(tmp_path / "run"), "--limit", "3"])
    assert res.exit_code == 0, res.output
    assert "mined candidates" in res.output and "summary" in res.output and "near_positive" in res.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "candidate"}\nnot json\n', encoding="utf-8")
    with pytest.raises(Exception, match="bad.jsonl.*line 2|line 2"):
        read_audit(bad)


def test_dense_needs_a_mining_tower_named_in_the_config_error(tiny, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data:\n  data_dir: {tiny['data']}\n  negatives: dense\n", encoding="utf-8")
    with pytest.raises(Exception, match="mining.tower"):
        load_config(TrainConfig, cfg)
    with pytest.raises(Exception, match="data.triplets carry their own negatives"):
        DataSpec(tiny["data"], triplets="t.jsonl", negatives="dense", mining=MiningSpec(tower=tiny["run"]))
    with pytest.raises(Exception, match="unknown rule 'nope'"):
        MiningSpec(guard=["nope"])


class _Fixed:
    """A tower stand-in with known vectors (queries by text, documents by id)."""

    def __init__(self, vecs):
        self.vecs = vecs

    def encode_queries(self, texts, **_):
        return np.array([self.vecs[t] for t in texts], dtype=np.float32)

    def encode_documents(self, docs, **_):
        return np.array([self.vecs[d.id] for d in docs], dtype=np.float32)


def test_guard_measurement_on_a_constructed_case():
    """Query q has positives p1, p2, p3; p2 and p3 are hidden. The tower scores p2 just below the
    labelled p1 (the near_positive rule must catch it), p3 far below (it cannot), and one true
    negative n0 also within the margin (a true negative the guard removes)."""
    angle = {"p1": 0.0, "p2": 0.1, "n0": 0.12, "p3": 1.2, **{f"n{i}": 0.9 + 0.05 * i for i in range(1, 9)}}
    vecs = {k: [np.cos(a), np.sin(a)] for k, a in angle.items()}
    vecs["q text"] = [1.0, 0.0]
    corpus = {k: Document(k, "", "", k) for k in angle}
    tower = _Fixed(vecs)
    positives = {"q": ["p1", "p2", "p3"]}
    spec = DataSpec(
        "unused",
        negatives="dense",
        neg_skip_top=0,
        neg_max_rank=12,
        mining=MiningSpec(tower="x", guard=["near_positive"], guard_margin=0.02),
    )
    known, hidden = hide_positives(positives, 0.5, seed=0)  # round(1.5) = 2 of 3 hidden
    assert len(known["q"]) == 1 and len(hidden["q"]) == 2
    # pin which ones are hidden for the known answer: hide p2 and p3
    mined, _, _ = mining.mine_windows(spec, corpus, {"q": "q text"}, {"q": ["p1"]}, tower, tower)
    got = guard_counts(mined, {"q": {"p2", "p3"}}, {"q": {"p1", "p2", "p3"}})
    # cos(0.1) = 0.995, cos(0.12) = 0.9928 >= 1 - 0.02; cos(1.2) = 0.36 is not
    assert got["hidden_in_window"] == 2 and got["hidden_removed_by_guard"] == 1 and got["guard_recall"] == 0.5
    assert got["true_negatives_in_window"] == 9 and got["true_negatives_removed"] == 1
    assert got["fn_rate_unguarded"] == round(2 / 11, 4) and got["fn_rate_guarded"] == round(1 / 9, 4)
    unguarded = DataSpec("unused", negatives="dense", neg_skip_top=0, neg_max_rank=12, mining=MiningSpec(tower="x"))
    m = measure_guard(unguarded, corpus, {"q": "q text"}, positives, tower, tower, fraction=0.5, seed=0)
    assert m["queries_measured"] == 1 and m["hidden_in_window"] == 2 and m["hidden_removed_by_guard"] == 0


class _Counting(_Fixed):
    """A fixed tower that counts the documents it encodes."""

    encoded = 0

    def encode_documents(self, docs, **kw):
        self.encoded += len(docs)
        return super().encode_documents(docs, **kw)


def test_stored_corpus_embeddings_are_used_only_when_they_match(tmp_path):
    """Mining reuses the mining run's own ``doc_embeddings.npy`` (another order of the same
    documents is fine), checked on a sample; embeddings from other towers or another corpus are
    not used: the corpus is encoded instead."""
    rng = np.random.default_rng(0)
    ids = [f"d{i}" for i in range(40)]
    vecs = {d: rng.standard_normal(4).tolist() for d in ids}
    vecs["q text"] = vecs["d3"]
    corpus = {d: Document(d, "", "", d) for d in ids}
    run = tmp_path / "run"
    run.mkdir()
    order = ids[::-1]
    np.save(
        run / "doc_embeddings.npy", 3.0 * np.array([vecs[d] for d in order], dtype=np.float32)
    )  # unnormalised, as saved
    (run / "doc_ids.json").write_text(json.dumps(order))
    spec = DataSpec("unused", negatives="dense", neg_skip_top=0, neg_max_rank=5, mining=MiningSpec(tower=str(run)))
    tower = _Counting(vecs)
    mined, _, source = mining.mine_windows(spec, corpus, {"q": "q text"}, {"q": ["d3"]}, tower, tower, tower_dir=run)
    assert source == "stored" and tower.encoded == mining.STORED_SAMPLE
    assert [c.doc_id for c in mined[0].candidates] == [
        c.doc_id
        for c in mining.mine_windows(spec, corpus, {"q": "q text"}, {"q": ["d3"]}, _Fixed(vecs), _Fixed(vecs))[0][
            0
        ].candidates
    ]
    other = _Counting({**vecs, "d7": [-x for x in vecs["d7"]]})  # towers changed after the run stored its embeddings
    for i in range(40):  # make sure the sample meets the changed document
        other.vecs[f"d{i}"] = [-x for x in vecs[f"d{i}"]] if i % 2 else vecs[f"d{i}"]
    assert (
        mining.mine_windows(spec, corpus, {"q": "q text"}, {"q": ["d3"]}, other, other, tower_dir=run)[2] == "encoded"
    )
    assert other.encoded == mining.STORED_SAMPLE + len(ids)
    fewer = {d: corpus[d] for d in ids[:-1]}  # another corpus
    assert mining.stored_doc_embeddings(run, tower, fewer) is None
    assert mining.stored_doc_embeddings(None, tower, corpus) is None


def test_agree_top_rule():
    mq = MinedQuery(
        "q",
        [Candidate("a", 0.5, 3, 9.0, 2), Candidate("b", 0.4, 3, 1.0, 40), Candidate("c", 0.3, 50, 8.0, 1)],
        {"p": 0.9},
    )
    apply_guard([mq], MiningSpec(guard=["agree_top", "near_positive"], guard_top_r=5, guard_margin=0.1))
    assert [c.rule for c in mq.candidates] == ["agree_top", "kept", "kept"]


def test_stage1_trains_on_dense_negatives_and_writes_the_audit_beside_the_run(tiny, tmp_path):
    from scalingnote.training import train

    bert = str(tiny["root"] / "bert")
    cfg = load_config(
        TrainConfig,
        {
            "method": "twinbert",
            "output_dir": str(tmp_path / "run"),
            "dim": 32,
            "loss": {"dims": [16, 32]},
            "query_tower": {"model": bert, "max_length": 16},
            "doc_tower": {"model": bert, "max_length": 48},
            "data": {
                "data_dir": tiny["data"],
                "neg_skip_top": 2,
                "neg_max_rank": 12,
                "validation_fraction": 0.0,
                "negatives": "dense",
                "num_negatives": 2,
                "mining": {"tower": tiny["run"], "guard": ["agree_top"], "guard_top_r": 3},
            },
            "optim": {"batch_size": 8, "max_steps": 2, "lr": 1e-3},
            "log_every": 1,
            "show_progress": False,
        },
    )
    res = train(cfg)
    assert res["mining"]["examples"] == res["train_examples"] and res["mining"]["cache"].startswith(
        str(tmp_path / "run")
    )
    records, summary = read_audit(tmp_path / "run" / "mining_audit.jsonl")
    assert records and summary["by_rule"] == res["mining"]["by_rule"] and summary["examples_without_negative"] == 0, (
        summary
    )
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("loss_hard", 0) > 0 for r in logged)


def test_a_window_the_guard_empties_falls_back_to_the_bm25_window(tiny, tmp_path):
    spec = _spec(
        tiny, tmp_path, negatives="dense", num_negatives=2, mining={"guard": ["near_positive"], "guard_margin": 10.0}
    )
    data = load_training_data(spec, seed=0, show_progress=False)
    queries = {q.id: q.text for q in load_queries(f"{tiny['data']}/queries.jsonl").values()}
    pos = _positives(tiny["data"])
    run = BM25Retriever.fit(data.corpus.values(), show_progress=False).search(
        {q: queries[q] for q in pos}, k=12, show_progress=False
    )
    assert data.mining["kept"] == 0 and data.mining["examples_bm25_fallback"] == len(data.train)
    for e in data.train:
        bm = [d for d, _ in sorted(run[e.query_id].items(), key=lambda x: (-x[1], x[0]))][2:12]
        assert e.source == "bm25_fallback" and {d.id for d in e.negs} <= set(bm) - set(pos[e.query_id])
