"""A failed write to the live index's storage (a full disk, an I/O error) changes nothing that was
acknowledged and keeps nothing that was refused: the write-ahead log is cut back to its last
whole record, sequence numbers and Milvus row keys are taken only by durable records, a torn
tail is cut at restart, and a Milvus batch logged but not applied survives a compaction."""

from __future__ import annotations

import errno
import logging
import os

import numpy as np
import pytest

from scalingnote.data import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.live import LiveIndex, WriteAheadLog


def _open(idx, tiny_bert_dir, **kw):
    return LiveIndex.open(idx, None, document_tower=str(tiny_bert_dir), **kw)


def _fail(monkeypatch, name: str, times: int = 1, err: int = errno.ENOSPC, partial: bool = False):
    """``os.<name>`` raises ``err`` on its next ``times`` calls (``partial``: a write first puts
    half of its bytes in the file, as a full disk does); the real function afterwards."""
    real = getattr(os, name)
    left = [times]

    def fake(*args):
        if left[0] > 0:
            left[0] -= 1
            if partial and name == "pwrite":
                fd, data, off = args
                real(fd, data[: len(data) // 2], off)
            raise OSError(err, os.strerror(err))
        return real(*args)

    monkeypatch.setattr(os, name, fake)
    return left


def _vec(live, n, seed):
    return np.random.default_rng(seed).standard_normal((n, live.dim)).astype(np.float32)


def test_a_refused_batch_never_comes_back_and_takes_no_sequence_number(live_index, tiny_bert_dir, monkeypatch):
    """fsync of the appended record fails: the request is refused, so its record must not be
    replayed at restart (before: the record stayed in the file and the next batch reused its seq)."""
    live = _open(live_index, tiny_bert_dir)
    live.upsert([Document("ok1", "one", "", "alpha")], vectors=_vec(live, 1, 0))
    _fail(monkeypatch, "fsync", err=errno.EIO)
    with pytest.raises((OSError, ScalingNoteError)):
        live.upsert([Document("refused", "two", "", "beta")], vectors=_vec(live, 1, 1))
    monkeypatch.undo()
    assert "refused" not in live.row_of
    r = live.upsert([Document("ok2", "three", "", "gamma")], vectors=_vec(live, 1, 2))
    assert r["seq"] == 2
    live.close()
    again = _open(live_index, tiny_bert_dir)
    assert "refused" not in again.row_of and {"ok1", "ok2"} <= set(again.row_of) and again.replayed == 2
    again.close()


def test_a_short_write_leaves_no_torn_line_in_the_middle(live_index, tiny_bert_dir, monkeypatch):
    """A full disk takes half of the record; the next batch (space back) is acknowledged after it:
    the restart must read both acknowledged batches (before: line 2 was torn, restart refused)."""
    live = _open(live_index, tiny_bert_dir)
    live.upsert([Document("ok1", "one", "", "alpha")], vectors=_vec(live, 1, 0))
    _fail(monkeypatch, "pwrite", partial=True)
    with pytest.raises(ScalingNoteError, match="ENOSPC"):
        live.upsert([Document("refused", "two", "", "beta")], vectors=_vec(live, 1, 1))
    monkeypatch.undo()
    live.upsert([Document("ok2", "three", "", "gamma")], vectors=_vec(live, 1, 2))
    seg = live.wal.segments()[-1]
    live.close()
    assert len(seg.read_bytes().split(b"\n")) == 3  # two whole lines, nothing between them
    again = _open(live_index, tiny_bert_dir)
    assert "refused" not in again.row_of and {"ok1", "ok2"} <= set(again.row_of)
    again.close()


def test_a_torn_tail_is_cut_at_restart_with_a_log_line(tmp_path, caplog):
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append({"op": "delete", "ids": ["a"]})
    wal.close()
    with open(wal.segments()[0], "ab") as fh:
        fh.write(b'0badc0de {"seq": 2, "op": "del')  # a write a kill tore
    with caplog.at_level(logging.WARNING, logger="scalingnote.live"):
        assert [r["seq"] for r in WriteAheadLog(tmp_path / "wal").replay()] == [1]
    assert "cut 30 bytes" in caplog.text


def test_when_the_log_cannot_be_cut_back_it_takes_no_record_until_it_can(tmp_path, monkeypatch):
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append({"op": "delete", "ids": ["a"]})
    _fail(monkeypatch, "fsync", times=2, err=errno.EIO)  # the record's fsync, then the cut's
    with pytest.raises(ScalingNoteError, match="closed for writing") as e:
        wal.append({"op": "delete", "ids": ["b"]})
    assert e.value.outcome_unknown and e.value.cause == "EIO"
    _fail(monkeypatch, "ftruncate", err=errno.EIO)  # still cannot cut: refused, nothing written
    size = wal.segments()[0].stat().st_size
    with pytest.raises(ScalingNoteError, match="closed for writing"):
        wal.append({"op": "delete", "ids": ["c"]})
    assert wal.segments()[0].stat().st_size == size
    monkeypatch.undo()
    assert wal.append({"op": "delete", "ids": ["d"]}) == 2  # cut back first, then appended
    wal.close()
    assert [r["ids"] for r in WriteAheadLog(tmp_path / "wal").replay()] == [["a"], ["d"]]


def test_a_compaction_that_runs_out_of_space_removes_its_generation_and_keeps_the_log(
    live_index, tiny_bert_dir, monkeypatch
):
    import scalingnote.live.generation as gen_mod

    live = _open(live_index, tiny_bert_dir)
    live.upsert([Document("ok1", "one", "", "alpha")], vectors=_vec(live, 1, 0))

    def full(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(gen_mod, "_fsync_tree", full)
    with pytest.raises(ScalingNoteError, match="ENOSPC.*the log is kept"):
        live.compact()
    monkeypatch.undo()
    ldir = live_index / "live"
    assert (
        not [p for p in ldir.iterdir() if p.name.startswith("gen-")] and not (ldir / "CURRENT").exists()
    )  # its space is free again
    live.upsert([Document("ok2", "two", "", "beta")], vectors=_vec(live, 1, 1))
    assert live.compact()["documents"] == 50
    live.close()
    again = _open(live_index, tiny_bert_dir)
    assert {"ok1", "ok2"} <= set(again.row_of) and len(again) == 50
    again.close()
