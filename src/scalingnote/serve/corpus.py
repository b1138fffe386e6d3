"""What the service shows beside document ids: titles and snippets from the corpus (when the
index stores none), and the BM25 index for the bm25 / hybrid modes."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scalingnote.data.corpus import find_corpus, iter_corpus
from scalingnote.errors import ScalingNoteError
from scalingnote.index.docstore import index_corpus, make_snippet
from scalingnote.index.hybrid import HybridSearcher, load_fusion
from scalingnote.sparse.bm25 import open_or_build_bm25

log = logging.getLogger("scalingnote.serve")


def resolve_corpus_path(index_manifest: dict[str, Any], corpus: str | Path | None) -> Path | None:
    """The corpus to read titles from: ``corpus`` if given (a BEIR directory or a corpus file
    of any registered format), else the corpus recorded with the index's document store
    (``manifest["documents"]["source"]``) or by the embeddings the index was built from
    (``manifest["embeddings_dir"]/manifest.json["corpus"]["path"]``), else None."""
    if corpus is not None:
        return find_corpus(corpus).path
    return index_corpus(index_manifest)


def load_documents(corpus_path: Path | None, doc_ids: Sequence[str], index=None) -> dict[str, tuple[str, str]]:
    """``{doc_id: (title, snippet)}`` for the indexed documents: from the index's document
    store (``docs.jsonl``) when it has one, else read from ``corpus_path`` (others skipped)."""
    if (
        index is not None
        and getattr(index, "titles", None) is not None
        and getattr(index, "snippets", None) is not None
    ):
        return {d: (t, sn) for d, t, sn in zip(index.doc_ids, index.titles, index.snippets, strict=True)}
    if corpus_path is None:
        return {}
    wanted = set(doc_ids)
    docs: dict[str, tuple[str, str]] = {}
    # on_invalid="skip": a bad record costs one title, not the service (the index was built already)
    for doc in iter_corpus(corpus_path, on_invalid="skip"):
        if doc.id in wanted:
            docs[doc.id] = (doc.title or "", make_snippet(doc.content or doc.topic or ""))
    return docs


def load_bm25(index_dir: Path, corpus_path: Path | None, doc_ids: Sequence[str]):
    """The BM25 index beside the dense index (``<index>/bm25``): reused while its fingerprint
    matches the indexed documents of ``corpus_path``, else built once and saved; without a
    corpus, the saved one (or None). A failure costs the bm25/hybrid modes, not the service."""
    try:
        if corpus_path is None:
            return open_or_build_bm25(index_dir)
        wanted = set(doc_ids)
        docs = [d for d in iter_corpus(corpus_path, on_invalid="skip") if d.id in wanted]
        return open_or_build_bm25(index_dir, docs, show_progress=False) if docs else None
    except (ScalingNoteError, OSError) as e:
        log.warning("scalingnote serve: no BM25 index (modes bm25 and hybrid are off): %s", e)
        return None


def served_searcher(index, corpus_path: Path | None):
    """What the service answers searches with over ``index`` (a dense or live index with a local
    directory): its fusion and default mode from ``fusion.json`` beside it (the quick start's
    choice), its BM25 side (a live index's own, with the delta segment), and ``dense`` as the
    default when the index has no BM25. Returns ``(searcher, default_mode)``; the quick start
    measures its served row through this same function."""
    local = index.local_dir
    fusion, mode = load_fusion(local)
    live = getattr(index, "searcher", None)  # a live index has its own BM25 side (delta segment)
    searcher = (
        live(fusion)
        if live is not None
        else HybridSearcher(index, load_bm25(local, corpus_path, index.doc_ids), fusion=fusion)
    )
    return searcher, (mode if mode in searcher.modes else "dense")
