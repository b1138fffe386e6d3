"""Upsert / delete in a Milvus Lite collection exported from a FAISS index (pymilvus)."""

from __future__ import annotations

import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed")

from scalingnote.data import Document  # noqa: E402
from scalingnote.errors import ScalingNoteError  # noqa: E402


def test_milvus_lite_upsert_replace_delete(live_index, tiny_bert_dir, other_bert_dir, tmp_path):
    from scalingnote.index.milvus import MilvusSearcher
    from scalingnote.index.milvus_export import export_to_milvus
    from scalingnote.live.milvus import MilvusLive
    from scalingnote.models import load_tower

    db = str(tmp_path / "live.db")
    export_to_milvus(live_index, db, "docs", index_type="FLAT", progress=False)
    with pytest.raises(ScalingNoteError, match="fingerprint"):
        _ = MilvusLive(db, "docs", document_tower=str(other_bert_dir)).document_tower
    w = MilvusLive(db, "docs", document_tower=str(tiny_bert_dir))
    doc_tower = w.document_tower
    new = Document("m1", "ocelot", "", "ocelot spots")
    w.upsert([new])
    vec = doc_tower.encode_documents([new], show_progress=False)
    qt = load_tower(tiny_bert_dir, role="query")
    with MilvusSearcher.open(db, "docs", query_tower=qt) as ms:
        got = ms.search(vec, 3)
        assert got.doc_ids[0][0] == "m1" and got.semantic_ids[0, 0].min() >= 0
    w.upsert([Document("m1", "lynx", "", "lynx ears"), Document("d0", "replaced", "", "kangaroo")])  # replace a live and an exported doc
    with MilvusSearcher.open(db, "docs", query_tower=qt) as ms:
        ids = ms.search(vec, 48).doc_ids[0]  # (MilvusSearcher caps k at the exported n_vectors, 48)
        assert ids.count("m1") == 1 and ids.count("d0") == 1
    w.delete(["m1", "d0"])
    with MilvusSearcher.open(db, "docs", query_tower=qt) as ms:
        ids = ms.search(vec, 48).doc_ids[0]
        assert "m1" not in ids and "d0" not in ids and len(ids) == 47  # 49 - 2
    w.close()
