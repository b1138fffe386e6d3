"""Searching a live index: the hits' titles and snippets, and the hybrid searcher over a live
index (:class:`~scalingnote.live.LiveIndex` or the Milvus live index)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from scalingnote.data.types import Document
from scalingnote.index.docstore import make_snippet
from scalingnote.index.hybrid import FusionConfig, HybridSearcher
from scalingnote.index.searcher import SearchResult
from scalingnote.live.lexical import LiveBM25


class LiveSource(Protocol):
    """What :class:`LiveSearcher` needs of a live index beyond the dense searcher's interface: the
    lock a search holds, the BM25 side and the rows of the visible documents
    (:class:`~scalingnote.live.LiveIndex`, :class:`~scalingnote.live.milvus.MilvusLive`)."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    @property
    def lexical(self) -> LiveBM25 | None: ...

    @property
    def row_of(self) -> dict[str, int]: ...


def title_and_snippet(d: Document) -> tuple[str, str]:
    """A hit's title and snippet from the document itself (one added since the generation)."""
    return d.title or "", make_snippet(d.content or d.topic or "")


def attach_titles(res, of_row: Callable[[int], tuple[str, str]]):
    """Fill ``res.titles`` / ``res.snippets`` with ``of_row(row)`` of each hit's row."""
    pairs = [[of_row(int(r)) for r in row if r >= 0] for row in res.indices]
    res.titles = [[t for t, _ in p] for p in pairs]
    res.snippets = [[sn for _, sn in p] for p in pairs]
    return res


class LiveSearcher(HybridSearcher):
    """:class:`~scalingnote.index.hybrid.HybridSearcher` over a live index (dense, bm25, hybrid);
    a search holds the index lock, so it sees whole batches."""

    def __init__(self, live: LiveSource, fusion: FusionConfig | None = None):
        self.dense = live
        self.fusion = fusion or FusionConfig()

    @property
    def bm25(self):
        return self.dense.lexical

    @property
    def _row(self):
        return self.dense.row_of

    def search(self, *args: Any, **kw: Any) -> SearchResult:
        """:meth:`HybridSearcher.search <scalingnote.index.hybrid.HybridSearcher.search>` under the index lock."""
        with self.dense.lock:
            return super().search(*args, **kw)
