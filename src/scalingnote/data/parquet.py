"""Where :mod:`scalingnote.index` imports the corpus entry point from today; the readers and the
format table live in :mod:`scalingnote.data.corpus` (import them from there)."""

from scalingnote.data.corpus import iter_parquet_corpus, open_corpus

__all__ = ["iter_parquet_corpus", "open_corpus"]
