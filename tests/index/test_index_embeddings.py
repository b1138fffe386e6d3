"""Sharded, resumable corpus encoding with a (tiny, random) real document tower."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index import encode_corpus, load_embeddings, tower_identity


class CountingTower:
    """Forwards to a real document tower and counts the documents it was asked to encode."""

    def __init__(self, tower):
        self.tower = tower
        self.n_encoded = 0

    def encode_documents(self, docs, batch_size=16, show_progress=True):
        self.n_encoded += len(docs)
        return self.tower.encode_documents(docs, batch_size=batch_size, show_progress=show_progress)


class Interrupt(Exception):
    pass


def test_encode_writes_shards_and_manifest(tmp_path, doc_tower, tiny_corpus):
    res = encode_corpus(doc_tower, tiny_corpus, tmp_path / "emb", shard_size=16, batch_size=4, progress=False)
    assert res.n_docs == len(tiny_corpus) and res.n_shards == 4 and res.shards_written == 4
    assert res.docs_per_s > 0
    man = json.loads((tmp_path / "emb" / "manifest.json").read_text())
    assert man["format"] == "scalingnote-embeddings/1"
    assert man["complete"] is True and man["n_docs"] == len(tiny_corpus)
    assert man["dim"] == doc_tower.out_dim and man["shard_size"] == 16
    assert man["tower"]["fingerprint"] == doc_tower.fingerprint
    assert man["tower"]["compat_id"] == doc_tower.compat_id
    assert [s["n"] for s in man["shards"]] == [16, 16, 16, 12]
    assert (tmp_path / "emb" / "shards" / "00003.npy").is_file()
    assert (tmp_path / "emb" / "shards" / "00003.ids.json").is_file()

    emb = load_embeddings(tmp_path / "emb")
    assert emb.ids == [d.id for d in tiny_corpus]
    direct = doc_tower.encode_documents(tiny_corpus, show_progress=False)
    np.testing.assert_allclose(emb.vectors, direct, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(emb.vectors, axis=1), 1.0, atol=1e-5)
    # gathering rows across shards, in any order
    idx = np.array([59, 0, 17, 16, 33, 2])
    np.testing.assert_array_equal(emb.rows(idx), np.asarray(emb.vectors)[idx])
    chunks = list(emb.iter_chunks(10))
    assert sum(len(c) for _, c in chunks) == len(tiny_corpus)
    assert [s for s, _ in chunks][:3] == [0, 10, 16]  # chunks never cross a shard


def test_interrupted_encoding_resumes_without_recomputing(tmp_path, doc_tower, tiny_corpus):
    full = encode_corpus(doc_tower, tiny_corpus, tmp_path / "full", shard_size=8, batch_size=4, progress=False)
    assert full.n_shards == 8

    counting = CountingTower(doc_tower)
    info = tower_identity(doc_tower)

    def stop_after_three(shard: int) -> None:
        if shard == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        encode_corpus(
            counting,
            tiny_corpus,
            tmp_path / "part",
            shard_size=8,
            batch_size=4,
            progress=False,
            on_shard_done=stop_after_three,
            tower_info=info,
        )
    assert counting.n_encoded == 24
    man = json.loads((tmp_path / "part" / "manifest.json").read_text())
    assert man["complete"] is False and len(man["shards"]) == 3
    with pytest.raises(ScalingNoteError, match="interrupted"):
        load_embeddings(tmp_path / "part")
    assert len(load_embeddings(tmp_path / "part", require_complete=False)) == 24

    counting.n_encoded = 0
    res = encode_corpus(
        counting, tiny_corpus, tmp_path / "part", shard_size=8, batch_size=4, progress=False, tower_info=info
    )
    assert counting.n_encoded == len(tiny_corpus) - 24  # finished shards were not recomputed
    assert res.shards_skipped == 3 and res.shards_written == 5

    a, b = load_embeddings(tmp_path / "full"), load_embeddings(tmp_path / "part")
    assert a.ids == b.ids
    np.testing.assert_array_equal(np.asarray(a.vectors), np.asarray(b.vectors))

    # resuming a complete directory recomputes nothing
    counting.n_encoded = 0
    speed = json.loads((tmp_path / "part" / "manifest.json").read_text())["docs_per_s"]
    again = encode_corpus(counting, tiny_corpus, tmp_path / "part", shard_size=8, progress=False, tower_info=info)
    assert counting.n_encoded == 0 and again.docs_per_s == 0.0 and again.shards_skipped == 8
    assert speed > 0 and json.loads((tmp_path / "part" / "manifest.json").read_text())["docs_per_s"] == speed


def test_resume_refuses_another_tower_shard_size_or_corpus(
    tmp_path, doc_tower, other_bert_dir, tiny_corpus, corpus_factory
):
    from scalingnote.models import load_tower

    encode_corpus(doc_tower, tiny_corpus[:20], tmp_path / "e", shard_size=8, progress=False)
    other = load_tower(other_bert_dir, role="document")
    with pytest.raises(ScalingNoteError, match="fingerprint") as ei:
        encode_corpus(other, tiny_corpus[:20], tmp_path / "e", shard_size=8, progress=False)
    assert doc_tower.fingerprint in str(ei.value) and other.fingerprint in str(ei.value)
    with pytest.raises(ScalingNoteError, match="shard_size"):
        encode_corpus(doc_tower, tiny_corpus[:20], tmp_path / "e", shard_size=4, progress=False)
    changed = corpus_factory(20, seed=5)
    with pytest.raises(ScalingNoteError, match="corpus changed"):
        encode_corpus(doc_tower, changed, tmp_path / "e", shard_size=8, progress=False)


def test_encode_from_beir_dir_and_bad_inputs(tmp_path, doc_tower, tiny_corpus):
    from scalingnote.data import write_corpus

    write_corpus(tmp_path / "beir" / "corpus.jsonl", tiny_corpus[:10])
    res = encode_corpus(doc_tower, tmp_path / "beir", tmp_path / "e", shard_size=4, progress=False)
    assert res.n_docs == 10
    assert load_embeddings(tmp_path / "e").manifest["corpus"]["path"].endswith("corpus.jsonl")
    with pytest.raises(ScalingNoteError, match="not found"):
        encode_corpus(doc_tower, tmp_path / "missing", tmp_path / "e2", progress=False)
    with pytest.raises(ScalingNoteError, match="no manifest.json"):
        load_embeddings(tmp_path / "beir")

    class BadTower:
        def encode_documents(self, docs):
            return np.zeros((len(docs) + 1, 4), np.float32)

    with pytest.raises(ScalingNoteError, match="returned shape"):
        encode_corpus(BadTower(), tiny_corpus[:5], tmp_path / "e3", progress=False)


def test_encode_through_the_feature_cache_equals_plain_encoding(tmp_path, tiny_bert_dir, tiny_corpus):
    """`index encode --feature-cache`: same embeddings and identity; the second run reads the cache."""
    from scalingnote.index.pipeline import encode_with_tower

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"_id": d.id, "title": d.title, "text": d.content}) + "\n" for d in tiny_corpus)
    )
    plain = encode_with_tower(tiny_bert_dir, corpus, tmp_path / "plain", shard_size=32, progress=False)
    cached = encode_with_tower(
        tiny_bert_dir, corpus, tmp_path / "cached", shard_size=32, progress=False, feature_cache=tmp_path / "fc"
    )
    assert plain.n_docs == cached.n_docs == len(tiny_corpus)
    a, b = load_embeddings(tmp_path / "plain"), load_embeddings(tmp_path / "cached")
    np.testing.assert_allclose(np.concatenate(a.shards), np.concatenate(b.shards), atol=1e-5)
    ma = json.loads((tmp_path / "plain" / "manifest.json").read_text())["tower"]
    mb = json.loads((tmp_path / "cached" / "manifest.json").read_text())["tower"]
    assert ma == mb
    parts = sorted((tmp_path / "fc").rglob("part-*.npy"))
    assert parts
    stamp = [p.stat().st_mtime_ns for p in parts]
    encode_with_tower(
        tiny_bert_dir, corpus, tmp_path / "again", shard_size=32, progress=False, feature_cache=tmp_path / "fc"
    )
    assert sorted((tmp_path / "fc").rglob("part-*.npy")) == parts and [p.stat().st_mtime_ns for p in parts] == stamp
