"""An index moved or copied together with its document tower and corpus (a quick start's output
directory, say) is the same index: its manifest finds the tower and the corpus where they now are,
the live index encodes new documents with that tower, and a rebuild from the same inputs in the new
place reuses it instead of building it again."""

from __future__ import annotations

import json
import shutil

from scalingnote.data import Document
from scalingnote.index import build_index, encode_corpus
from scalingnote.index.docstore import index_corpus
from scalingnote.index.layout import read_manifest, record_tower_path
from scalingnote.live import LiveIndex
from scalingnote.models import load_tower
from tests.helpers.tiny_data import write_tiny_beir

BUILD = {"semantic_ids_layers": 0, "seed": 0, "progress": False}


def _run(root, tiny_bert_dir):
    """A run directory: a saved document tower (another fingerprint than its base model), a corpus,
    and an index over the tower's vectors with the corpus as its document store."""
    load_tower(tiny_bert_dir, "document", dim=16, projection_seed=3).save(root / "stage1" / "doc_tower")
    tower = load_tower(root / "stage1" / "doc_tower")
    beir = write_tiny_beir(root / "data", docs_per_topic=6)
    encode_corpus(tower, beir / "corpus.jsonl", root / "emb", shard_size=64, batch_size=16, progress=False)
    emb = root / "emb"
    build_index(emb, root / "index" / "flat", "Flat", documents=beir, **BUILD)
    return tower


def test_a_moved_run_finds_its_tower_and_corpus_and_keeps_its_index(tmp_path, tiny_bert_dir):
    tower = _run(tmp_path / "a", tiny_bert_dir)
    man = read_manifest(tmp_path / "a" / "index" / "flat")
    assert man["paths_from_index"] == {
        "tower": "../../stage1/doc_tower",
        "documents": "../../data/corpus.jsonl",
        "embeddings": "../../emb",
    }
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "a")  # the run was moved: nothing of it is left where it was built
    idx = tmp_path / "b" / "index" / "flat"
    man = read_manifest(idx)
    assert man["tower"]["path"] == str((tmp_path / "b" / "stage1" / "doc_tower").resolve())
    assert index_corpus(man) == (tmp_path / "b" / "data" / "corpus.jsonl").resolve()
    assert man["embeddings_dir"] == str((tmp_path / "b" / "emb").resolve())
    stamp = (idx / "manifest.json").stat().st_mtime_ns
    # the same inputs in their new place: reused, not built again
    build_index(tmp_path / "b" / "emb", idx, "Flat", documents=tmp_path / "b" / "data", reuse=True, **BUILD)
    assert (idx / "manifest.json").stat().st_mtime_ns == stamp
    live = LiveIndex.open(idx)  # no --document-tower: the manifest's tower, found in the moved run
    try:
        live.upsert([Document("n1", "narwhal", "", "a narwhal swims under the ice")])
        assert live.document_tower.fingerprint == tower.fingerprint
        assert live.searcher().search(["narwhal"], 3, mode="bm25").doc_ids[0][0] == "n1"
    finally:
        live.close()


def test_an_index_moved_alone_keeps_its_absolute_paths(tmp_path, tiny_bert_dir):
    _run(tmp_path / "a", tiny_bert_dir)
    shutil.copytree(tmp_path / "a" / "index" / "flat", tmp_path / "elsewhere" / "flat")
    man = read_manifest(tmp_path / "elsewhere" / "flat")
    assert man["tower"]["path"] == str((tmp_path / "a" / "stage1" / "doc_tower").resolve())
    assert index_corpus(man) == (tmp_path / "a" / "data" / "corpus.jsonl").resolve()
    assert man["embeddings_dir"] == str((tmp_path / "a" / "emb").resolve())


def test_record_tower_path_records_it_from_the_index_too(tmp_path, tiny_bert_dir):
    _run(tmp_path / "a", tiny_bert_dir)
    idx = tmp_path / "a" / "index" / "flat"
    man = json.loads((idx / "manifest.json").read_text())
    del man["tower"]["path"], man["paths_from_index"]  # written before manifests recorded either
    (idx / "manifest.json").write_text(json.dumps(man))
    assert record_tower_path(idx, tmp_path / "a" / "stage1" / "doc_tower")
    assert read_manifest(idx)["paths_from_index"]["tower"] == "../../stage1/doc_tower"
