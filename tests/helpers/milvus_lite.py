"""The Milvus live index on Milvus Lite for a test module: a :class:`~scalingnote.live.milvus.MilvusLive`
opened over the collection the ``lite`` fixture (tests/live/conftest.py) exports, and the rows per
document id as Milvus holds them (a filter query, not a search). Import only after
``pytest.importorskip("pymilvus")`` and ``("milvus_lite")``."""

from __future__ import annotations

import json

from scalingnote.index.milvus.milvus import DOC_ID, connect
from scalingnote.live.milvus import MilvusLive


def open_live(db, idx, tower, **kw) -> MilvusLive:
    """The live index over collection ``docs`` of ``db``, its log and checkpoint beside ``idx``."""
    return MilvusLive.open(db, None, collection="docs", document_tower=str(tower), live_dir=idx, **kw)


def row_counts(db, ids) -> dict[str, int]:
    """Rows per id in the collection (a filter query, not a search)."""
    c = connect(db)
    try:
        rows = c.query("docs", filter=f"{DOC_ID} in {json.dumps(ids)}", output_fields=[DOC_ID])
    finally:
        c.close()
    return {i: sum(r[DOC_ID] == i for r in rows) for i in ids}
