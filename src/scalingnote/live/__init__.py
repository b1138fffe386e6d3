"""A live index (ScalingNote §3.5): add, replace and delete documents in a built index while it
serves; a write-ahead log makes every acknowledged change survive a crash; compaction and
rebuild write new generations swapped in atomically; drift metrics say when to retrain.

Layering: above ``index`` (and ``sparse``, ``models``, ``data``), below ``serve``.
"""

from scalingnote.live.errors import BackendUnavailable, LoggedNotApplied, StorageError
from scalingnote.live.index import LiveIndex, LiveSearcher, check_document_tower, load_document_tower
from scalingnote.live.records import documents_from_records, read_documents, read_ids
from scalingnote.live.wal import WriteAheadLog

__all__ = [
    "BackendUnavailable",
    "LiveIndex",
    "LoggedNotApplied",
    "StorageError",
    "LiveSearcher",
    "WriteAheadLog",
    "check_document_tower",
    "documents_from_records",
    "load_document_tower",
    "read_documents",
    "read_ids",
]
