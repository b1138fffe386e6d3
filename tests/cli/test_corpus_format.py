"""``--corpus-format SPEC`` (a registered corpus format or a dotted path ``pkg.module:reader``)
on the commands that read a data directory: the help lists the registered formats, quick start
gets it in its config, ``index encode`` reads a corpus through a user's reader."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from typer.testing import CliRunner

from scalingnote.cli import app
from scalingnote.data import Document
from scalingnote.data.corpus import FORMATS, register_corpus_format

FORMAT = "corpus-format-cli-test"  # a name no one else registers


def _read_pipe(path):
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if n:  # header
            doc_id, title, text = line.split("|")
            yield Document(doc_id, title, "", text)


def test_help_lists_the_registered_formats():
    with FORMATS.scoped():
        register_corpus_format(FORMAT, _read_pipe, suffixes=[".pipe-test"])
        runner = CliRunner()
        for command in (
            ["quickstart", "--help"],
            ["index", "encode", "--help"],
            ["index", "build", "--help"],
            ["bm25", "search", "--help"],
        ):
            r = runner.invoke(app, command, env={"COLUMNS": "400"})
            flat = re.sub(r"[\s│]+", "", r.stdout)  # the help as one string: rich wraps long lines (at hyphens too)
            assert r.exit_code == 0 and "--corpus-format" in flat and FORMAT in flat, (command, r.stdout)


def test_quickstart_puts_the_format_in_its_config(monkeypatch, tmp_path):
    import scalingnote.cli.quickstart as cli_quickstart

    seen = []
    monkeypatch.setattr(cli_quickstart, "check_inputs", lambda out, data, *a, **kw: None)
    monkeypatch.setattr(cli_quickstart, "quickstart", seen.append)
    r = CliRunner().invoke(
        app,
        ["quickstart", "--out", str(tmp_path / "qs"), "--data", str(tmp_path), "--corpus-format", "my_pkg.reader:read"],
    )
    assert r.exit_code == 0, r.output
    assert seen[0].corpus_format == "my_pkg.reader:read"


def test_index_encode_reads_a_corpus_through_a_dotted_path_reader(tmp_path, tiny_bert_dir):
    code = tmp_path / "code"
    code.mkdir()
    (code / "pipe_reader.py").write_text(
        textwrap.dedent("""
        from scalingnote.data import Document

        def read(path, **kw):
            lines = path.read_text(encoding="utf-8").splitlines()[1:]
            return [Document(*line.split("|")[:2], "", line.split("|")[2]) for line in lines]
    """),
        encoding="utf-8",
    )
    data = tmp_path / "data"
    data.mkdir()
    rows = [f"d{i}|title {i}|fox dog vector index {i}" for i in range(20)]
    (data / "corpus.pipe").write_text("\n".join(["_id|title|text", *rows]) + "\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp, FORMATS.scoped():
        mp.syspath_prepend(str(code))
        r = CliRunner().invoke(
            app,
            [
                "index",
                "encode",
                "--tower",
                str(tiny_bert_dir),
                "--data",
                str(data),
                "--corpus-format",
                "pipe_reader:read",
                "--out",
                str(tmp_path / "emb"),
                "--shard-size",
                "8",
                "--batch-size",
                "8",
            ],
        )
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "emb" / "manifest.json").read_text(encoding="utf-8"))["n_docs"] == 20
