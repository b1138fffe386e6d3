"""The write-ahead log of a live index (``<index>/live/wal/``): one line per acknowledged batch.

A line is ``<crc32 hex, 8 chars> <json>\\n``; the JSON holds the sequence number, the
operation (``upsert`` with the documents, their vectors and semantic IDs, or ``delete`` with
the ids) and is appended then ``fsync``-ed before the batch is applied or acknowledged
(ScalingNote §3.5 describes the index as receiving new notes all day; this is what makes
that safe). A batch is one line, so it is all or nothing: a torn last line (a crash in the
middle of the write, never acknowledged) fails its checksum and is cut off at replay; a bad
line anywhere else is corruption and is refused with the file and line.

A failed append (a full disk, an I/O error, a failed ``fsync``) is undone before the error is
raised: the segment is cut back to its last whole record and that cut is fsync-ed, so the log
is exactly as before and the batch's sequence number is not taken. The records are written
with ``os.pwrite`` on a file descriptor (no user-space buffer that could reach the file later).
If even the cut fails (after a failed ``fsync`` the page cache is not trusted), the log takes no
further record until a later append has cut it back (a restart cuts a torn tail too).

The log is a sequence of segment files named by their first sequence number; compaction
rotates to a new segment, and once the new generation covering the old segments is
swapped in, those segments are deleted (:meth:`WriteAheadLog.drop_through`).
"""

from __future__ import annotations

import base64
import errno
import json
import logging
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.live.errors import StorageError, describe_os_error

log = logging.getLogger("scalingnote.live")
SEGMENT_SUFFIX = ".log"


