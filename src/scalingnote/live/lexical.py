"""The BM25 side of a live index: the saved bm25s index (the *base segment*, built at the last
compaction) plus an in-memory *delta segment* of the documents added since, merged at query
time.

How it stays current, and the bound: a document enters the delta segment in the same locked
step that adds it to the dense index, so BM25 and hybrid search see it as soon as its ingest
is acknowledged (delay 0). A replaced or deleted document is filtered out of the base segment
at query time (a base hit counts only while its id still maps to the row the segment indexed).
The delta is scored with BM25 (Lucene IDF, bm25s's k1 / b) using document frequencies of base
+ delta and the base's mean length, so its scores sit on the base's scale; compaction
(:mod:`scalingnote.live.generation`) refits one bm25s index over every live document, which
makes scoring exact again and empties the delta.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from scalingnote.data.corpus import iter_corpus
from scalingnote.data.types import Document, Run
from scalingnote.errors import ScalingNoteError
from scalingnote.sparse.bm25 import BM25Retriever, _tokenizer, open_or_build_bm25

log = logging.getLogger("scalingnote.live")


class LiveBM25:
    """Base bm25s segment + delta segment; ``search`` has :class:`BM25Retriever`'s signature."""

    def __init__(self, base: BM25Retriever | None, base_rows: Mapping[str, int], language: str = "en"):
        self.base = base
        self.base_rows = dict(base_rows)  # doc id -> dense row the base segment indexed
        self.language = base.language if base is not None else language
        self.config = base.config if base is not None else None
        self.fingerprint = base.fingerprint if base is not None else None
        self._tok = _tokenizer(self.language)
        self._stop = set(self._tok.stopwords or ())
        self.postings: dict[str, dict[int, int]] = defaultdict(dict)  # term -> {row: tf}
        self.lengths: dict[int, int] = {}  # delta row -> length (terms)
        self.delta_ids: dict[int, str] = {}
        self._base_df, self._base_n, self._avgdl = self._base_stats()
        self.row_of: Mapping[str, int] = {}  # the live map id -> row (set by the live index)
        self._base_stale = 0  # base documents no longer current (over-fetched at query time)

    def _base_stats(self) -> tuple[dict[str, int], int, float]:
        if self.base is None:
            return {}, 0, 0.0
        r = self.base._retriever
        indptr = np.asarray(r.scores["indptr"])
        df = np.diff(indptr)
        n = int(r.scores.get("num_docs", len(self.base.doc_ids)))
        return {w: int(df[i]) for w, i in r.vocab_dict.items() if i < len(df)}, n, 0.0

    def terms(self, text: str) -> list[str]:
        """bm25s's analysis (lower-case, split, stop words, stemmer) as strings."""
        t = self._tok
        words = t.splitter(text.lower() if t.lower else text)
        out = [w for w in words if w not in self._stop]
        return [t.stemmer(w) for w in out] if t.stemmer is not None else out

    @property
    def doc_ids(self) -> list[str]:
        """The documents BM25 can return (live ones)."""
        return list(self.row_of)

    @property
    def n_delta(self) -> int:
        return len(self.lengths)

    # ------------------------------------------------------------------ mutation (under the lock)
    def add(self, docs: Sequence[Document], first_row: int) -> None:
        for j, d in enumerate(docs):
            row = first_row + j
            tf = Counter(self.terms(d.text))
            for w, c in tf.items():
                self.postings[w][row] = c
            self.lengths[row] = sum(tf.values())
            self.delta_ids[row] = d.id
        if self.lengths:
            self._avgdl = float(np.mean(list(self.lengths.values())))

    # ------------------------------------------------------------------ search (under the lock)
    def search(self, queries: Mapping[str, str], k: int = 1000, show_progress: bool = False) -> Run:
        """Top-``k`` live documents per query: base hits still current + delta hits, by score."""
        run: Run = {}
        over = k + self._base_stale if self.base is not None else 0
        base_run = self.base.search(queries, k=max(1, over), show_progress=False) if self.base is not None else {}
        for qid, text in queries.items():
            scores: dict[str, float] = {}
            for d, s in base_run.get(qid, {}).items():
                if self.row_of.get(d) == self.base_rows.get(d):
                    scores[d] = s
            scores.update(self._delta_scores(text))
            run[qid] = dict(sorted(scores.items(), key=lambda x: (-x[1], x[0]))[:k])
        return run

    def refresh(self) -> None:
        """Recount the base documents replaced or deleted since the base was built (after a change)."""
        self._base_stale = sum(1 for d, r in self.base_rows.items() if self.row_of.get(d) != r)

    def _delta_scores(self, text: str) -> dict[str, float]:
        """BM25 (Lucene IDF; bm25s's k1, b) of the live delta documents."""
        if not self.lengths:
            return {}
        k1 = self.config.k1 if self.config else 1.5
        b = self.config.b if self.config else 0.75
        n = self._base_n + len(self.lengths)
        avgdl = self._avgdl or 1.0
        acc: dict[int, float] = defaultdict(float)
        for w in set(self.terms(text)):
            post = self.postings.get(w)
            if not post:
                continue
            df = self._base_df.get(w, 0) + len(post)
            idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            for row, tf in post.items():
                acc[row] += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * self.lengths[row] / avgdl))
        out = {}
        for row, s in acc.items():
            d = self.delta_ids[row]
            if self.row_of.get(d) == row and s > 0:
                out[d] = float(s)
        return out


def open_live_bm25(gen: Path, doc_ids: Sequence[str], row_of: dict[str, int], src: Path | None) -> LiveBM25 | None:
    """The BM25 side of a live index over the directory ``gen`` (its saved ``bm25``, else built from
    the documents of ``doc_ids`` in the corpus ``src``), its rows numbered by ``row_of``; None
    (with a warning) when there is none."""
    try:
        if src is None:
            base = open_or_build_bm25(gen)
        else:
            wanted = set(doc_ids)
            docs = [d for d in iter_corpus(src, on_invalid="skip") if d.id in wanted]
            base = open_or_build_bm25(gen, docs, show_progress=False) if docs else None
    except (ScalingNoteError, OSError) as e:
        log.warning("live index %s: no BM25 side (%s)", gen, e)
        return None
    if base is None:
        return None
    lex = LiveBM25(base, {d: row_of[d] for d in base.doc_ids if d in row_of})
    lex.row_of = row_of
    return lex
