"""Ray Data corpus encoding (scalingnote.index.ray.ray_encode): same shards as the in-process
encoder, resumable by shard, Parquet input, clear errors.

A local Ray instance (2 CPUs, 127.0.0.1) is started once per module (ray.init: ~5 s on the
2-core machine when it is quiet, 10-20 s when other jobs load it) and each Ray pipeline
starts actors that import torch and load the tower. One test runs by default (an in-process
run interrupted, then finished by Ray: resume + equality + index build in one pipeline,
~18 s quiet, up to ~70 s at load average 12); the other cluster tests are ``slow``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.index import build_index, encode_corpus, load_embeddings
from tests.helpers.tiny_data import write_tiny_beir

ray = pytest.importorskip("ray", reason="ray[data] is not installed (pip install 'ray[data]==2.60.0')")

SHARD = 10  # tiny BEIR corpus: 48 documents -> 5 shards (last one 8 documents)
BATCH = 4


class _Stop(Exception):
    pass


def _stop_after(n_shards: int):
    seen = []

    def cb(shard: int) -> None:
        seen.append(shard)
        if len(seen) >= n_shards:
            raise _Stop(f"interrupted after {n_shards} shard(s)")

    return cb


@pytest.fixture(scope="module")
def beir(tmp_path_factory) -> Path:
    return write_tiny_beir(tmp_path_factory.mktemp("ray-beir") / "beir")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, beir, doc_tower) -> Path:
    """The in-process encoding of the tiny corpus (the ground truth)."""
    out = tmp_path_factory.mktemp("ray-ref") / "emb"
    encode_corpus(doc_tower, beir, out, shard_size=SHARD, batch_size=BATCH, progress=False)
    return out


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        ray.shutdown()
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    except Exception as e:  # noqa: BLE001 - report exactly what fails in this sandbox
        pytest.skip(f"cannot start a local Ray instance: {type(e).__name__}: {e}")
    try:
        yield ray
    finally:
        ray.shutdown()


def _assert_same_embeddings(a_dir: Path, b_dir: Path, atol: float = 1e-6) -> bool:
    a, b = load_embeddings(a_dir), load_embeddings(b_dir)
    assert a.ids == b.ids
    assert a.dim == b.dim
    assert a.vectors.dtype == b.vectors.dtype == np.float32
    np.testing.assert_allclose(np.asarray(b.vectors), np.asarray(a.vectors), rtol=0, atol=atol)
    ma, mb = a.manifest, b.manifest
    assert [(s["shard"], s["n"], s["start"], s["content_sha256"], s["vectors"], s["ids"]) for s in ma["shards"]] == [
        (s["shard"], s["n"], s["start"], s["content_sha256"], s["vectors"], s["ids"]) for s in mb["shards"]
    ]
    for key in ("format", "dim", "dtype", "normalized", "shard_size", "n_docs", "complete", "tower"):
        assert ma[key] == mb[key], key
    return bool(np.array_equal(np.asarray(a.vectors), np.asarray(b.vectors)))


# --------------------------------------------------------------------------- Ray cluster


def test_ray_finishes_an_interrupted_in_process_run_identically(
    ray_cluster, tmp_path, beir, reference, doc_tower, tiny_bert_dir
):
    from scalingnote.index.ray.ray_encode import encode_corpus_ray

    out = tmp_path / "emb"
    with pytest.raises(_Stop):
        encode_corpus(
            doc_tower, beir, out, shard_size=SHARD, batch_size=BATCH, progress=False, on_shard_done=_stop_after(2)
        )
    assert len(json.loads((out / "manifest.json").read_text())["shards"]) == 2

    res = encode_corpus_ray(
        str(tiny_bert_dir),
        beir,
        out,
        shard_size=SHARD,
        batch_size=BATCH,
        num_actors=2,
        cpus_per_actor=0.5,
        progress=False,
    )
    assert (res.n_docs, res.n_shards, res.shards_skipped, res.shards_written) == (48, 5, 2, 3)
    man = json.loads((out / "manifest.json").read_text())
    assert man["complete"] is True
    assert (
        man["engine"]["name"] == "ray" and man["engine"]["num_actors"] == 2 and man["engine"]["cpus_per_actor"] == 0.5
    )
    identical = _assert_same_embeddings(reference, out)
    # the actor runs the same tower code on the same sub-batches: bit-identical on CPU
    assert identical, "Ray shards differ from the in-process ones (within 1e-6, but not bit-identical)"

    # the index builder consumes the directory as it is
    idx = build_index(out, tmp_path / "index", "Flat", semantic_ids_layers=0, progress=False)
    assert json.loads((idx / "manifest.json").read_text())["n_vectors"] == 48


@pytest.mark.slow
def test_resource_demand_larger_than_the_cluster_is_refused(ray_cluster, tmp_path, beir, tiny_bert_dir):
    from scalingnote.index.ray.ray_encode import encode_corpus_ray

    with pytest.raises(ScalingNoteError, match=r"3 x --cpus-per-actor 1 = 3 CPUs, but the Ray cluster has 2"):
        encode_corpus_ray(str(tiny_bert_dir), beir, tmp_path / "emb", num_actors=3, cpus_per_actor=1.0, progress=False)
    with pytest.raises(ScalingNoteError, match=r"GPUs, but the Ray cluster has 0"):
        encode_corpus_ray(
            str(tiny_bert_dir),
            beir,
            tmp_path / "emb",
            num_actors=1,
            cpus_per_actor=0.5,
            gpus_per_actor=1,
            progress=False,
        )
    assert not (tmp_path / "emb" / "manifest.json").exists()


# --------------------------------------------------------------------------- no cluster (default run)


def test_argument_errors_before_ray_starts(tmp_path, beir, doc_tower, tiny_bert_dir):
    from scalingnote.index.ray.ray_encode import encode_corpus_ray

    with pytest.raises(ScalingNoteError, match="corpus file not found"):
        encode_corpus_ray(str(tiny_bert_dir), tmp_path / "missing.jsonl", tmp_path / "emb")
    with pytest.raises(ScalingNoteError, match="shard_size"):
        encode_corpus_ray(str(tiny_bert_dir), beir, tmp_path / "emb", shard_size=0)
    with pytest.raises(ScalingNoteError, match="must reserve some CPU or GPU"):
        encode_corpus_ray(str(tiny_bert_dir), beir, tmp_path / "emb", cpus_per_actor=0, gpus_per_actor=0)
    # resuming with another shard size is refused before Ray starts
    encode_corpus(doc_tower, beir, tmp_path / "emb", shard_size=SHARD, batch_size=BATCH, progress=False)
    was_running = ray.is_initialized()
    with pytest.raises(ScalingNoteError, match="field 'shard_size' is 10, but this run asks for 16"):
        encode_corpus_ray(str(tiny_bert_dir), beir, tmp_path / "emb", shard_size=16)
    assert ray.is_initialized() == was_running


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {k: [r.get(k) for r in rows] for k in rows[0]}
    pq.write_table(pa.table(cols), path, row_group_size=7)
    return path


def test_parquet_reader_matches_jsonl_and_names_bad_rows(tmp_path, beir):
    from scalingnote.data import iter_corpus
    from scalingnote.data.corpus import iter_parquet_corpus

    docs = list(iter_corpus(beir / "corpus.jsonl"))
    rows = [{"_id": d.id, "title": d.title, "topic": d.topic, "text": d.content} for d in docs]
    rows.insert(3, {"_id": "empty", "title": "", "topic": "", "text": ""})  # skipped, like iter_corpus
    p = _write_parquet(tmp_path / "c.parquet", rows)
    with pytest.warns(UserWarning, match="skipped 1 empty documents"):
        got = list(iter_parquet_corpus([p]))
    assert got == docs

    bad = [dict(r) for r in rows[:5]]
    bad[4]["_id"] = rows[1]["_id"]
    with pytest.raises(DataError, match=r"c2.parquet, field '_id': row 5: duplicate document id"):
        list(iter_parquet_corpus([_write_parquet(tmp_path / "c2.parquet", bad)]))
    bad = [dict(r) for r in rows[:5]]
    bad[2]["text"] = None
    with pytest.raises(DataError, match=r"field 'text': row 3: missing value"):
        list(iter_parquet_corpus([_write_parquet(tmp_path / "c3.parquet", bad)]))
    with pytest.raises(DataError, match=r"field 'text': missing required column"):
        list(iter_parquet_corpus([_write_parquet(tmp_path / "c4.parquet", [{"_id": "a", "title": "t"}])]))
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="cannot read as Parquet"):
        list(iter_parquet_corpus([tmp_path / "junk.parquet"]))


# --------------------------------------------------------------------------- Ray cluster (slow)


@pytest.mark.slow
def test_ray_fresh_run_interrupted_then_resumed(ray_cluster, tmp_path, beir, reference, tiny_bert_dir):
    from scalingnote.index.ray.ray_encode import encode_corpus_ray

    out = tmp_path / "emb"
    with pytest.raises(_Stop):
        encode_corpus_ray(
            str(tiny_bert_dir),
            beir,
            out,
            shard_size=SHARD,
            batch_size=BATCH,
            num_actors=2,
            progress=False,
            on_shard_done=_stop_after(1),
        )
    man = json.loads((out / "manifest.json").read_text())
    assert man["complete"] is False and len(man["shards"]) == 1
    with pytest.raises(ScalingNoteError, match="'complete' is false"):
        load_embeddings(out)
    res = encode_corpus_ray(
        str(tiny_bert_dir), beir, out, shard_size=SHARD, batch_size=BATCH, num_actors=1, progress=False
    )
    assert (res.shards_skipped, res.shards_written) == (1, 4)
    assert _assert_same_embeddings(reference, out)
    # a third run has nothing left to do
    res = encode_corpus_ray(
        str(tiny_bert_dir), beir, out, shard_size=SHARD, batch_size=BATCH, num_actors=1, progress=False
    )
    assert (res.shards_skipped, res.shards_written) == (5, 0)


@pytest.mark.slow
def test_ray_reads_parquet_directories(ray_cluster, tmp_path, beir, reference, tiny_bert_dir):
    from scalingnote.data import iter_corpus
    from scalingnote.index.ray.ray_encode import encode_corpus_ray

    docs = list(iter_corpus(beir / "corpus.jsonl"))
    rows = [{"_id": d.id, "title": d.title, "topic": d.topic, "text": d.content} for d in docs]
    pdir = tmp_path / "parquet"
    pdir.mkdir()
    _write_parquet(pdir / "part-000.parquet", rows[:23])  # shard 2 spans both files
    _write_parquet(pdir / "part-001.parquet", rows[23:])
    out = tmp_path / "emb"
    res = encode_corpus_ray(
        str(tiny_bert_dir), pdir, out, shard_size=SHARD, batch_size=BATCH, num_actors=2, progress=False
    )
    assert res.n_docs == 48
    assert _assert_same_embeddings(reference, out)
    assert json.loads((out / "manifest.json").read_text())["corpus"]["path"] == str(pdir)


@pytest.mark.slow
def test_ray_resume_refuses_another_tower(ray_cluster, tmp_path, beir, reference, other_bert_dir):
    import shutil

    from scalingnote.index.ray.ray_encode import encode_corpus_ray

    out = tmp_path / "emb"
    shutil.copytree(reference, out)
    # complete directory: nothing to encode, one Ray task checks the tower
    with pytest.raises(ScalingNoteError, match=r"tower\.(fingerprint|compat_id)"):
        encode_corpus_ray(
            str(other_bert_dir), beir, out, shard_size=SHARD, batch_size=BATCH, num_actors=1, progress=False
        )
    # partial directory: the first actor result is checked before anything is committed
    man = json.loads((out / "manifest.json").read_text())
    man["shards"], man["complete"] = man["shards"][:2], False
    (out / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ScalingNoteError, match=r"tower\.(fingerprint|compat_id)"):
        encode_corpus_ray(
            str(other_bert_dir), beir, out, shard_size=SHARD, batch_size=BATCH, num_actors=1, progress=False
        )
    assert json.loads((out / "manifest.json").read_text()) == man


@pytest.mark.slow
def test_ray_reports_bad_tower_and_bad_record(ray_cluster, tmp_path, beir, tiny_bert_dir):
    from scalingnote.index.ray.ray_encode import encode_corpus_ray

    with pytest.raises(ScalingNoteError, match="no-such-model"):
        encode_corpus_ray(str(tmp_path / "no-such-model"), beir, tmp_path / "emb", num_actors=1, progress=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "a", "text": "ok"}\n{"_id": "b", "text": 5}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl, line 2, field 'text'"):
        encode_corpus_ray(str(tiny_bert_dir), bad, tmp_path / "emb2", num_actors=1, progress=False)


@pytest.mark.slow
def test_cli_encode_engine_ray(ray_cluster, tmp_path, beir, reference, tiny_bert_dir):
    from typer.testing import CliRunner

    from scalingnote.cli import app

    out = tmp_path / "emb"
    r = CliRunner().invoke(
        app,
        [
            "index",
            "encode",
            "--engine",
            "ray",
            "--tower",
            str(tiny_bert_dir),
            "--data",
            str(beir),
            "--out",
            str(out),
            "--shard-size",
            str(SHARD),
            "--batch-size",
            str(BATCH),
            "--num-actors",
            "2",
            "--cpus-per-actor",
            "0.5",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "48 documents in 5 shards (5 written, 0 resumed)" in r.output
    assert _assert_same_embeddings(reference, out)


def test_cli_rejects_unknown_engine(tmp_path, beir, tiny_bert_dir):
    from typer.testing import CliRunner

    from scalingnote.cli import app

    r = CliRunner().invoke(
        app,
        [
            "index",
            "encode",
            "--engine",
            "spark",
            "--tower",
            str(tiny_bert_dir),
            "--data",
            str(beir),
            "--out",
            str(tmp_path / "e"),
        ],
    )
    assert r.exit_code != 0
    assert "choose local or ray" in str(r.exception) + r.output