def fsync_dir(path: Path) -> None:
    """Make a rename / file creation inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_durably(path: Path, obj: Any, what: str) -> None:
    """``obj`` as JSON at ``path``: temp file + fsync + rename + fsync of the directory. On failure
    (a :class:`~scalingnote.live.errors.StorageError` naming ``what``) the previous file stays and
    the temp file is removed."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, ensure_ascii=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)  # frees what it took (a full disk)
        except OSError:
            pass
        raise StorageError(
            f"{path}: writing the {what} failed: {describe_os_error(e)}; the previous {what} is kept", e.errno
        ) from None
    try:
        fsync_dir(path.parent)
    except OSError as e:
        raise StorageError(f"{path}: the new {what} may not be durable ({describe_os_error(e)})", e.errno) from None


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
    """Append-only, fsync-ed batch log. Not thread-safe: the live index serialises writers.

    ``io``: the module whose ``open`` / ``pwrite`` / ``fsync`` / ``ftruncate`` the appends call
    (``os``; the fault-injection tests pass one that fails on purpose)."""

    def __init__(self, directory: str | Path, create: bool = True, io: Any = os):
        self.dir = Path(directory)
        if create:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.io = io
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0  # bytes of whole, durable records in the open segment
        self.closed_reason: str | None = None  # a failed append could not be cut back: no record until it is
        self.last_seq = 0
        self.records = 0  # records in the log (all segments)

    # ------------------------------------------------------------------ read
    def segments(self) -> list[Path]:
        return sorted(p for p in self.dir.iterdir() if p.suffix == SEGMENT_SUFFIX)

    def replay(self, after_seq: int = 0, truncate: bool = True) -> Iterator[dict[str, Any]]:
        """Every record with ``seq > after_seq``, in order. An unterminated final fragment of the
        last segment (a write torn by a crash: never acknowledged) is cut off (logged with its
        size); a complete line that fails its checksum is corruption and raises with the file and line."""
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
                log.warning(
                    "write-ahead log %s: cut %d bytes of a torn record after line %d (a write that was never "
                    "acknowledged)",
                    seg,
                    len(tail),
                    len(lines),
                )

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
        return (
            rec
            if isinstance(rec, dict) and isinstance(rec.get("seq"), int) and rec.get("op") in ("upsert", "delete")
            else None
        )

    @staticmethod
    def _truncate(seg: Path, size: int) -> None:
        with open(seg, "r+b") as fh:
            fh.truncate(size)
            fh.flush()
            os.fsync(fh.fileno())

    # ------------------------------------------------------------------ write
    def _open(self, path: Path) -> None:
        """Open ``path`` for appends (created if new); a fragment after its last newline (a torn
        record nobody cut yet) is cut first, so a new record never follows a torn one."""
        self.close()
        fd = None
        try:
            fd = self.io.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = os.pread(fd, size, 0)
                good = data.rfind(b"\n") + 1
                os.ftruncate(fd, good)
                os.fsync(fd)
                log.warning("write-ahead log %s: cut %d bytes of a torn record", path, size - good)
                size = good
            fsync_dir(self.dir)
        except OSError as e:
            if fd is not None:
                os.close(fd)
            raise StorageError(
                f"{path}: cannot open the write-ahead log for writing: {describe_os_error(e)}", e.errno
            ) from None
        self._fd, self._path, self._size = fd, path, size

    def _ready(self) -> None:
        """The segment open for appends, and a failed append left behind cut back (or a StorageError)."""
        if self._fd is None:
            segs = self.segments()
            self._open(segs[-1] if segs else self.dir / f"{self.last_seq + 1:016d}{SEGMENT_SUFFIX}")
            self.closed_reason = None  # _open cut any fragment
        if self.closed_reason is not None:
            try:
                self.io.ftruncate(self._fd, self._size)
                self.io.fsync(self._fd)
            except OSError as e:
                raise StorageError(
                    f"{self._path}: the write-ahead log is closed for writing: {self.closed_reason}, and cutting it "
                    "back "
                    f"failed again ({describe_os_error(e)}); nothing was written",
                    e.errno,
                ) from None
            log.warning("write-ahead log %s: cut back to its last whole record; writing again", self._path)
            self.closed_reason = None

    def append(self, record: dict[str, Any]) -> int:
        """Write ``record`` (gets the next ``seq``) and fsync it; returns its seq. Only after this
        returns is the batch acknowledged. On failure the log is cut back to before it (the seq is
        not taken) and a :class:`~scalingnote.live.errors.StorageError` is raised."""
        self._ready()
        seq = self.last_seq + 1
        line = _encode_line({"seq": seq, **record})
        try:
            done = 0
            while done < len(line):
                n = self.io.pwrite(self._fd, line[done:], self._size + done)
                if n <= 0:
                    raise OSError(errno.EIO, "write returned no progress")
                done += n
            self.io.fsync(self._fd)
        except OSError as e:
            self._undo(e)
        self._size += len(line)
        self.last_seq = seq
        self.records += 1
        return seq

    def _undo(self, e: OSError) -> None:
        """Cut the failed record off (truncate to the last whole record, fsync) and raise."""
        why = describe_os_error(e)
        try:
            self.io.ftruncate(self._fd, self._size)
            self.io.fsync(self._fd)
        except OSError as e2:
            self.closed_reason = f"appending failed ({why}) and cutting the record off failed ({describe_os_error(e2)})"
            raise StorageError(
                f"{self._path}: writing the write-ahead log failed: {why}; cutting the record off failed too "
                f"({describe_os_error(e2)}): the log is closed for writing until a later write can cut it back, and "
                "the "
                "batch may be applied if the service restarts before that",
                e.errno,
                outcome_unknown=True,
            ) from None
        raise StorageError(
            f"{self._path}: writing the write-ahead log failed: {why}; nothing of the batch was kept", e.errno
        ) from None

    def rotate(self) -> int:
        """Start a new segment for records after the current last seq; returns that seq (every
        record of the older segments is <= it)."""
        self._ready()  # never leave a torn record in a closed segment
        self._open(self.dir / f"{self.last_seq + 1:016d}{SEGMENT_SUFFIX}")
        return self.last_seq

    def drop_through(self, seq: int) -> None:
        """Delete the segments whose records are all <= ``seq`` (covered by a swapped-in generation)."""
        segs = self.segments()
        for i, seg in enumerate(segs):
            nxt_first = int(segs[i + 1].stem) if i + 1 < len(segs) else None
            if nxt_first is not None and nxt_first <= seq + 1 and self._path != seg:
                seg.unlink()
        fsync_dir(self.dir)
        self.records = sum(1 for s in self.segments() for line in open(s, "rb") if line.strip())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd, self._path = None, None
