"""The live index over each routed structure the quick start can choose: built
with the same function the quick start calls (``build_index(..., method=...)``), documents added
and deleted through ``scalingnote index add / delete / rebuild``, searched as ``scalingnote search``
searches (the manifest's search defaults, no flags). Tiny random BERT, real FAISS, SVS and ScaNN."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from scalingnote.cli import app as cli
from scalingnote.data import Document
from scalingnote.index import build_index
from scalingnote.index.faiss.methods import assign_lists
from scalingnote.index.routing.method_tune import choose_method
from scalingnote.index.searcher import search_options
from scalingnote.index.tune import save_search_defaults
from scalingnote.live import LiveIndex


def _served(live, text_vec, k=10):
    """A search with what `scalingnote search` / `serve` pass when no flag is given."""
    return live.search(text_vec, k, **search_options(live, "faiss")).doc_ids


@pytest.fixture
def routed(tmp_path, _built_index, request):
    beir, base_dir = _built_index
    base = LiveIndex.open(base_dir, writer=False)
    vecs, ids, tower = base.store.vectors.view.copy(), list(base.store.doc_ids), base.manifest["tower"]
    base.close()
    tq = np.random.default_rng(1).standard_normal((64, vecs.shape[1])).astype(np.float32)
    # as the quick start does: the method's setting chosen on held-out queries, then built and its defaults saved
    rep = choose_method(vecs, vecs[::4], tq, methods=(request.param,), target=0.99)
    out = build_index(
        vecs,
        tmp_path / request.param,
        method=request.param,
        routing=rep["routing"],
        train_queries=tq,
        doc_ids=ids,
        tower_info=tower,
        documents=beir,
        semantic_ids_layers=0,
        progress=False,
    )
    save_search_defaults(out, rep)
    return out, vecs, ids


@pytest.mark.parametrize(
    "routed",
    [
        "ivf",
        "ivf_qmetric",
        "hnsw_pq",
        "hnsw_sq",
        "hnsw_sq_qg",
        "hnsw_lean",
        "ivf_rabitq",
        "ivf_pqfs",
        "svs_vamana",
        "scann_soar",
    ],
    indirect=True,
)
def test_add_delete_compact_rebuild_keep_the_method(routed, tiny_bert_dir, tmp_path):
    idx, vecs, ids = routed
    method = json.loads((idx / "manifest.json").read_text())["routing"]["method"]
    live = LiveIndex.open(idx, document_tower=str(tiny_bert_dir))
    new = [Document(f"c{i}", f"capybara {i}", "", f"capybara river {i}") for i in range(3)]
    live.upsert(new)
    if method == "ivf_qmetric":  # a new row goes to the list the query-metric rule names
        ivf, rows = live.index, [live.row_of[d.id] for d in new]
        want = assign_lists(live.store.routing, ivf, live.store.vectors.view[rows])
        for r, lst in zip(rows, want, strict=True):
            assert r in _list_ids(ivf, int(lst))
    live.delete([ids[0], "c0"])
    v = live.store.vectors.view[[live.row_of["c1"], live.row_of[ids[1]]]].copy()
    hits = _served(live, v, 5)
    assert hits[0][0] == "c1" and hits[1][0] == ids[1]
    gone = {d for row in _served(live, vecs[:20], 10) for d in row}
    assert ids[0] not in gone and "c0" not in gone
    live.compact()
    man = live.manifest
    assert man["routing"]["method"] == method and man["factory"].startswith(method) and live.store.tombstones == 0
    assert len(live) == len(ids) - 1 + 2 and live.index.ntotal == len(live)
    c2 = live.store.vectors.view[[live.row_of["c2"]]]
    assert "c0" not in _served(live, c2, 3)[0]
    # the compacted structure holds c2 with its vector: searched to the bottom it is its own best match (the
    # served setting was tuned on the structure before compaction; the tiny random tower's vectors are all within
    # 1e-5 cosine of one another, so how deep that setting reaches after a rebuild is not what is tested here)
    deep = {k: len(live) * 4 for k in live.manifest["search_defaults"] if k in ("nprobe", "ef_search", "rerank")}
    assert live.search(c2, 3, **deep).doc_ids[0][0] == "c2"
    live.close()
    # the CLI verbs on the same index: add (+ compaction), delete, rebuild (retrain with the same method)
    docs = tmp_path / "more.jsonl"
    docs.write_text(json.dumps({"_id": "t0", "title": "tapir", "text": "tapir snout"}) + "\n")
    for args in (
        ["index", "add", "--index", str(idx), "--docs", str(docs), "--tower", str(tiny_bert_dir)],
        ["index", "delete", "--index", str(idx), "--ids", str(_ids_file(tmp_path, ["c1"]))],
        ["index", "rebuild", "--index", str(idx)],
    ):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 0, r.output
    live = LiveIndex.open(idx, writer=False)
    assert live.manifest["routing"]["method"] == method and "c1" not in live.row_of and "t0" in live.row_of
    assert _served(live, live.store.vectors.view[[live.row_of["t0"]]], 3)[0][0] == "t0"
    live.close()


def _list_ids(ivf, lst: int) -> set[int]:
    import faiss

    n = ivf.invlists.list_size(lst)
    return set(faiss.rev_swig_ptr(ivf.invlists.get_ids(lst), n).tolist()) if n else set()


def _ids_file(tmp_path, ids):
    p = tmp_path / "ids.txt"
    p.write_text("\n".join(ids) + "\n")
    return p
