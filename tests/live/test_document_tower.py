"""The live index encodes new documents with the tower that made the index's vectors:
a fine-tuned tower is named after its base model, so the manifest records its saved directory,
and a tower of another space is refused with both fingerprints and the fix."""

from __future__ import annotations

import json
import shutil

import pytest

from scalingnote.data import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index import build_index, encode_corpus, tower_identity
from scalingnote.live import LiveIndex
from scalingnote.models import load_tower
from tests.helpers.tiny_data import write_tiny_beir


@pytest.fixture(scope="module")
def _tuned(tmp_path_factory, tiny_bert_dir):
    """An index over the vectors of a "fine-tuned" document tower: the tiny BERT with a trained-like
    projection head (other weights, other fingerprint than the base model it is named after)."""
    root = tmp_path_factory.mktemp("tuned")
    tuned = load_tower(tiny_bert_dir, "document", dim=16, projection_seed=3)
    tuned.save(root / "doc_tower")
    saved = load_tower(root / "doc_tower")
    beir = write_tiny_beir(root / "beir", docs_per_topic=8)
    encode_corpus(saved, beir / "corpus.jsonl", root / "emb", shard_size=64, batch_size=16, progress=False)
    idx = build_index(
        root / "emb", root / "idx", "IVF4,PQ4x4", semantic_ids_layers=2, codebook_size=4, seed=0, progress=False
    )
    return idx, saved


@pytest.fixture
def tuned_index(_tuned, tmp_path):
    """A fresh copy of the index (each test changes its own)."""
    idx, saved = _tuned
    shutil.copytree(idx, tmp_path / "idx")
    return tmp_path / "idx", saved


def test_the_manifest_names_the_saved_tower_and_the_live_index_encodes_with_it(tuned_index, tiny_bert_dir):
    idx, saved = tuned_index
    man = json.loads((idx / "manifest.json").read_text())
    assert man["tower"]["path"] == saved.source_path and man["tower"]["fingerprint"] == saved.fingerprint
    assert (
        load_tower(man["tower"]["name"], "document").fingerprint != saved.fingerprint
    )  # the base model is another space
    live = LiveIndex.open(idx)
    try:
        live.upsert([Document("n1", "narwhal", "", "a narwhal swims under the ice")])
        assert live.document_tower.fingerprint == saved.fingerprint
        assert live.searcher().search(["narwhal"], 3, mode="bm25").doc_ids[0][0] == "n1"
    finally:
        live.close()


def test_without_the_recorded_path_the_base_model_is_refused_with_both_fingerprints_and_the_fix(tuned_index):
    idx, saved = tuned_index
    man = json.loads((idx / "manifest.json").read_text())
    del man["tower"]["path"]  # an index written before manifests named the tower's directory
    (idx / "manifest.json").write_text(json.dumps(man))
    live = LiveIndex.open(idx)
    try:
        with pytest.raises(ScalingNoteError) as e:
            live.upsert([Document("n1", "narwhal", "", "a narwhal swims")])
        msg = str(e.value)
        assert saved.fingerprint in msg and "--document-tower" in msg and "--tower" in msg
        assert live.stats()["documents"] == 48  # nothing applied
    finally:
        live.close()
    live = LiveIndex.open(
        idx, document_tower=saved.source_path
    )  # the override (serve --document-tower, index add --tower)
    try:
        assert live.upsert([Document("n1", "narwhal", "", "a narwhal swims")])["upserted"] == 1
    finally:
        live.close()


def test_record_tower_path_fills_an_old_manifest_only_with_the_very_tower(tuned_index, tmp_path, tiny_bert_dir):
    from scalingnote.index.layout import record_tower_path

    idx, saved = tuned_index
    man = json.loads((idx / "manifest.json").read_text())
    del man["tower"]["path"]
    (idx / "manifest.json").write_text(json.dumps(man))
    other = load_tower(tiny_bert_dir, "document", dim=16, projection_seed=4)
    other.save(tmp_path / "other_tower")
    assert not record_tower_path(idx, tmp_path / "other_tower")  # another fingerprint: not recorded
    assert record_tower_path(idx, saved.source_path)
    assert json.loads((idx / "manifest.json").read_text())["tower"]["path"] == saved.source_path
    assert tower_identity(saved)["path"] == saved.source_path


def test_ingest_is_encoded_in_chunks_and_paced_between_them(tuned_index):
    """The service slows ingest while searches run through this hook: encoding stops between
    chunks of 16 documents, the pause is reported apart from the encoding time."""
    from scalingnote.live.index import ENCODE_CHUNK

    idx, _ = tuned_index
    live = LiveIndex.open(idx)
    calls: list[float] = []

    def pace(seconds: float) -> float:
        calls.append(seconds)
        return 0.25

    live.pace = pace
    try:
        docs = [Document(f"p{i}", f"note {i}", "", f"paced document number {i}") for i in range(2 * ENCODE_CHUNK + 3)]
        res = live.upsert(docs)
        assert len(calls) == 2 and all(c > 0 for c in calls)  # after the 1st and 2nd chunk, not after the last
        assert res["timings_ms"]["pace"] == pytest.approx(500.0) and res["upserted"] == len(docs)
        assert live.stats()["upsert_seconds"]["pace"] == pytest.approx(0.5)
    finally:
        live.close()


def test_the_service_pauses_ingest_only_while_searches_run():
    import time
    from types import SimpleNamespace

    from scalingnote.serve.documents import _LiveState

    service = SimpleNamespace(last_search=time.monotonic())
    state = _LiveState.__new__(_LiveState)
    state.service, state.settings = service, SimpleNamespace(ingest_duty=0.5)
    assert state.pace(0.02) == pytest.approx(0.02)  # duty 0.5: as long a pause as the chunk took
    service.last_search = time.monotonic() - 5.0
    assert state.pace(0.02) == 0.0  # no search in the last second: full speed
    state.settings = SimpleNamespace(ingest_duty=1.0)
    service.last_search = time.monotonic()
    assert state.pace(0.02) == 0.0
