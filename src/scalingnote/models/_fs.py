"""Atomic directory output: build a directory under a temporary name, then rename it into place.

A crash (or Ctrl-C) while writing leaves at most a hidden ``.<name>.*.tmp`` directory
beside the target, never a half-written target.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_dir(path: str | Path, replace: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``path``; rename it onto ``path`` on success.

    If ``path`` already exists when the block finishes: with ``replace=False`` the new
    directory is discarded (another process won the race and produced the same thing);
    with ``replace=True`` the old directory is moved aside, the new one renamed in, and
    the old one deleted.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; give the final directory normal permissions
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        if not replace:
            shutil.rmtree(tmp, ignore_errors=True)
            return
        old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.rename(tmp, path)
    except OSError:
        # A concurrent writer created ``path`` between our check and the rename.
        shutil.rmtree(tmp, ignore_errors=True)
        if not path.exists():
            raise
