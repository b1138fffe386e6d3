"""The corpus entry point: the format table, recognition of files and BEIR directories,
registration from user code, and errors that name file, line (or document / row) and field."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import pytest

from scalingnote.data import Document, corpus, write_corpus
from scalingnote.data.corpus import (
    find_corpus,
    get_corpus_format,
    iter_corpus,
    load_corpus,
    open_corpus,
    register_corpus_format,
)
from scalingnote.data.jsonl import iter_text_lines
from scalingnote.errors import DataError, ScalingNoteError

DOCS = [
    Document("d1", "Vitamin D", "", "Vitamin D lowers the risk of fractures."),
    Document("d2", "", "topicA", "内容 二 with unicode"),
    Document("d3", "Knee pain", "", "Running and knee pain in adults."),
    Document("d4", "Obesity", "", "Obesity and attention deficit."),
]
#: the tests' own format name and suffix: a format a user registers ("tsv", ".tsv") never collides with them
TSV, SFX = "test_corpus_tsv", ".testtsv"


@pytest.fixture(autouse=True)
def _scoped_table():
    """Registration changes the table: what a test registers is gone after it."""
    with corpus.FORMATS.scoped():
        yield


def _write_parquet(path: Path, docs: list[Document], **extra_cols) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {
        "_id": [d.id for d in docs],
        "title": [d.title for d in docs],
        "topic": [d.topic for d in docs],
        "text": [d.content for d in docs],
    }
    cols.update(extra_cols)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path, row_group_size=3)
    return path


def read_tsv(path: Path):
    """A user reader: ``id<TAB>title<TAB>text`` with a header line."""
    for lineno, line in iter_text_lines(path):
        parts = line.rstrip("\n").split("\t")
        if lineno == 1 and parts[0] == "id":
            continue
        if len(parts) != 3:
            raise DataError(path, lineno, None, f"expected 3 tab-separated columns (id, title, text), got {len(parts)}")
        yield Document(parts[0], parts[1], "", parts[2])


def _write_tsv(path: Path, docs: list[Document]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("id\ttitle\ttext\n" + "".join(f"{d.id}\t{d.title}\t{d.content}\n" for d in docs), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- built-in formats
def test_jsonl_and_parquet_read_the_same_documents_in_order(tmp_path):
    write_corpus(tmp_path / "c.jsonl", DOCS)
    _write_parquet(tmp_path / "c.parquet", DOCS)
    assert list(iter_corpus(tmp_path / "c.jsonl")) == DOCS
    assert list(iter_corpus(tmp_path / "c.parquet")) == DOCS
    assert list(load_corpus(tmp_path / "c.parquet")) == [d.id for d in DOCS]


def test_recognition_of_files_and_directories(tmp_path):
    beir = tmp_path / "beir"
    write_corpus(beir / "corpus.jsonl", DOCS)
    _write_parquet(beir / "corpus.parquet", DOCS[:2])
    # a BEIR directory: corpus.jsonl first (table order), then corpus.parquet
    assert (find_corpus(beir).path, find_corpus(beir).format.name) == (beir / "corpus.jsonl", "jsonl")
    (beir / "corpus.jsonl").unlink()
    assert (find_corpus(beir).path, find_corpus(beir).format.name) == (beir / "corpus.parquet", "parquet")
    # a directory of Parquet shards is one corpus, files in name order
    shards = tmp_path / "shards"
    _write_parquet(shards / "part-001.parquet", DOCS[2:])
    _write_parquet(shards / "part-000.parquet", DOCS[:2])
    (shards / "README.txt").write_text("not a shard")
    src = find_corpus(shards)
    assert (src.path, src.format.name) == (shards, "parquet")
    assert list(iter_corpus(shards)) == DOCS
    # a file by its suffix (case-insensitive); an unknown suffix is read as JSONL
    _write_parquet(tmp_path / "UPPER.PARQUET", DOCS)
    assert find_corpus(tmp_path / "UPPER.PARQUET").format.name == "parquet"
    write_corpus(tmp_path / "docs.json", DOCS)
    assert find_corpus(tmp_path / "docs.json").format.name == "jsonl"
    assert list(iter_corpus(tmp_path / "docs.json")) == DOCS
    # format= overrides recognition
    write_corpus(tmp_path / "docs.data", DOCS)
    assert list(iter_corpus(tmp_path / "docs.data", format="jsonl")) == DOCS
    with pytest.raises(DataError, match="cannot read as Parquet"):
        list(iter_corpus(tmp_path / "docs.data", format="parquet"))


def test_open_corpus_gives_source_and_total(tmp_path):
    write_corpus(tmp_path / "beir" / "corpus.jsonl", DOCS)
    docs, source, total = open_corpus(tmp_path / "beir")
    assert (list(docs), source, total) == (DOCS, str(tmp_path / "beir" / "corpus.jsonl"), 4)
    _write_parquet(tmp_path / "shards" / "a.parquet", DOCS[:1])
    _write_parquet(tmp_path / "shards" / "b.parquet", DOCS[1:])
    docs, source, total = open_corpus(tmp_path / "shards")
    assert (list(docs), source, total) == (DOCS, str(tmp_path / "shards"), 4)
    docs, source, total = open_corpus(DOCS)
    assert (list(docs), source, total) == (DOCS, None, 4)
    docs, source, total = open_corpus(iter(DOCS))
    assert (list(docs), source, total) == (DOCS, None, None)


def test_missing_and_empty_inputs_name_the_path(tmp_path):
    with pytest.raises(DataError, match=r"nope\.tsv: corpus file not found") as e:
        iter_corpus(tmp_path / "nope.tsv")
    assert e.value.path == str(tmp_path / "nope.tsv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: no corpus in this directory \(looked for corpus\.jsonl, ") as e:
        iter_corpus(tmp_path / "empty")
    looked = str(e.value).split("looked for ")[1].split(";")[0].split(", ")
    assert {"corpus.parquet", "*.parquet"} <= set(looked)  # every registered format's file (a user's too)


def test_parquet_on_invalid_and_on_empty(tmp_path):
    rows = [*DOCS, Document("d5", "", "", "")]
    p = _write_parquet(tmp_path / "c.parquet", rows)
    with pytest.warns(UserWarning, match=r"skipped 1 empty documents .*c\.parquet, row 5"):
        assert list(iter_corpus(p)) == DOCS
    with pytest.raises(DataError, match=r"c\.parquet, field 'text': row 5: empty document"):
        list(iter_corpus(p, on_empty="error"))
    bad = _write_parquet(tmp_path / "bad.parquet", DOCS, text=[d.content for d in DOCS[:2]] + [None, DOCS[3].content])
    with pytest.raises(DataError, match=r"bad\.parquet, field 'text': row 3: missing value"):
        list(iter_corpus(bad))
    with pytest.warns(UserWarning, match=r"bad\.parquet: skipped 1 invalid documents"):
        assert [d.id for d in iter_corpus(bad, on_invalid="skip")] == ["d1", "d2", "d4"]


def test_jsonl_options_pass_through(tmp_path):
    p = tmp_path / "corpus.jsonl"
    p.write_text(
        '{"_id": "a", "text": "x"}\n{"_id": "b", "text": 3}\n{"_id": "c", "title": "", "text": ""}\n', encoding="utf-8"
    )
    with pytest.raises(DataError, match=r"corpus\.jsonl, line 2, field 'text': expected a string"):
        list(iter_corpus(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [d.id for d in iter_corpus(tmp_path, on_invalid="skip")] == ["a"]
    with pytest.raises(DataError, match=r"line 3, field 'text': empty document"):
        list(iter_corpus(tmp_path, on_invalid="skip", on_empty="error"))


# ----------------------------------------------------------------------------- registration
def test_a_registered_format_is_recognised_everywhere_the_built_ins_are(tmp_path):
    fmt = register_corpus_format(TSV, read_tsv, suffixes=(SFX,))
    assert corpus.FORMATS.get(TSV) is fmt and fmt.beir_file == f"corpus{SFX}"
    _write_tsv(tmp_path / "beir" / f"corpus{SFX}", DOCS)
    assert list(iter_corpus(tmp_path / "beir" / f"corpus{SFX}")) == [
        Document(d.id, d.title, "", d.content) for d in DOCS
    ]
    assert find_corpus(tmp_path / "beir").format is fmt
    docs, source, total = open_corpus(tmp_path / "beir")
    assert (len(list(docs)), source, total) == (4, str(tmp_path / "beir" / f"corpus{SFX}"), None)
    # the missing-file message lists the new suffix
    with pytest.raises(DataError, match=re.escape(SFX)):
        iter_corpus(tmp_path / f"gone{SFX}")


def test_registration_refuses_clashes_and_bad_entries():
    register_corpus_format(TSV, read_tsv, suffixes=(SFX,))
    with pytest.raises(ScalingNoteError, match=f"corpus format '{TSV}' is already registered"):
        register_corpus_format(TSV, read_tsv, suffixes=(SFX,))
    again = register_corpus_format(TSV, read_tsv, suffixes=(SFX, ".testtab"), replace=True)
    assert corpus.FORMATS.get(TSV) is again and again.suffixes == (SFX, ".testtab")
    with pytest.raises(ScalingNoteError, match=f"suffix '{SFX}' already belongs to format '{TSV}'"):
        register_corpus_format("test_corpus_other", read_tsv, suffixes=(SFX.upper(),))
    with pytest.raises(ScalingNoteError, match="suffixes must be like '.tsv'"):
        register_corpus_format("test_corpus_bad", read_tsv, suffixes=("testcsv",))
    with pytest.raises(ScalingNoteError, match="must be callable"):
        register_corpus_format("test_corpus_bad", "read_tsv", suffixes=(".testcsv",))
    assert "test_corpus_other" not in corpus.FORMATS and "test_corpus_bad" not in corpus.FORMATS


def test_unknown_and_dotted_format_names(tmp_path, monkeypatch):
    with pytest.raises(ScalingNoteError, match=r"format: unknown corpus format 'test_corpus_xml'; known: ") as e:
        get_corpus_format("test_corpus_xml")
    assert {"jsonl", "parquet"} <= set(
        str(e.value).split("known: ")[1].split(" (")[0].split(", ")
    )  # the table, read at the time
    (tmp_path / "my_reader.py").write_text(
        "from scalingnote.data import Document\n"
        "def read(path):\n"
        "    for line in open(path, encoding='utf-8'):\n"
        "        i, t = line.rstrip('\\n').split('|')\n"
        "        yield Document(i, '', '', t)\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "c.psv").write_text("a|one\nb|two\n", encoding="utf-8")
    assert [d.content for d in iter_corpus(tmp_path / "c.psv", format="my_reader:read")] == ["one", "two"]
    with pytest.raises(
        ScalingNoteError, match=r"corpus\.format: cannot import corpus format 'no_such_mod:read': ModuleNotFoundError"
    ):
        get_corpus_format("no_such_mod:read", option="corpus.format")
    with pytest.raises(ScalingNoteError, match=r"cannot import corpus format 'my_reader:nope': AttributeError"):
        get_corpus_format("my_reader:nope")
    with pytest.raises(
        ScalingNoteError, match=r"format: 'my_reader:__name__' is neither a CorpusFormat nor a reader function"
    ):
        get_corpus_format("my_reader:__name__")
    sys.modules.pop("my_reader", None)


# ----------------------------------------------------------------------------- checks on user readers
def _fixed(items):
    def read(path):
        yield from items

    return read


@pytest.mark.parametrize(
    "items, field, words",
    [
        ([DOCS[0], {"_id": "x"}], None, "document 2: the 'test_corpus_fixed' reader gave a dict, not a Document"),
        ([DOCS[0], Document("  ", "t", "", "x")], "_id", "document 2: must not be empty"),
        ([DOCS[0], Document("d9", None, "", "x")], "title", "document 2: expected a string, got NoneType"),
        (
            [DOCS[0], DOCS[1], Document("d1", "again", "", "x")],
            "_id",
            "document 3: duplicate document id 'd1' (first seen in {p}, document 1)",
        ),
    ],
)
def test_user_reader_output_is_checked(tmp_path, items, field, words):
    register_corpus_format("test_corpus_fixed", _fixed(items), suffixes=(".testfx",))
    (tmp_path / "c.testfx").write_text("")
    with pytest.raises(DataError) as e:
        list(iter_corpus(tmp_path / "c.testfx"))
    assert (e.value.path, e.value.field) == (str(tmp_path / "c.testfx"), field)
    assert words.format(p=tmp_path / "c.testfx") in str(e.value)


def test_user_reader_skips_invalid_and_empty_like_the_built_ins(tmp_path):
    items = [DOCS[0], Document("", "t", "", "x"), Document("e", "", "", " "), DOCS[1]]
    register_corpus_format("test_corpus_fixed", _fixed(items), suffixes=(".testfx",))
    (tmp_path / "c.testfx").write_text("")
    with pytest.warns(UserWarning) as rec:
        got = list(iter_corpus(tmp_path / "c.testfx", on_invalid="skip"))
    assert got == [DOCS[0], DOCS[1]]
    msgs = sorted(str(w.message) for w in rec)
    assert (
        msgs[0].startswith(f"{tmp_path / 'c.testfx'}: skipped 1 invalid documents (first: ")
        and "document 2: must not be empty" in msgs[0]
    )
    assert (
        msgs[1] == f"skipped 1 empty documents (title and text both empty; first: {tmp_path / 'c.testfx'}, document 3)"
    )
    with pytest.raises(DataError, match=r"field 'text': document 3: empty document"):
        list(iter_corpus(tmp_path / "c.testfx", on_invalid="skip", on_empty="error"))


def test_user_reader_errors_name_file_line_and_field(tmp_path):
    register_corpus_format(TSV, read_tsv, suffixes=(SFX,))
    p = _write_tsv(tmp_path / f"corpus{SFX}", DOCS)
    p.write_text(p.read_text(encoding="utf-8") + "d5\tno text column\n", encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"corpus{SFX}, line 6: expected 3 tab-separated columns")) as e:
        list(iter_corpus(tmp_path))
    assert (e.value.path, e.value.line) == (str(p), 6)


# ----------------------------------------------------------------------------- a BEIR directory's corpus file
def test_find_corpus_file_detects_the_one_corpus_file_and_names_what_it_looked_for(tmp_path):
    from scalingnote.data.corpus import find_corpus_file

    beir = tmp_path / "beir"
    write_corpus(beir / "corpus.jsonl", DOCS)
    assert find_corpus_file(beir) == beir / "corpus.jsonl"
    assert find_corpus_file(beir, "jsonl") == beir / "corpus.jsonl"
    with pytest.raises(DataError, match=r"no corpus file of format 'parquet'.*found: corpus\.jsonl"):
        find_corpus_file(beir, "parquet")
    _write_parquet(beir / "corpus.parquet", DOCS)
    with pytest.raises(
        DataError,
        match=r"several corpus files in this directory \(corpus\.jsonl \(jsonl\), corpus\.parquet \(parquet\)\)",
    ):
        find_corpus_file(beir)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        DataError, match=r"empty: no corpus file in this directory \(looked for corpus\.jsonl \(jsonl\)"
    ) as e:
        find_corpus_file(empty)
    assert e.value.path == str(empty)
    # a format registered here is looked for too, by its own file name
    register_corpus_format("h4_tab_corpus", read_tsv, suffixes=(".h4tab",))
    (empty / "corpus.h4tab").write_text("id\ttitle\ttext\nx1\tA\tsome text\n", encoding="utf-8")
    assert find_corpus_file(empty) == empty / "corpus.h4tab"


def test_use_corpus_format_registers_a_dotted_reader_for_the_directorys_corpus_file(tmp_path, monkeypatch):
    from scalingnote.data.corpus import find_corpus_file, use_corpus_format

    (tmp_path / "h4_user_reader.py").write_text(
        "from scalingnote.data import Document\n"
        "def read(path):\n"
        "    for line in open(path, encoding='utf-8').read().splitlines()[1:]:\n"
        "        i, t, x = line.split(',')\n"
        "        yield Document(i, t, '', x)\n"
        "other = read\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    beir = tmp_path / "beir"
    beir.mkdir()
    (beir / "corpus.testcsv").write_text("id,title,text\nc1,First,one text\nc2,Second,two text\n", encoding="utf-8")
    name = use_corpus_format("h4_user_reader:read", beir)
    assert name == "h4_user_reader.read" and corpus.FORMATS.get(name).suffixes == (".testcsv",)
    assert use_corpus_format("h4_user_reader:read", beir) == name  # again: the same entry
    assert use_corpus_format(name) == name and use_corpus_format("jsonl") == "jsonl"  # a registered name as it is
    assert find_corpus_file(beir, name) == beir / "corpus.testcsv"
    assert [d.id for d in iter_corpus(beir)] == ["c1", "c2"]  # every stage reading the directory reads it
    with pytest.raises(DataError, match=r"no corpus\.<suffix> file that the registered formats .* do not read already"):
        use_corpus_format("h4_user_reader:other", tmp_path / "nothing_here")
    with pytest.raises(ScalingNoteError, match=r"cannot import corpus format 'h4_user_reader:missing'"):
        use_corpus_format("h4_user_reader:missing", beir)
