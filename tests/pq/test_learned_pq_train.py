"""TMJ training end to end on a tiny BEIR set with a tiny random BERT: phases, resume, export, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import typer
import yaml
from typer.testing import CliRunner

from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.pq import LearnedPQ, TMJTrainer, load_pq_config
from scalingnote.pq.encoders import load_doc_features, projectionless_fingerprint
from tests.helpers.curves import read_scalars, steps
from tests.helpers.tiny_data import write_tiny_beir


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    return write_tiny_beir(tmp_path_factory.mktemp("tmj") / "beir", docs_per_topic=8)


def _cfg_dict(beir, model, out) -> dict:
    return {
        "data": {"data_dir": str(beir), "validation_fraction": 0.1},
        "output_dir": str(out),
        "towers": {
            "query_model": str(model),
            "doc_model": str(model),
            "dim": 16,
            "query_max_length": 16,
            "doc_max_length": 32,
        },
        "pq": {"m": 4, "nbits": 3, "init": "opq", "niter": 5, "opq_niter": 2},
        "warmup": {"steps": 6, "batch_size": 8, "num_negatives": 3},
        "stage1": {"steps": 10, "batch_size": 8, "num_negatives": 3, "neg_depth": 20},
        "stage2": {"steps": 8, "batch_size": 8, "num_negatives": 3, "mine_every": 4, "mine_depth": 20, "head_lr": 1e-3},
        "export": {"indexes": ["PQ", "IVF4,PQ", "HNSW8,PQ"]},
        "save_every": 5,
        "show_progress": False,
    }


def _final(out):
    pq = LearnedPQ.load(out / "learned_pq.npz")
    from scalingnote.models import load_tower

    return pq, load_tower(out / "query_tower"), load_tower(out / "doc_tower")


def test_trainer_runs_every_phase_and_resumes_exactly(beir, tiny_bert_dir, tmp_path):
    cfg_a = load_pq_config(_cfg_dict(beir, tiny_bert_dir, tmp_path / "a"))
    res_a = TMJTrainer(cfg_a).run()
    out = tmp_path / "a"
    for f in (
        "config.yaml",
        "run.json",
        "metrics.jsonl",
        "learned_pq.npz",
        "query_tower/tower.json",
        "doc_tower/tower.json",
        "pq_init.npz",
    ):
        assert (out / f).exists(), f
    for kind in ("pq", "ivf4_pq", "hnsw8_pq"):
        man = json.loads((out / "indexes" / kind / "manifest.json").read_text())
        assert man["learned_pq"]["m"] == 4 and man["n_vectors"] == 48
        assert f"served_{kind}_ndcg@10" in res_a["export"]
    for phase in ("warmup", "stage1", "stage2"):
        assert (out / phase / "final.pt").exists()
        assert res_a[phase]["steps"] == cfg_a.__getattribute__(phase).steps
    assert {"dense_ndcg@10", "pq_ndcg@10", "val_pq_ndcg@10"} <= set(res_a["stage2"])
    # the exported flat PQ index (FAISS) ranks exactly as the learned codebooks did in stage 2
    assert res_a["export"]["served_pq_ndcg@10"] == pytest.approx(res_a["stage2"]["pq_ndcg@10"], abs=1e-5)
    run = json.loads((out / "run.json").read_text())
    assert run["metrics"]["stage1"]["loss"] == "l1" and "versions" in run and "machine" in run
    logs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("event") == "mined" for r in logs)  # stage 2 re-mined (steps 0 and 4)
    assert sum(1 for r in logs if r.get("event") == "mined") == 2

    # stage 2 froze the document tower and trained the query tower and the centroids
    s1 = torch.load(out / "stage1" / "final.pt", weights_only=False)["snapshot"]
    s2 = torch.load(out / "stage2" / "final.pt", weights_only=False)["snapshot"]
    assert torch.equal(s1["doc"]["projection.weight"], s2["doc"]["projection.weight"])
    assert not torch.equal(s1["query"]["projection.weight"], s2["query"]["projection.weight"])
    assert not torch.equal(s1["pq"]["codebooks"], s2["pq"]["codebooks"])
    # backbones stayed frozen (only the projections are saved as trainable)
    assert set(s2["query"]) == {"projection.weight"}

    # interrupted in stage 1, then resumed: same final model as the uninterrupted run
    cfg_b = load_pq_config(_cfg_dict(beir, tiny_bert_dir, tmp_path / "b"))
    tb = TMJTrainer(cfg_b)

    def stop(phase, step):
        if phase == "stage1" and step == 7:
            raise KeyboardInterrupt

    tb.on_step = stop
    with pytest.raises(KeyboardInterrupt):
        tb.run()
    assert (tmp_path / "b" / "stage1" / "checkpoints" / "step-00000007").exists()
    assert not (tmp_path / "b" / "stage1" / "final.pt").exists()
    res_b = TMJTrainer(cfg_b).run()
    assert res_b["warmup"]["resumed_finished"] is True
    pa, qa, da = _final(tmp_path / "a")
    pb, qb, db = _final(tmp_path / "b")
    torch.testing.assert_close(pa.codebooks, pb.codebooks, atol=1e-6, rtol=0)
    torch.testing.assert_close(qa.projection.weight, qb.projection.weight, atol=1e-6, rtol=0)
    torch.testing.assert_close(da.projection.weight, db.projection.weight, atol=1e-6, rtol=0)
    assert res_b["stage2"]["pq_ndcg@10"] == pytest.approx(res_a["stage2"]["pq_ndcg@10"], abs=1e-6)
    assert qa.compat_id == da.compat_id  # paired towers: the exported index accepts this query tower
    # the curves: one TensorBoard run per phase (<out>/<phase>/), every step once, the interrupted
    # and resumed stage 1 the same curve as the uninterrupted one
    for phase in ("warmup", "stage1", "stage2"):
        sa, sb = read_scalars(tmp_path / "a" / phase), read_scalars(tmp_path / "b" / phase)
        assert {"train/loss", "train/lr", "throughput/examples_per_s"} <= set(sa), phase
        assert (
            steps(sa["train/loss"])
            == steps(sb["train/loss"])
            == list(range(1, cfg_a.__getattribute__(phase).steps + 1))
        )
        assert [v for _, v in sb["train/loss"]] == pytest.approx([v for _, v in sa["train/loss"]], abs=1e-5)


def test_l0_and_pq_init_and_reuse_of_features(beir, tiny_bert_dir, tmp_path):
    d = _cfg_dict(beir, tiny_bert_dir, tmp_path / "l0")
    d["stage1"]["loss"] = "l0"
    d["stage2"]["steps"] = 0
    d["warmup"]["steps"] = 0
    d["pq"]["init"] = "pq"
    d["export"]["indexes"] = ["PQ"]
    t = TMJTrainer(load_pq_config(d))
    res = t.run()
    assert res["stage1"]["loss"] == "l0" and "stage2" not in res and "warmup" not in res
    assert res["pq_init"]["rotation"] is False
    # the document features are the projection-less tower's embeddings: an index encoded with
    # that tower is accepted, another model's is refused
    from scalingnote.index import encode_corpus
    from scalingnote.models import load_tower

    zs = load_tower(tiny_bert_dir, "document", dim=None, max_doc_length=32)
    assert zs.fingerprint == projectionless_fingerprint(t.d_tower)
    encode_corpus(zs, t.data.docs, tmp_path / "zs", progress=False)
    feats = load_doc_features(
        t.d_tower, t.data.docs, tmp_path / "unused", source_dir=tmp_path / "zs", show_progress=False
    )
    np.testing.assert_allclose(
        feats, t.d_side.features.numpy() / np.linalg.norm(t.d_side.features.numpy(), axis=1, keepdims=True), atol=1e-5
    )
    other = load_tower(tiny_bert_dir, "document", dim=None, max_doc_length=24)
    encode_corpus(other, t.data.docs, tmp_path / "other", progress=False)
    with pytest.raises(ScalingNoteError, match="fingerprint"):
        load_doc_features(
            t.d_tower, t.data.docs, tmp_path / "unused", source_dir=tmp_path / "other", show_progress=False
        )


def test_cli_pq_train_and_config_errors(beir, tiny_bert_dir, tmp_path):
    from scalingnote.cli.pq import register

    app = typer.Typer()
    register(app)
    d = _cfg_dict(beir, tiny_bert_dir, tmp_path / "cli")
    d["warmup"]["steps"] = 0
    d["stage1"]["steps"] = 3
    d["stage2"]["steps"] = 2
    d["export"]["indexes"] = ["HNSW8,PQ"]
    path = tmp_path / "tmj.yaml"
    path.write_text(yaml.safe_dump(d), encoding="utf-8")
    r = CliRunner().invoke(app, ["pq", "train", "--config", str(path), "--set", "stage1.loss=l0", "--seed", "3"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["stage1"]["loss"] == "l0" and "served_hnsw8_pq_ndcg@10" in res["export"]
    saved = yaml.safe_load((tmp_path / "cli" / "config.yaml").read_text())
    assert saved["seed"] == 3 and saved["stage1"]["loss"] == "l0"
    # a typo is an error naming the file, line and key
    bad = path.read_text().replace("mine_every:", "mine_evry:")
    path.write_text(bad, encoding="utf-8")
    with pytest.raises(ConfigError) as ei:
        load_pq_config(path)
    msg = str(ei.value)
    assert "tmj.yaml" in msg and "mine_evry" in msg and "line" in msg


def test_cached_features_give_the_towers_own_embeddings(tiny_bert_dir, tiny_corpus, tmp_path):
    """Frozen-backbone training uses project(features): it must equal the tower's own encoding,
    also with a non-zero projection centre (raw features are cached, not normalised ones)."""
    from scalingnote.models import load_tower
    from scalingnote.pq.encoders import Side, load_query_features, pooled_features

    d = load_tower(tiny_bert_dir, "document", dim=16, max_doc_length=32)
    q = load_tower(tiny_bert_dir, "query", dim=16, max_query_length=16)
    g = torch.Generator().manual_seed(0)
    d.set_center(torch.randn(d.config.hidden_size, generator=g))
    docs = tiny_corpus[:20]
    feats = load_doc_features(d, docs, tmp_path / "docf", show_progress=False)
    np.testing.assert_allclose(feats, pooled_features(d, docs), atol=1e-5)
    side = Side(d, docs, feats)
    np.testing.assert_allclose(side.encode(), d.encode_documents(docs, show_progress=False), atol=1e-5)
    assert not any(p.requires_grad for p in d.backbone.parameters())
    texts = ["vitamin deficiency", "dense retrieval vector", "gene therapy trial"]
    qf = load_query_features(q, texts, tmp_path / "q.npy", show_progress=False)
    again = load_query_features(q, texts, tmp_path / "q.npy", show_progress=False)  # cache hit
    np.testing.assert_array_equal(qf, again)
    np.testing.assert_allclose(Side(q, texts, qf).encode(), q.encode_queries(texts, show_progress=False), atol=1e-5)
    # normalised (zero-shot) embeddings cannot stand for the features of a centred tower
    from scalingnote.index import encode_corpus

    zs = load_tower(tiny_bert_dir, "document", dim=None, max_doc_length=32)
    encode_corpus(zs, docs, tmp_path / "zs", progress=False)
    with pytest.raises(ScalingNoteError, match="centre"):
        load_doc_features(d, docs, tmp_path / "x", source_dir=tmp_path / "zs", show_progress=False)
