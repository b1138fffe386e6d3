"""Atomic file output: write to a temporary name in the same directory, then rename.

A reader never sees a half-written file, and an interrupted write leaves the
previous version (if any) intact.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from scalingnote.errors import ConfigError


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success.

    Use for libraries that want a file name (FAISS, safetensors, numpy). ``suffix`` ends
    the temporary name (``np.save`` appends ``.npy`` unless the name already ends with it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + suffix, dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual mode
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary file for writing; it replaces ``path`` only if the block succeeds."""
    if "b" in mode:
        encoding = None
    with atomic_path(path) as tmp:
        with open(tmp, mode, encoding=encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """Atomically write ``obj`` as JSON (UTF-8, non-ASCII kept readable)."""
    with atomic_write(path) as fh:
        json.dump(obj, fh, indent=indent, ensure_ascii=False, sort_keys=False)
        fh.write("\n")


def write_jsonl(path: str | Path, records: Iterable[Any]) -> int:
    """Atomically write one JSON value per line (UTF-8, non-ASCII kept readable); returns the count."""
    n = 0
    with atomic_write(path) as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_json(path: str | Path, *, unreadable: str | None = None) -> Any:
    """Parse a JSON file; a missing/unreadable file or invalid JSON is a :class:`ConfigError`
    naming the file (and the line). ``unreadable`` says what the file should have been."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        why = f"cannot read ({e.strerror or e}): {unreadable}" if unreadable else f"cannot read: {e.strerror or e}"
        raise ConfigError(path, None, None, why) from None
    except json.JSONDecodeError as e:
        raise ConfigError(path, e.lineno, None, f"invalid JSON: {e.msg}") from None


def relocated(recorded: str | Path, root: str | Path) -> Path:
    """A path a run recorded, read from the run directory ``root`` as it is now: ``recorded`` when it
    lies under ``root``, else the longest tail of it found under ``root`` (the run directory was
    moved or copied since: its own files, not the original's), else ``recorded``."""
    p, root = Path(recorded), Path(root)
    try:
        p.resolve().relative_to(root.resolve())
        return p
    except (ValueError, OSError):
        pass
    for i in range(1, len(p.parts)):
        q = root.joinpath(*p.parts[i:])
        if q.exists():
            return q
    return p
