"""``scalingnote index encode|build|info`` and ``scalingnote search`` end to end with a tiny tower."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from scalingnote.errors import ScalingNoteError


@pytest.fixture(scope="module")
def cli():
    from scalingnote.cli.index import register

    app = typer.Typer()
    register(app)
    return app


@pytest.fixture(scope="module")
def beir_dir(tmp_path_factory, tiny_corpus, queries_factory):
    from scalingnote.data import write_beir

    root = tmp_path_factory.mktemp("beir") / "toy"
    queries = queries_factory(12)
    qrels = {q.id: {tiny_corpus[i * 3].id: 1} for i, q in enumerate(queries)}
    write_beir(root, tiny_corpus, queries, {"test": qrels})
    return root


def test_encode_build_info_search(cli, tmp_path, beir_dir, tiny_bert_dir, other_bert_dir):
    from scalingnote.data import read_run

    runner = CliRunner()
    emb, idx, run = tmp_path / "emb", tmp_path / "idx", tmp_path / "run.trec"
    r = runner.invoke(
        cli,
        [
            "index",
            "encode",
            "--tower",
            str(tiny_bert_dir),
            "--data",
            str(beir_dir),
            "--out",
            str(emb),
            "--shard-size",
            "16",
            "--batch-size",
            "8",
        ],
    )
    assert r.exit_code == 0, r.output
    assert json.loads((emb / "manifest.json").read_text())["n_docs"] == 60

    r = runner.invoke(
        cli,
        [
            "index",
            "build",
            "--embeddings",
            str(emb),
            "--factory",
            "IVF4,PQ8x4",
            "--out",
            str(idx),
            "--semantic-ids-layers",
            "3",
            "--codebook-size",
            "8",
            "--seed",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["index", "info", str(idx)])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["factory"] == "IVF4,PQ8x4" and info["n_vectors"] == 60 and info["seed"] == 1
    assert info["semantic_ids"]["n_layers"] == 3
    r = runner.invoke(cli, ["index", "info", str(emb)])
    assert r.exit_code == 0 and json.loads(r.stdout)["n_shards"] == 4

    r = runner.invoke(
        cli,
        [
            "search",
            "--index",
            str(idx),
            "--query-tower",
            str(tiny_bert_dir),
            "--queries",
            str(beir_dir),
            "--split",
            "test",
            "--out",
            str(run),
            "--k",
            "10",
            "--rerank",
            "30",
            "--nprobe",
            "4",
        ],
    )
    assert r.exit_code == 0, r.output
    got = read_run(run)
    assert len(got) == 12 and all(len(v) == 10 for v in got.values())
    meta = json.loads((tmp_path / "run.trec.meta.json").read_text())
    assert meta["config"]["rerank"] == 30 and meta["timings"]["search_qps"] > 0 and "faiss-cpu" in meta["versions"]

    # `index tune` chooses nprobe / re-rank on the queries and writes them as the search defaults
    r = runner.invoke(
        cli,
        [
            "index",
            "tune",
            "--index",
            str(idx),
            "--query-tower",
            str(tiny_bert_dir),
            "--queries",
            str(beir_dir),
            "--split",
            "test",
            "--target",
            "0.9",
        ],
    )
    assert r.exit_code == 0, r.output
    man = json.loads((idx / "manifest.json").read_text())
    chosen = man["search_tuning"]["chosen"]
    assert (
        chosen["recall"] >= 0.9
        and man["search_defaults"]["nprobe"] == chosen["nprobe"]
        and "recall@10 vs exact" in r.output
    )

    # a queries.jsonl file works too
    r = runner.invoke(
        cli,
        [
            "search",
            "--index",
            str(idx),
            "--query-tower",
            str(tiny_bert_dir),
            "--queries",
            str(beir_dir / "queries.jsonl"),
            "--out",
            str(tmp_path / "run2.trec"),
            "--k",
            "5",
        ],
    )
    assert r.exit_code == 0, r.output
    assert len(read_run(tmp_path / "run2.trec")) == 12

    # a query tower from another model is refused, naming both compat ids
    r = runner.invoke(
        cli,
        [
            "search",
            "--index",
            str(idx),
            "--query-tower",
            str(other_bert_dir),
            "--queries",
            str(beir_dir),
            "--out",
            str(tmp_path / "bad.trec"),
        ],
    )
    assert isinstance(r.exception, ScalingNoteError) and "not compatible" in str(r.exception)
    assert not (tmp_path / "bad.trec").exists()


def test_encode_and_build_in_one_go(cli, tmp_path, beir_dir, tiny_bert_dir):
    r = CliRunner().invoke(
        cli,
        [
            "index",
            "build",
            "--tower",
            str(tiny_bert_dir),
            "--data",
            str(beir_dir),
            "--factory",
            "Flat",
            "--out",
            str(tmp_path / "idx"),
            "--semantic-ids-layers",
            "0",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "idx.embeddings" / "manifest.json").is_file()
    m = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert m["tower"]["role"] == "document" and m["semantic_ids"] is None
    r = CliRunner().invoke(cli, ["index", "build", "--factory", "Flat", "--out", str(tmp_path / "x")])
    assert isinstance(r.exception, ScalingNoteError) and "--embeddings" in str(r.exception)


def test_index_build_options_are_generated_from_index_config(cli):
    """Every IndexConfig field is an `index build` option with the field's default; the command
    hands build_index exactly the config the options describe."""
    import dataclasses

    import typer.main

    from scalingnote.index.build import IndexConfig

    cmd = typer.main.get_command(cli)
    build = cmd.commands["index"].commands["build"]  # type: ignore[attr-defined]
    opts = {p.name: p for p in build.params}
    for f in dataclasses.fields(IndexConfig):
        assert f.name in opts, f.name
        assert opts[f.name].opts == ["--" + f.name.replace("_", "-")]
        assert opts[f.name].default == f.default
    assert opts["overwrite"].is_flag
    ctx = build.make_context(
        "build", ["--out", "x", "--embeddings", "e", "--factory", "IVF4,Flat", "--nprobe", "3", "--overwrite"]
    )
    cfg_args = {k: ctx.params[k] for k in (f.name for f in dataclasses.fields(IndexConfig))}
    assert IndexConfig(**cfg_args) == IndexConfig(factory="IVF4,Flat", nprobe=3, overwrite=True)
