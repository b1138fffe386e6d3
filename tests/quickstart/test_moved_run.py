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
from tests.helpers.tiny_quickstart import TINY


def _cfg(tiny_models, out):
    llm, bert = tiny_models  # the tiny run of tests/helpers/tiny_quickstart.py, in this process
    return QuickstartConfig(
        out=str(out), llm=llm, bert=bert, **{**TINY, "qkd_corpus_texts": 100, "mining_round": "off"}
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
