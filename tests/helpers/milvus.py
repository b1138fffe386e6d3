"""The embedded Milvus 2.3.5 server for a test module: started on 127.0.0.1 in a fresh data
directory, or the module skipped with the reason it cannot run here."""

from __future__ import annotations

import pytest

from scalingnote.index.milvus.milvus_server import EmbeddedMilvus, milvus_server_available


def start_embedded_milvus(tmp_path_factory, name: str) -> EmbeddedMilvus:
    """A started server whose data live in a new temporary folder ``name``; the caller stops it."""
    reason = milvus_server_available()
    if reason:
        pytest.skip(reason)
    srv = EmbeddedMilvus(tmp_path_factory.mktemp(name) / "data", start_timeout_s=240)
    try:
        srv.start()
    except Exception as e:  # noqa: BLE001 - any start failure is this machine's, reported as the skip reason
        pytest.skip(f"the embedded Milvus server could not start here: {e}")
    return srv
