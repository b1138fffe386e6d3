"""The one entry point for documents: every stage reads a corpus through this module.

:data:`FORMATS` is the table of corpus formats, keyed by name. An entry says how a file of the
format is recognised (its suffixes), which file holds the corpus in a BEIR directory
(``beir_file``), whether a directory of such files is one corpus (``sharded``), how to read it
and, optionally, how to count its documents quickly (for progress bars):

==========  ==================  ====================  ==============================================
name        suffixes            BEIR directory file   also
==========  ==================  ====================  ==============================================
``jsonl``   ``.jsonl``          ``corpus.jsonl``      BEIR ``_id``/``title``/``text``/``topic``; the
                                                      default for a file with an unknown suffix
``parquet`` ``.parquet``        ``corpus.parquet``    the same columns; a directory of ``*.parquet``
                                                      files is one corpus (files in name order)
==========  ==================  ====================  ==============================================

A path is recognised so: a directory holds one of the ``beir_file`` names (``corpus.jsonl``
first, then the other formats' by format name), else files of a ``sharded`` format; a file is
read by the format owning its suffix, a file with no known suffix as JSONL; ``format=`` (a name
or ``"package.module:reader"``) overrides recognition.

User code adds a format with :func:`register_corpus_format` (a reader yielding
:class:`~scalingnote.data.types.Document`); from then on every stage (training data, TMJ
data, scaling sweeps, BM25, encoding and indexing, the service's titles, pseudo-queries) reads
it. A registered reader's documents are checked here like the built-in ones: each must be a
``Document`` with a non-empty id, ids must be unique, documents with empty title and text are
skipped with one warning. Errors name the file, the line (or row / document number) and the
field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from scalingnote.data.beir import BeirDataset, load_qrels, load_queries, qrels_path
from scalingnote.data.beir import iter_corpus as iter_jsonl_corpus
from scalingnote.data.corpus_checks import DocumentScreen, OnInvalid, Reader, checked_reader
from scalingnote.data.types import Document
from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.utils.registry import Registry, import_dotted

_EMPTY = "empty documents (title and text both empty)"


@dataclass(frozen=True)
class CorpusFormat:
    """One row of :data:`FORMATS`."""

    name: str
    read: Reader  #: called as ``read(path, on_invalid=..., on_empty=...)``
    suffixes: tuple[str, ...]  #: lower-case file name endings, e.g. ``(".jsonl",)``
    beir_file: str | None = None  #: the corpus file of this format in a BEIR directory
    sharded: bool = False  #: a directory of files with these suffixes is one corpus
    count: Callable[[Path], int] | None = None  #: fast document count (progress bars); None: unknown


#: The table of corpus formats. Extend it with :func:`register_corpus_format`.
FORMATS: Registry[CorpusFormat] = Registry("corpus format")
DEFAULT_FORMAT = "jsonl"  #: a file whose suffix no format owns is read as this; first in a BEIR directory


def _formats() -> list[CorpusFormat]:
    """The formats in recognition order: the default first, then the others by name."""
    return [FORMATS.get(n) for n in sorted(FORMATS.names(), key=lambda n: (n != DEFAULT_FORMAT, n))]


# ----------------------------------------------------------------------------- registration
def register_corpus_format(
    name: str,
    read: Callable[..., Iterable[Document]],
    *,
    suffixes: Iterable[str],
    beir_file: str | None = None,
    sharded: bool = False,
    count: Callable[[Path], int] | None = None,
    validates: bool = False,
    replace: bool = False,
) -> CorpusFormat:
    """Add a corpus format to :data:`FORMATS` (user code calls this; no product file changes).

    ``read(path)`` yields the :class:`Document` s of one file (a reader should raise
    :class:`~scalingnote.errors.DataError` naming file, line and field for a bad record).
    ``suffixes`` recognise a file (``".tsv"``); ``beir_file`` names the corpus file in a BEIR
    directory (default ``"corpus" + suffixes[0]``). Unless ``validates=True`` (then ``read`` is
    called with ``on_invalid`` / ``on_empty`` and checks everything itself, like the built-ins),
    the documents are checked here. An existing name raises unless ``replace=True``."""
    if not callable(read):
        raise ScalingNoteError(f"corpus format {name!r}: the reader must be callable, got {type(read).__name__}")
    sfx = tuple(s.lower() if isinstance(s, str) else s for s in suffixes)
    if not sfx or any(not isinstance(s, str) or not s.startswith(".") or len(s) < 2 for s in sfx):
        raise ScalingNoteError(f"corpus format {name!r}: suffixes must be like '.tsv', got {tuple(suffixes)!r}")
    for other in _formats():
        taken = sorted(set(sfx) & set(other.suffixes))
        if other.name != name and taken:
            raise ScalingNoteError(
                f"corpus format {name!r}: suffix {taken[0]!r} already belongs to format {other.name!r}"
            )
    fmt = CorpusFormat(
        name, read if validates else checked_reader(read, name), sfx, beir_file or f"corpus{sfx[0]}", sharded, count
    )
    return FORMATS.register(name, fmt, replace=replace)


def get_corpus_format(spec: str | CorpusFormat, option: str = "format") -> CorpusFormat:
    """A format by name, or a reader given as ``"package.module:attribute"`` (a
    :class:`CorpusFormat`, or a ``read(path)`` function used as an unregistered format);
    ``option`` names the setting in errors."""
    if isinstance(spec, CorpusFormat):
        return spec
    obj = FORMATS.get(spec, option=option)
    if isinstance(obj, CorpusFormat):
        return obj
    if callable(obj):
        return CorpusFormat(spec, checked_reader(obj, spec), ())
    raise ScalingNoteError(
        f"{option}: {spec!r} is neither a CorpusFormat nor a reader function (got {type(obj).__name__})"
    )


# ----------------------------------------------------------------------------- recognition
@dataclass(frozen=True)
class CorpusSource:
    """A recognised corpus: the file (or the directory of shards) and its format."""

    path: Path
    format: CorpusFormat

    def read(self, on_invalid: OnInvalid = "error", on_empty: OnInvalid = "skip") -> Iterator[Document]:
        return iter(self.format.read(self.path, on_invalid=on_invalid, on_empty=on_empty))

    def count(self) -> int | None:
        return self.format.count(self.path) if self.format.count is not None else None


def _shard_files(directory: Path, fmt: CorpusFormat) -> list[Path]:
    return sorted(f for f in directory.iterdir() if f.is_file() and f.name.lower().endswith(fmt.suffixes))


def find_corpus(path: str | Path, format: str | CorpusFormat | None = None) -> CorpusSource:
    """Recognise the corpus at ``path`` (a BEIR directory, a corpus file, a directory of shards);
    ``format`` (a name or ``"package.module:reader"``) overrides recognition."""
    p = Path(path)
    forced = get_corpus_format(format) if format is not None else None
    candidates = [forced] if forced is not None else _formats()
    if p.is_dir():
        for fmt in candidates:
            if fmt.beir_file and (p / fmt.beir_file).is_file():
                return CorpusSource(p / fmt.beir_file, fmt)
        for fmt in candidates:
            if fmt.sharded and _shard_files(p, fmt):
                return CorpusSource(p, fmt)
        looked = [f.beir_file for f in candidates if f.beir_file] + [
            f"*{f.suffixes[0]}" for f in candidates if f.sharded
        ]
        raise DataError(
            p,
            None,
            None,
            f"no corpus in this directory (looked for {', '.join(looked)}; formats: {', '.join(FORMATS.names())})",
        )
    if not p.exists():
        known = ", ".join(s for f in _formats() for s in f.suffixes)
        raise DataError(p, None, None, f"corpus file not found (expected a BEIR directory or a corpus file: {known})")
    if forced is not None:
        return CorpusSource(p, forced)
    owners = [(len(s), f) for f in _formats() for s in f.suffixes if p.name.lower().endswith(s)]
    return CorpusSource(p, max(owners, key=lambda t: t[0])[1] if owners else FORMATS.get(DEFAULT_FORMAT))


def _corpus_files(data_dir: Path) -> list[tuple[CorpusFormat, Path]]:
    """Each registered format whose corpus file (``beir_file``, or ``corpus<suffix>``) is in ``data_dir``."""
    found = []
    for fmt in _formats():
        names = dict.fromkeys([fmt.beir_file, *(f"corpus{s}" for s in fmt.suffixes)] if fmt.beir_file else [])
        hit = next((data_dir / n for n in names if (data_dir / n).is_file()), None)
        if hit is not None:
            found.append((fmt, hit))
    return found


def _looked_for() -> str:
    return ", ".join(f"{f.beir_file} ({f.name})" for f in _formats() if f.beir_file)


def find_corpus_file(data_dir: str | Path, format: str | CorpusFormat | None = None) -> Path:
    """The corpus file of a BEIR directory, detected by the registered formats' file names
    (``corpus.jsonl``, ``corpus.parquet``, a registered format's ``corpus.tsv`` ...); ``format``
    (a name or ``"package.module:reader"``) names the one to take. A :class:`DataError` naming the
    directory and the formats looked for when there is none, or several (the stages that read the
    directory would take the first, so one corpus file is the rule)."""
    d = Path(data_dir)
    if not d.is_dir():
        raise DataError(d, None, None, f"not a directory (give a BEIR directory holding one of: {_looked_for()})")
    found = _corpus_files(d)
    if format is not None:
        fmt = get_corpus_format(format)
        if not any(f.name == fmt.name for f, _ in found):
            raise DataError(
                d,
                None,
                None,
                f"no corpus file of format {fmt.name!r} in this directory (found: "
                f"{', '.join(p.name for _, p in found) or 'none'}; looked for {_looked_for()})",
            )
    if not found:
        raise DataError(
            d,
            None,
            None,
            f"no corpus file in this directory (looked for {_looked_for()}; "
            "register a format for another file, see scalingnote.data.corpus.register_corpus_format)",
        )
    if len(found) > 1:
        raise DataError(
            d,
            None,
            None,
            "several corpus files in this directory ("
            + ", ".join(f"{p.name} ({f.name})" for f, p in found)
            + "): keep one, every stage reads the directory's corpus",
        )
    return found[0][1]


def use_corpus_format(spec: str, data_dir: str | Path | None = None) -> str:
    """Make the corpus format ``spec`` readable by every stage of this process; returns its name.

    ``spec`` is a registered name (returned as it is), or a dotted path ``"package.module:attr"``
    naming a :class:`CorpusFormat` (registered under its own name) or a reader function
    ``read(path)`` yielding :class:`Document` s, registered under the dotted path's name with
    ``:`` as ``.`` for the file ``corpus.<suffix>`` of ``data_dir`` whose suffix no registered
    format owns (``corpus.csv``: suffix ``.csv``). Registering the same spec again is a no-op."""
    if spec in FORMATS:
        return spec
    obj = import_dotted(spec, "corpus format", "corpus format")
    if isinstance(obj, CorpusFormat):
        if obj.name in FORMATS and FORMATS.get(obj.name) == obj:
            return obj.name
        return FORMATS.register(obj.name, obj).name
    if not callable(obj):
        raise ScalingNoteError(
            f"corpus format {spec!r}: neither a CorpusFormat nor a reader function (got {type(obj).__name__})"
        )
    name = spec.replace(":", ".")
    if name in FORMATS:  # registered by an earlier call
        return name
    if data_dir is None:
        raise ScalingNoteError(
            f"corpus format {spec!r}: a reader function needs the data directory, to find its corpus.<suffix> file"
        )
    return register_corpus_format(name, obj, suffixes=(_unowned_corpus_suffix(Path(data_dir), spec),)).name


def _unowned_corpus_suffix(d: Path, spec: str) -> str:
    """The suffix of the one ``corpus.*`` file of ``d`` that no registered format reads."""
    owned = {s for f in _formats() for s in f.suffixes}
    cands = sorted(
        p.name[len("corpus") :].lower()
        for p in (d.iterdir() if d.is_dir() else [])
        if p.is_file() and p.name.lower().startswith("corpus.") and p.name[len("corpus") :].lower() not in owned
    )
    if len(cands) != 1:
        what = "no corpus.<suffix> file" if not cands else f"several ({', '.join('corpus' + c for c in cands)})"
        raise DataError(
            d,
            None,
            None,
            f"corpus format {spec!r}: {what} that the registered formats ({', '.join(FORMATS.names())}) "
            "do not read already; the reader reads one such file",
        )
    return cands[0]


# ----------------------------------------------------------------------------- reading
def iter_corpus(
    path: str | Path,
    on_invalid: OnInvalid = "error",
    on_empty: OnInvalid = "skip",
    *,
    format: str | CorpusFormat | None = None,
) -> Iterator[Document]:
    """Stream the documents of a corpus in any registered format (see the module docstring).
    ``on_invalid="skip"`` skips invalid records with one warning; ``on_empty="error"`` refuses
    documents whose title and text are both empty (skipped with one warning by default)."""
    return find_corpus(path, format).read(on_invalid, on_empty)


def load_corpus(
    path: str | Path,
    on_invalid: OnInvalid = "error",
    on_empty: OnInvalid = "skip",
    *,
    format: str | CorpusFormat | None = None,
) -> dict[str, Document]:
    """``{id: Document}`` of a corpus in any registered format, in corpus order."""
    return {d.id: d for d in iter_corpus(path, on_invalid, on_empty, format=format)}


def open_corpus(
    corpus: str | Path | Iterable[Document], *, format: str | CorpusFormat | None = None
) -> tuple[Iterator[Document], str | None, int | None]:
    """Documents of a corpus path (any registered format) or of an iterable of documents; plus
    the source path (recorded in manifests: the file, or the directory of shards) and a total
    for the progress bar (None when unknown)."""
    if not isinstance(corpus, (str, Path)):
        docs = list(corpus) if not isinstance(corpus, Iterator) else corpus
        total = len(docs) if isinstance(docs, list) else None
        return iter(docs), None, total
    src = find_corpus(corpus, format)
    total = src.count()
    return src.read(), str(src.path), total


def load_beir(
    root: str | Path, split: str = "test", on_invalid: OnInvalid = "error", graded: bool = False
) -> BeirDataset:
    """Load a BEIR directory: its corpus (any registered format), ``queries.jsonl`` and
    ``qrels/<split>.tsv``. ``queries`` keeps only queries judged in the split; qrels that point
    at unknown query or document ids are an error (file, line, field)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(root, None, None, "BEIR directory not found")
    corpus = load_corpus(root, on_invalid)
    all_queries = load_queries(root / "queries.jsonl", on_invalid)
    qrels = load_qrels(qrels_path(root, split, graded), all_queries.keys(), corpus.keys())
    queries = {qid: all_queries[qid] for qid in qrels}
    return BeirDataset(root, split, corpus, queries, qrels, all_queries)


# ----------------------------------------------------------------------------- built-in formats
def _count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def _read_jsonl(path: Path, on_invalid: OnInvalid = "error", on_empty: OnInvalid = "skip") -> Iterator[Document]:
    return iter_jsonl_corpus(path, on_invalid, on_empty)


def parquet_files(path: Path) -> list[Path]:
    """A ``.parquet`` file, or the ``*.parquet`` files of a directory in name order."""
    return _shard_files(path, FORMATS.get("parquet")) if path.is_dir() else [path]


def _count_parquet(path: Path) -> int:
    import pyarrow.parquet as pq

    total = 0
    for f in parquet_files(path):
        try:
            total += pq.ParquetFile(f).metadata.num_rows
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise DataError(f, None, None, f"cannot read as Parquet ({type(e).__name__}: {e})") from None
    return total


def _read_parquet(path: Path, on_invalid: OnInvalid = "error", on_empty: OnInvalid = "skip") -> Iterator[Document]:
    return iter_parquet_corpus(parquet_files(path), on_invalid=on_invalid, on_empty=on_empty)


def iter_parquet_corpus(
    files: Iterable[str | Path], batch_rows: int = 8192, on_invalid: OnInvalid = "error", on_empty: OnInvalid = "skip"
) -> Iterator[Document]:
    """Documents from Parquet files in order, with the BEIR corpus columns: ``_id`` (or
    ``id``), ``text`` (or ``content``), optional ``title`` / ``topic``.

    Same rules as the JSONL reader: a missing/non-string/empty id or a missing text is an error
    naming file, row and column (skipped with one warning under ``on_invalid="skip"``);
    duplicate ids are an error; documents whose title and text are both empty are skipped with
    one warning (an error under ``on_empty="error"``).
    """
    import pyarrow.parquet as pq

    screen = DocumentScreen(on_invalid, on_empty)
    for f in files:
        f = Path(f)
        try:
            pf = pq.ParquetFile(f)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise DataError(f, None, None, f"cannot read as Parquet ({type(e).__name__}: {e})") from None
        cols = _parquet_columns(f, set(pf.schema_arrow.names))
        row = 0
        for rb in pf.iter_batches(batch_size=batch_rows, columns=[c for c in cols if c is not None]):
            data = rb.to_pydict()
            for j in range(rb.num_rows):
                values = {c: data[c][j] for c in cols if c is not None}
                rown = row + j + 1  # 1-based row number, like line numbers
                make = partial(_parquet_document, f, rown, cols, values)
                doc = screen.admit(f, f"row {rown}", make, cols[0], cols[3])
                if doc is not None:
                    yield doc
            row += rb.num_rows
    screen.report()


def _parquet_columns(f: Path, names: set[str]) -> tuple[str, str | None, str | None, str]:
    """The (id, title, topic, text) columns of a Parquet corpus file."""

    def col(key: str, aliases: tuple[str, ...] = (), required: bool = True) -> str | None:
        for k in (key, *aliases):
            if k in names:
                return k
        if required:
            raise DataError(f, None, key, f"missing required column (columns: {sorted(names)})")
        return None

    c_id, c_text = col("_id", ("id",)), col("text", ("content",))
    return c_id, col("title", required=False), col("topic", required=False), c_text  # type: ignore[return-value]


def _parquet_document(f: Path, rown: int, cols: tuple[str, str | None, str | None, str], values: dict) -> Document:
    def get(c: str | None, required: bool) -> str:
        if c is None:
            return ""
        v = values[c]
        if v is None:
            if required:
                raise DataError(f, None, c, f"row {rown}: missing value (null)")
            return ""
        if not isinstance(v, str):
            raise DataError(f, None, c, f"row {rown}: expected a string, got {type(v).__name__} {v!r:.60}")
        return v

    c_id, c_title, c_topic, c_text = cols
    doc_id = get(c_id, True).strip()
    if not doc_id:
        raise DataError(f, None, c_id, f"row {rown}: must not be empty")
    return Document(doc_id, get(c_title, False), get(c_topic, False), get(c_text, True))


register_corpus_format("jsonl", _read_jsonl, suffixes=(".jsonl",), count=_count_lines, validates=True)
register_corpus_format(
    "parquet", _read_parquet, suffixes=(".parquet",), sharded=True, count=_count_parquet, validates=True
)

__all__ = [
    "DEFAULT_FORMAT",
    "FORMATS",
    "CorpusFormat",
    "CorpusSource",
    "find_corpus",
    "find_corpus_file",
    "get_corpus_format",
    "iter_corpus",
    "load_beir",
    "load_corpus",
    "open_corpus",
    "parquet_files",
    "register_corpus_format",
    "use_corpus_format",
]
