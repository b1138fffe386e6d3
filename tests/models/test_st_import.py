"""A sentence-transformers directory used as a tower: loads through ``load_tower``,
embeds like ``SentenceTransformer``, indexes and searches end to end; what a tower cannot
express is refused with the reason."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("sentence_transformers")

from scalingnote.errors import ConfigError
from scalingnote.models import load_tower
from scalingnote.models.towers.pooling import from_st_mode


def _st_dir(base, out, pooling="mean", dense=True, bias=True, activation=None, prompts=None):
    """A sentence-transformers directory built with sentence-transformers itself (as a user would)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    tr = Transformer(str(base))
    hidden = (
        tr.get_embedding_dimension() if hasattr(tr, "get_embedding_dimension") else tr.auto_model.config.hidden_size
    )
    mods = [tr, Pooling(hidden, pooling_mode=pooling)]
    if dense:
        torch.manual_seed(0)
        mods.append(
            Dense(
                hidden, 16, bias=bias, activation_function=activation if activation is not None else torch.nn.Identity()
            )
        )
    mods.append(Normalize())
    SentenceTransformer(modules=mods, device="cpu", prompts=prompts or {}).save(str(out))
    return out


def _texts():
    return [
        "the quick brown fox",
        "dense retrieval maps queries",
        "糖尿病患者可以吃什么水果",
        "vitamin d and fractures",
        "a",
    ]


@pytest.mark.parametrize("pooling,bias", [("mean", True), ("cls", False)])
def test_st_directory_loads_as_query_and_document_tower(tiny_dirs, tmp_path, pooling, bias):
    from sentence_transformers import SentenceTransformer

    d = _st_dir(tiny_dirs["bert"], tmp_path / "st", pooling=pooling, bias=bias)
    q = load_tower(d, role="query", device="cpu", dtype="float32")
    doc = load_tower(d, role="document", device="cpu", dtype="float32")
    assert q.config.pooling == pooling and q.out_dim == 16
    assert q.compat_id == doc.compat_id  # one symmetric model: query and document towers share the space
    ref = SentenceTransformer(str(d), device="cpu").encode(_texts(), convert_to_numpy=True)
    got = q.encode_queries(_texts(), show_progress=False)
    cos = (got * ref).sum(1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= 0.99999
    # it saves and reloads as a scalingnote tower (e.g. as a QKD student output)
    q.save(tmp_path / "saved")
    again = load_tower(tmp_path / "saved", device="cpu", dtype="float32")
    assert np.abs(again.encode_queries(_texts(), show_progress=False) - got).max() < 1e-6


def test_st_without_dense_is_the_plain_hf_tower(tiny_dirs, tmp_path):
    d = _st_dir(tiny_dirs["bert"], tmp_path / "st", pooling="cls", dense=False)
    a = load_tower(d, role="query", device="cpu", dtype="float32")
    assert a.config.pooling == "cls" and a.projection is None
    b = load_tower(d, role="query", pooling="mean", device="cpu", dtype="float32")  # no head: pooling may be overridden
    assert b.config.pooling == "mean"


def test_exported_tower_round_trips(tiny_dirs, tmp_path):
    from scalingnote.models.export import export_sentence_transformers

    t = load_tower(tiny_dirs["bert"], role="query", dim=16, device="cpu", dtype="float32")
    t.set_center(torch.randn(t.config.hidden_size, generator=torch.Generator().manual_seed(1)) * 0.3)
    export_sentence_transformers(t, tmp_path / "st")
    back = load_tower(tmp_path / "st", role="query", device="cpu", dtype="float32")
    assert (
        np.abs(
            back.encode_queries(_texts(), show_progress=False) - t.encode_queries(_texts(), show_progress=False)
        ).max()
        < 1e-5
    )


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"activation": torch.nn.Tanh()}, "identity activation"),
        ({"prompts": {"query": "query: "}}, "no prompt prefix"),
    ],
)
def test_what_a_tower_cannot_express_is_refused(tiny_dirs, tmp_path, kwargs, match):
    d = _st_dir(tiny_dirs["bert"], tmp_path / "st", **kwargs)
    with pytest.raises(ConfigError, match=match):
        load_tower(d, role="query", device="cpu")


def test_a_pooling_no_entry_of_the_table_computes_is_refused(tiny_dirs, tmp_path):
    # a sentence-transformers pooling that no pooling mode (built in or registered) computes for a BERT tower
    mode = next(
        m for m in ("max", "weightedmean", "mean_sqrt_len_tokens", "lasttoken") if from_st_mode(m, "bert") is None
    )
    d = _st_dir(tiny_dirs["bert"], tmp_path / "st", pooling=mode)
    with pytest.raises(
        ConfigError, match=rf"pooling mode '{mode}': a BERT tower pools with one of \[.*'cls'.*'mean'.*\]"
    ):
        load_tower(d, role="query", device="cpu")


def test_unknown_module_is_refused_naming_it(tiny_dirs, tmp_path):
    d = _st_dir(tiny_dirs["bert"], tmp_path / "st", dense=False)
    mods = json.loads((d / "modules.json").read_text())
    mods.insert(2, {"idx": 9, "name": "9", "path": "9_LSTM", "type": "sentence_transformers.models.LSTM"})
    (d / "modules.json").write_text(json.dumps(mods))
    with pytest.raises(ConfigError, match="LSTM"):
        load_tower(d, role="query", device="cpu")


def test_imported_st_tower_indexes_and_searches_end_to_end(tiny_dirs, tmp_path):
    """`index encode` / `index build` / `search` (CLI) with a sentence-transformers directory on both sides."""
    from typer.testing import CliRunner

    from scalingnote.cli import app
    from scalingnote.data import load_corpus
    from scalingnote.index import DenseIndex
    from tests.helpers.tiny_data import write_tiny_beir

    d = _st_dir(tiny_dirs["bert"], tmp_path / "st")
    beir = write_tiny_beir(tmp_path / "beir", docs_per_topic=4)
    run = CliRunner()
    r = run.invoke(
        app,
        [
            "index",
            "encode",
            "--tower",
            str(d),
            "--data",
            str(beir),
            "--out",
            str(tmp_path / "emb"),
            "--batch-size",
            "8",
        ],
    )
    assert r.exit_code == 0, r.output
    r = run.invoke(
        app,
        [
            "index",
            "build",
            "--embeddings",
            str(tmp_path / "emb"),
            "--out",
            str(tmp_path / "idx"),
            "--semantic-ids-layers",
            "0",
        ],
    )
    assert r.exit_code == 0, r.output
    r = run.invoke(
        app,
        [
            "search",
            "--index",
            str(tmp_path / "idx"),
            "--query-tower",
            str(d),
            "--queries",
            str(beir),
            "--out",
            str(tmp_path / "run.trec"),
            "--k",
            "5",
        ],
    )
    assert r.exit_code == 0, r.output
    lines = (tmp_path / "run.trec").read_text().splitlines()
    assert len(lines) == 6 * 5  # 6 test queries, 5 hits each
    # the Dense head is used on both sides: a document's own text finds it first
    q = load_tower(d, role="query", device="cpu", dtype="float32")
    index = DenseIndex.open(tmp_path / "idx", query_tower=q)
    docs = list(load_corpus(beir / "corpus.jsonl").values())
    res = index.search(q.encode_queries([x.text for x in docs], show_progress=False), 1)
    assert np.mean([r[0] == x.id for r, x in zip(res.doc_ids, docs, strict=True)]) >= 0.9
