"""One writing process per live index: an exclusive, non-blocking ``flock`` on a file beside its
write-ahead log (the FAISS live index's ``<index>/live/writer.lock``, the Milvus live index's
``<index>/live/milvus-<collection>/writer.lock``); released when the process exits, killed or not."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO

from scalingnote.errors import ScalingNoteError


def acquire_writer_lock(path: Path, busy: str) -> IO:
    """The open, locked file ``path`` (keep it open while writing); ``busy``: the error's message
    when another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise ScalingNoteError(busy) from None
    return fh
