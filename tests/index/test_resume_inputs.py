"""Encoding and index builds are reused only when built from the same inputs."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index import build_index, encode_corpus
from scalingnote.index.build import IndexConfig


def test_encoding_resume_refuses_other_tower_settings_or_normalisation(tmp_path, doc_tower, tiny_corpus):
    out = tmp_path / "e"
    info = {"fingerprint": "f1", "compat_id": "c1", "max_doc_length": 96, "pooling": "cls"}
    encode_corpus(doc_tower, tiny_corpus[:20], out, shard_size=8, progress=False, tower_info=info)
    with pytest.raises(ScalingNoteError, match=r"tower\.max_doc_length: 96 -> 32") as e:
        encode_corpus(
            doc_tower, tiny_corpus[:20], out, shard_size=8, progress=False, tower_info={**info, "max_doc_length": 32}
        )
    assert "tower.fingerprint" not in str(e.value) and "new output directory" in str(e.value)
    moved = encode_corpus(
        doc_tower, tiny_corpus[:20], out, shard_size=8, progress=False, tower_info={**info, "name": "/elsewhere/tower"}
    )
    assert moved.shards_written == 0  # the same weights loaded from another place
    with pytest.raises(ScalingNoteError, match="normalized"):
        encode_corpus(doc_tower, tiny_corpus[:20], out, shard_size=8, progress=False, tower_info=info, normalize=False)
    again = encode_corpus(doc_tower, tiny_corpus[:20], out, shard_size=8, progress=False, tower_info=info)
    assert again.shards_written == 0  # same inputs: every shard reused


@pytest.fixture()
def vectors():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 16)).astype(np.float32)
    return x, [f"d{i}" for i in range(64)]


def test_index_build_records_inputs_and_reuses_only_the_same(tmp_path, vectors, caplog):
    x, ids = vectors
    out = tmp_path / "idx"
    kw = {"doc_ids": ids, "semantic_ids_layers": 0, "seed": 0, "progress": False}
    build_index(x, out, "Flat", **kw)
    man = json.loads((out / "manifest.json").read_text())
    assert man["inputs"]["factory"] == "Flat" and len(man["inputs_sha256"]) == 64
    stamp = (out / "manifest.json").stat().st_mtime_ns

    assert build_index(x, out, "Flat", reuse=True, **kw) == out
    assert (out / "manifest.json").stat().st_mtime_ns == stamp  # kept, not rebuilt
    with pytest.raises(ScalingNoteError, match="already exists"):
        build_index(x, out, "Flat", **kw)
    # other vectors under the same name, another setting: refused with what changed
    with pytest.raises(ScalingNoteError, match=r"vectors\.array_sha256"):
        build_index(x * 2, out, "Flat", reuse=True, **kw)
    with pytest.raises(ScalingNoteError, match=r"factory: Flat -> IVF2,Flat"):
        build_index(x, out, "IVF2,Flat", reuse=True, **kw)
    with pytest.raises(ScalingNoteError, match=r"seed: 0 -> 1"):
        build_index(x, out, "Flat", reuse=True, **{**kw, "seed": 1})
    # overwrite rebuilds, saying what changed in one line
    with caplog.at_level(logging.WARNING, logger="scalingnote.index.build"):
        build_index(x * 2, out, "Flat", overwrite=True, **kw)
    assert len(caplog.records) == 1 and "vectors.array_sha256" in caplog.records[0].getMessage()
    assert json.loads((out / "manifest.json").read_text())["inputs_sha256"] != man["inputs_sha256"]


def test_index_from_embeddings_dir_is_reused_by_content(tmp_path, doc_tower, tiny_corpus):
    emb = tmp_path / "emb"
    encode_corpus(doc_tower, tiny_corpus[:24], emb, shard_size=8, progress=False)
    out = tmp_path / "idx"
    build_index(emb, out, "Flat", semantic_ids_layers=0, progress=False)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    encode_corpus(
        doc_tower, tiny_corpus[:24], emb, shard_size=8, progress=False
    )  # verify-only rerun rewrites the manifest
    build_index(emb, out, "Flat", semantic_ids_layers=0, progress=False, reuse=True)
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    assert "reuse" in IndexConfig().kwargs()  # `scalingnote index build --reuse`
