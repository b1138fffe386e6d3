"""Writing a Milvus collection for :func:`~scalingnote.index.milvus.milvus_export.export_to_milvus`:
its schema, the rows in batches, the wait for the server's index, and the clean-up of a failed one."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.milvus.milvus import DOC_ID, PK, SEM_ID, VECTOR

LIVE_ID_BYTES = 2048  # the longest id POST /documents accepts (512 characters), in UTF-8 bytes


def collection_schema(client, pm, tower: dict[str, Any], max_len: int, n_layers: int | None, d: int):
    DataType = pm.DataType
    description = "scalingnote: document tower {name} (compat_id {compat}, fingerprint {fp})".format(
        name=tower.get("name", "?"), compat=tower.get("compat_id", "?"), fp=tower.get("fingerprint", "?")
    )
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False, description=description)
    schema.add_field(PK, DataType.INT64, is_primary=True)
    # room for the ids the live index adds later (scalingnote.live.records: <= 512 characters = 2048 UTF-8 bytes)
    schema.add_field(DOC_ID, DataType.VARCHAR, max_length=max(LIVE_ID_BYTES, max_len))
    if n_layers is not None:
        schema.add_field(SEM_ID, DataType.ARRAY, element_type=DataType.INT32, max_capacity=max(1, n_layers))
    schema.add_field(VECTOR, DataType.FLOAT_VECTOR, dim=d)
    return schema


def insert_rows(
    client, name: str, vecs, ids: list[str], sem, batch_size: int, progress: bool, source: str, collection: str
) -> None:
    """Insert every row (primary key = row number, document id, semantic ID, vector) in batches."""
    from tqdm.auto import tqdm

    n = len(ids)
    with tqdm(total=n, unit="vec", desc=f"milvus insert {collection}", disable=not progress, dynamic_ncols=True) as bar:
        for s in range(0, n, batch_size):
            block = np.ascontiguousarray(np.asarray(vecs[s : s + batch_size], dtype=np.float32))
            if not np.all(np.isfinite(block)):
                bad = s + int(np.argwhere(~np.isfinite(block))[0, 0])
                raise ScalingNoteError(f"{source}: row {bad} (document {ids[bad]!r}) contains non-finite values")
            rows = []
            for j in range(len(block)):
                r: dict[str, Any] = {PK: s + j, DOC_ID: ids[s + j], VECTOR: block[j]}
                if sem is not None:
                    r[SEM_ID] = [int(c) for c in sem[s + j]]
                rows.append(r)
            client.insert(name, rows)
            bar.update(len(rows))


def drop_quietly(client, name: str) -> None:
    try:
        if client.has_collection(name):
            client.drop_collection(name)
    except Exception:  # noqa: BLE001 - best effort clean-up
        pass


def wait_indexed(client, name: str, n: int, timeout_s: float) -> None:
    """Wait until the index covers all ``n`` rows (a server builds indexes asynchronously)."""
    t0 = time.perf_counter()
    while True:
        desc = client.describe_index(name, VECTOR) or {}
        state = str(desc.get("state", "Finished"))
        if state.lower() == "failed":
            raise ScalingNoteError(
                f"Milvus failed to build the index on {name!r}: {desc.get('index_state_fail_reason') or desc}"
            )
        indexed = desc.get("indexed_rows")
        pending = desc.get("pending_index_rows", 0)
        if (indexed is None or int(indexed) >= n) and not pending and state.lower() in ("finished", "3"):
            return
        if time.perf_counter() - t0 > timeout_s:
            raise ScalingNoteError(
                f"index on {name!r} not built after {timeout_s:.0f}s (state {state}, {indexed}/{n} rows indexed)"
            )
        time.sleep(0.5)
