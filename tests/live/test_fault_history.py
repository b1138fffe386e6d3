"""Every write point of the live index fails once in turn (in-process: the log's ``io`` seam or a
patched function), on FAISS and on Milvus Lite; after a restart the history checker finds every
acknowledged add / replace / delete, nothing refused, nothing twice. Slow: the same on a real
8 MB tmpfs filled to 40 KB free, with a SIGKILL after the space came back."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks._faults import History, build_synthetic_index, check, open_live, points_of, run_point
from benchmarks._faults_disk import run_disk_full


@pytest.fixture(scope="module")
def base_idx(tmp_path_factory):
    return build_synthetic_index(tmp_path_factory.mktemp("fault-base"))


def _milvus_lite():
    pytest.importorskip("pymilvus", reason="pymilvus is not installed")
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")


def _assert_clean(row):
    assert row["restart_ok"], row
    assert row["faults_injected"] >= 1, row  # the fault did happen
    assert (row["lost"], row["resurrected"], row["duplicated"]) == (0, 0, 0), row


@pytest.mark.parametrize("point", points_of("faiss"))
def test_faiss_write_point_fails_once(point, base_idx, tmp_path):
    _assert_clean(run_point("faiss", point, tmp_path / "w", base_idx))


@pytest.mark.parametrize("point", points_of("milvus"))
def test_milvus_write_point_fails_once(point, base_idx, tmp_path):
    _milvus_lite()
    _assert_clean(run_point("milvus", point, tmp_path / "w", base_idx))


def test_the_checker_sees_a_lost_and_a_resurrected_document(base_idx, tmp_path):
    """The checker can fail: a document removed behind the log's back is lost, a refused version
    applied anyway is resurrected."""
    import shutil

    from scalingnote.data import Document

    idx = shutil.copytree(base_idx, tmp_path / "idx")
    hist = History(seed=1)
    live = open_live("faiss", idx, None)
    for _ in range(4):
        hist.run(live, hist.next_op(hist.present()))
    assert check(live, hist) == {"lost": 0, "resurrected": 0, "duplicated": 0}
    victim = next(d["_id"] for op in hist.ops if op["op"] == "upsert" for d in op["docs"] if hist.expected()[d["_id"]])
    live._apply_delete([victim])  # gone without a log record
    assert check(live, hist)["lost"] == 1
    hist.batch = (1, 2)
    op = hist.next_op([])  # one new document, refused, yet applied
    hist.ops.append({**op, "outcome": "refused"})
    d = op["docs"][0]
    v = hist.vectors[d["title"]]
    x = (v / np.linalg.norm(v))[None].astype(np.float32)
    live._apply_upsert([Document(d["_id"], d["title"], "", d["text"])], x, live.rkm.assign(x))  # without a log record
    assert check(live, hist) == {"lost": 1, "resurrected": 1, "duplicated": 0}
    live.close()


@pytest.mark.slow  # a child process filling a real tmpfs, killed (about 10 s per back end; needs root)
@pytest.mark.parametrize("backend", ["faiss", "milvus"])
def test_a_full_tmpfs_then_sigkill_loses_nothing_and_keeps_nothing_refused(backend, base_idx, tmp_path):
    if backend == "milvus":
        _milvus_lite()
    row = run_disk_full(backend, tmp_path / "w", base_idx)
    if "skipped" in row:
        pytest.skip(row["skipped"])
    assert row["killed"] and row["refused"] >= 1 and row["acknowledged_docs_after_freeing"] >= 200, row
    _assert_clean(row)
