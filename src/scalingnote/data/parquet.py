"""Corpus readers beyond BEIR JSONL: Parquet files with the BEIR corpus columns, and
:func:`open_corpus`, the one entry point of corpus encoding (JSONL, Parquet or documents)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from scalingnote.data.beir import iter_corpus
from scalingnote.data.types import Document
from scalingnote.errors import DataError, ScalingNoteError


def corpus_files(corpus: str | Path) -> tuple[str, list[Path]]:
    """``("jsonl", [file])`` or ``("parquet", [files...])`` for a BEIR directory, a
    ``corpus.jsonl`` file, a ``.parquet`` file or a directory of ``.parquet`` files."""
    p = Path(corpus)
    if p.is_dir():
        if (p / "corpus.jsonl").is_file():
            return "jsonl", [p / "corpus.jsonl"]
        if (p / "corpus.parquet").is_file():
            return "parquet", [p / "corpus.parquet"]
        files = sorted(f for f in p.glob("*.parquet") if f.is_file())
        if files:
            return "parquet", files
        raise ScalingNoteError(f"{p}: no corpus.jsonl, corpus.parquet or *.parquet files in this directory")
    if not p.exists():
        raise ScalingNoteError(f"{p}: corpus file not found (expected a BEIR directory, a corpus.jsonl or a .parquet file)")
    if p.suffix == ".parquet":
        return "parquet", [p]
    return "jsonl", [p]


def iter_parquet_corpus(files: Iterable[str | Path], batch_rows: int = 8192) -> Iterator[Document]:
    """Documents from Parquet files in order, with the BEIR corpus columns: ``_id`` (or
    ``id``), ``text`` (or ``content``), optional ``title`` / ``topic``.

    Same rules as :func:`scalingnote.data.iter_corpus`: a missing/non-string/empty id or
    a missing text is an error naming file, row and column; duplicate ids are an error;
    documents whose title and text are both empty are skipped with one warning.
    """
    import warnings

    import pyarrow.parquet as pq

    seen: dict[str, tuple[str, int]] = {}
    n_empty, first_empty = 0, None
    for f in files:
        f = Path(f)
        try:
            pf = pq.ParquetFile(f)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise DataError(f, None, None, f"cannot read as Parquet ({type(e).__name__}: {e})") from None
        names = set(pf.schema_arrow.names)

        def col(key: str, aliases: tuple[str, ...] = (), required: bool = True, names=names, f=f) -> str | None:
            for k in (key, *aliases):
                if k in names:
                    return k
            if required:
                raise DataError(f, None, key, f"missing required column (columns: {sorted(names)})")
            return None

        c_id, c_text = col("_id", ("id",)), col("text", ("content",))
        c_title, c_topic = col("title", required=False), col("topic", required=False)
        cols = [c for c in (c_id, c_title, c_topic, c_text) if c is not None]
        row = 0
        for rb in pf.iter_batches(batch_size=batch_rows, columns=cols):
            data = rb.to_pydict()
            for j in range(rb.num_rows):
                rown = row + j + 1  # 1-based row number, like line numbers

                def get(c: str | None, required: bool, rown=rown, data=data, j=j) -> str:
                    if c is None:
                        return ""
                    v = data[c][j]
                    if v is None:
                        if required:
                            raise DataError(f, None, c, f"row {rown}: missing value (null)")
                        return ""
                    if not isinstance(v, str):
                        raise DataError(f, None, c, f"row {rown}: expected a string, got {type(v).__name__} {v!r:.60}")
                    return v

                doc_id = get(c_id, True).strip()
                if not doc_id:
                    raise DataError(f, None, c_id, f"row {rown}: must not be empty")
                title, topic, content = get(c_title, False), get(c_topic, False), get(c_text, True)
                if doc_id in seen:
                    pf0, r0 = seen[doc_id]
                    raise DataError(f, None, c_id, f"row {rown}: duplicate document id {doc_id!r} (first seen in {pf0}, row {r0})")
                seen[doc_id] = (str(f), rown)
                if not (title.strip() or content.strip()):
                    n_empty += 1
                    first_empty = first_empty or f"{f}, row {rown}"
                    continue
                yield Document(doc_id, title, topic, content)
            row += rb.num_rows
    if n_empty:
        warnings.warn(f"skipped {n_empty} empty documents (title and text both empty; first: {first_empty})", stacklevel=2)


def open_corpus(corpus: str | Path | Iterable[Document]) -> tuple[Iterator[Document], str | None, int | None]:
    """Documents from a BEIR directory, a ``corpus.jsonl``, a ``.parquet`` file or a directory of
    them, or an iterable of documents; plus the source path (recorded in manifests) and a total
    for the progress bar (None when unknown)."""

    if not isinstance(corpus, (str, Path)):
        docs = list(corpus) if not isinstance(corpus, Iterator) else corpus
        total = len(docs) if isinstance(docs, list) else None
        return iter(docs), None, total
    kind, files = corpus_files(corpus)
    if kind == "jsonl":
        with open(files[0], "rb") as fh:
            total = sum(1 for line in fh if line.strip())
        return iter_corpus(files[0]), str(files[0]), total
    import pyarrow.parquet as pq

    total = 0
    for f in files:
        try:
            total += pq.ParquetFile(f).metadata.num_rows
        except Exception as e:  # noqa: BLE001
            raise DataError(f, None, None, f"cannot read as Parquet ({type(e).__name__}: {e})") from None
    src = str(files[0]) if len(files) == 1 else str(Path(corpus))
    return iter_parquet_corpus(files), src, total


__all__ = ["corpus_files", "iter_parquet_corpus", "open_corpus"]
