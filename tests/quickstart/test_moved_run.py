"""A quick-start output moved whole (``mv runs/quickstart /data/qs``) is the same run: a re-run there
redoes no step, neither chooses nor builds its index again, and the index finds its document tower and
corpus in the new place (``serve``, ``search --mode hybrid`` and ``index add`` need no flags)."""

from __future__ import annotations

import shutil
from pathlib import Path

from scalingnote.data import Document
from scalingnote.index.docstore import index_corpus
from scalingnote.index.layout import read_manifest
from scalingnote.live import LiveIndex
from scalingnote.quickstart import QuickstartConfig, quickstart


def _cfg(tiny_models, out):
    llm, bert = tiny_models
    return QuickstartConfig(
        out=str(out),
        llm=llm,
        bert=bert,
        llm_depths=[1],
        llm_small_layers=1,
        bert_small_layers=1,
        dim=32,
        synth_docs=120,
        synth_queries=60,
        steps=3,
        batch_size=4,
        qkd_epochs=1.0,
        qkd_batch_size=16,
        qkd_max_pseudo_queries=60,
        qkd_corpus_texts=100,
        semantic_id_layers=2,
        query_max_length=16,
        doc_max_length=64,
        show_progress=False,
        head_lrs=[1e-3],
        compare="none",
        mining_round="off",
    )


def test_a_moved_run_resumes_every_step_and_serves_from_its_new_place(tiny_models, tmp_path):
    rows = quickstart(_cfg(tiny_models, tmp_path / "a"))
    moved = Path(shutil.move(tmp_path / "a", tmp_path / "b"))  # nothing is left where the run was made
    index = moved / "index" / "ivfpq"
    stamps = {m: m.stat().st_mtime_ns for m in [*moved.glob("**/DONE"), index / "manifest.json"]}
    again = quickstart(_cfg(tiny_models, moved))
    assert {m: m.stat().st_mtime_ns for m in stamps} == stamps  # no step redone, the index neither chosen nor built
    assert [r["ndcg@10"] for r in again] == [r["ndcg@10"] for r in rows]
    man = read_manifest(index)  # its tower and corpus, where they now are
    corpus = index_corpus(man)
    assert Path(man["tower"]["path"]).is_relative_to(moved.resolve())
    assert corpus is not None and corpus.is_relative_to(moved.resolve())
    live = LiveIndex.open(index)  # `index add` without --tower: the fine-tuned tower found in the moved run
    try:
        live.upsert([Document("n1", "narwhal", "", "a narwhal swims under the ice")])
        assert live.searcher().search(["narwhal"], 3, mode="bm25").doc_ids[0][0] == "n1"
    finally:
        live.close()
