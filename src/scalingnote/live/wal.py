"""The write-ahead log of a live index (``<index>/live/wal/``): one line per acknowledged batch.

A line is ``<crc32 hex, 8 chars> <json>\\n``; the JSON holds the sequence number, the
operation (``upsert`` with the documents, their vectors and semantic IDs, or ``delete`` with
the ids) and is appended then ``fsync``-ed before the batch is applied or acknowledged
(ScalingNote §3.5 describes the index as receiving new notes all day; this is what makes
that safe). A batch is one line, so it is all or nothing: a torn last line (a crash in the
middle of the write, never acknowledged) fails its checksum and is cut off at replay; a bad
line anywhere else is corruption and is refused with the file and line.

The log is a sequence of segment files named by their first sequence number; compaction
rotates to a new segment, and once the new generation covering the old segments is
swapped in, those segments are deleted (:meth:`WriteAheadLog.drop_through`).
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError

SEGMENT_SUFFIX = ".log"


def fsync_dir(path: Path) -> None:
    """Make a rename / file creation inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pack_array(a: np.ndarray | None) -> dict[str, Any] | None:
    """A numpy array as JSON (dtype, shape, base64 of the raw bytes): exact, compact enough."""
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    return {"dtype": str(a.dtype), "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def unpack_array(d: dict[str, Any] | None) -> np.ndarray | None:
    if d is None:
        return None
    return np.frombuffer(base64.b64decode(d["b64"]), dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


def _encode_line(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return b"%08x " % zlib.crc32(body) + body + b"\n"


class WriteAheadLog:
    """Append-only, fsync-ed batch log. Not thread-safe: the live index serialises writers."""

    def __init__(self, directory: str | Path, create: bool = True):
        self.dir = Path(directory)
        if create:
            self.dir.mkdir(parents=True, exist_ok=True)
        self._fh = None
        self.last_seq = 0
        self.records = 0  # records in the log (all segments)

    # ------------------------------------------------------------------ read
    def segments(self) -> list[Path]:
        return sorted(p for p in self.dir.iterdir() if p.suffix == SEGMENT_SUFFIX)

    def replay(self, after_seq: int = 0, truncate: bool = True) -> Iterator[dict[str, Any]]:
        """Every record with ``seq > after_seq``, in order. An unterminated final fragment of the
        last segment (a write torn by a crash: never acknowledged) is cut off; a complete line
        that fails its checksum is corruption and raises with the file and line."""
        segs = self.segments()
        self.records = 0
        for si, seg in enumerate(segs):
            data = seg.read_bytes()
            lines = data.split(b"\n")
            tail = lines.pop()  # b"" when the segment ends with a newline, else a torn fragment
            good_bytes = 0
            for lineno, line in enumerate(lines, start=1):
                rec = self._parse(line)
                if rec is None:
                    raise ScalingNoteError(f"{seg}: line {lineno}: corrupt write-ahead-log record (checksum or JSON)")
                good_bytes += len(line) + 1
                self.records += 1
                self.last_seq = max(self.last_seq, int(rec["seq"]))
                if rec["seq"] > after_seq:
                    yield rec
            if tail and truncate:
                if si != len(segs) - 1:
                    raise ScalingNoteError(f"{seg}: line {len(lines) + 1}: unterminated record in a closed segment")
                self._truncate(seg, good_bytes)

    @staticmethod
    def _parse(line: bytes) -> dict[str, Any] | None:
        if len(line) < 10 or line[8:9] != b" ":
            return None
        body = line[9:]
        try:
            if int(line[:8], 16) != zlib.crc32(body):
                return None
            rec = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
        return rec if isinstance(rec, dict) and isinstance(rec.get("seq"), int) and rec.get("op") in ("upsert", "delete") else None

    @staticmethod
    def _truncate(seg: Path, size: int) -> None:
        with open(seg, "r+b") as fh:
            fh.truncate(size)
            fh.flush()
            os.fsync(fh.fileno())

    # ------------------------------------------------------------------ write
    def _open_segment(self, first_seq: int) -> None:
        if self._fh is not None:
            self._fh.close()
        path = self.dir / f"{first_seq:016d}{SEGMENT_SUFFIX}"
        self._fh = open(path, "ab")
        fsync_dir(self.dir)

    def append(self, record: dict[str, Any]) -> int:
        """Write ``record`` (gets the next ``seq``) and fsync it; returns its seq. Only after this
        returns is the batch acknowledged."""
        seq = self.last_seq + 1
        if self._fh is None:
            segs = self.segments()
            if segs:
                self._fh = open(segs[-1], "ab")
            else:
                self._open_segment(seq)
        line = _encode_line({"seq": seq, **record})
        self._fh.write(line)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.last_seq = seq
        self.records += 1
        return seq

    def rotate(self) -> int:
        """Start a new segment for records after the current last seq; returns that seq (every
        record of the older segments is <= it)."""
        self._open_segment(self.last_seq + 1)
        return self.last_seq

    def drop_through(self, seq: int) -> None:
        """Delete the segments whose records are all <= ``seq`` (covered by a swapped-in generation)."""
        segs = self.segments()
        for i, seg in enumerate(segs):
            nxt_first = int(segs[i + 1].stem) if i + 1 < len(segs) else None
            if nxt_first is not None and nxt_first <= seq + 1 and (self._fh is None or Path(self._fh.name) != seg):
                seg.unlink()
        fsync_dir(self.dir)
        self.records = sum(1 for s in self.segments() for line in open(s, "rb") if line.strip())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
