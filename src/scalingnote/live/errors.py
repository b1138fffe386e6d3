"""The write failures of a live index, each with what it means for the batch being written.

* :class:`StorageError`: a write to the index's own files (the write-ahead log, a generation, a
  checkpoint) failed -- a full disk (``ENOSPC``), an I/O error (``EIO``) or another ``OSError``.
  The log is as it was before the failed append (the batch was not kept and will not come back),
  unless ``outcome_unknown`` says the log could not be cut back (the batch may then be applied
  at restart; the log takes no further record until it has been cut back).
* :class:`BackendUnavailable`: the search back end (Milvus) refused a write and nothing of the
  batch was logged.
* :class:`LoggedNotApplied`: the batch is in the fsync-ed log, but the back end refused it; it is
  applied before the next write (or compaction) goes ahead, or when the service restarts.
"""

from __future__ import annotations

import errno as _errno
import os

from scalingnote.errors import ScalingNoteError


class StorageError(ScalingNoteError):
    """A failed write to the index's storage; ``errno`` says why (``cause``: its name, e.g. ``ENOSPC``)."""

    def __init__(self, message: str, errno: int | None = None, outcome_unknown: bool = False):
        super().__init__(message)
        self.errno = errno
        self.outcome_unknown = outcome_unknown

    @property
    def cause(self) -> str:
        return _errno.errorcode.get(self.errno or 0, "EIO")

    @property
    def disk_full(self) -> bool:
        return self.errno in (_errno.ENOSPC, _errno.EDQUOT)


def describe_os_error(e: OSError) -> str:
    """``ENOSPC (No space left on device)``: the errno's name and its text."""
    name = _errno.errorcode.get(e.errno or 0, "OSError")
    return f"{name} ({e.strerror or os.strerror(e.errno or 0) or e})"


class BackendUnavailable(ScalingNoteError):
    """The search back end refused a write; nothing of the batch was logged or applied."""


class LoggedNotApplied(ScalingNoteError):
    """The batch is durable in the write-ahead log; the back end has not applied it yet."""


__all__ = ["BackendUnavailable", "LoggedNotApplied", "StorageError", "describe_os_error"]
