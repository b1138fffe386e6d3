"""A finished quick start drops its feature cache: token embeddings always, the pooled backbone
states unless ``keep_feature_cache`` is set; results.json says what went."""

from __future__ import annotations

from pathlib import Path

from scalingnote.quickstart.main import drop_feature_cache


def _cache(root: Path, name: str, size: int) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "part-0.npy").write_bytes(b"\0" * size)


def test_a_finished_run_drops_every_cache_and_the_folder(tmp_path):
    feats = tmp_path / "features"
    _cache(feats, "document-d2-pooled-abc", 3 * 2**20)
    _cache(feats, "query-d0-tokens-def", 2**20)
    gone = drop_feature_cache(tmp_path)
    assert sorted(gone["dropped"]) == ["document-d2-pooled-abc", "query-d0-tokens-def"] and gone["kept"] == []
    assert gone["dropped_mb"] == 4.0 and not feats.exists()


def test_keep_feature_cache_keeps_the_pooled_states_not_the_tokens(tmp_path):
    feats = tmp_path / "features"
    _cache(feats, "document-d2-pooled-abc", 10)
    _cache(feats, "query-d0-tokens-def", 10)
    gone = drop_feature_cache(tmp_path, keep_pooled=True)
    assert gone["dropped"] == ["query-d0-tokens-def"] and gone["kept"] == ["document-d2-pooled-abc"]
    assert [p.name for p in feats.iterdir()] == ["document-d2-pooled-abc"]


def test_a_run_without_a_cache_drops_nothing(tmp_path):
    assert drop_feature_cache(tmp_path) == {"dropped": [], "dropped_mb": 0.0, "kept": []}
