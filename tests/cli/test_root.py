"""The root ``scalingnote`` command: every command of :data:`scalingnote.cli.COMMANDS` listed with
its line, no stage module imported for the root's help, each stage loaded when invoked, and user
errors as one line with exit status 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalingnote.cli import COMMANDS, LazyStageGroup, app, load_stage, main

SRC = Path(__file__).resolve().parents[2] / "src"


def _help_text(command) -> str:
    return " ".join((command.help or "").split())


def test_root_help_lists_every_command_with_its_line():
    r = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "1000"})
    assert r.exit_code == 0, r.output
    for name, (_, line) in COMMANDS.items():
        assert any(
            row.split("│")[1].strip().startswith(f"{name} ") and line in " ".join(row.split())
            for row in r.stdout.splitlines()
            if "│" in row
        ), name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_table_line_is_the_start_of_its_command_help(name):
    module, line = COMMANDS[name]
    command = load_stage(module).get_command(None, name)
    assert command is not None, f"scalingnote.cli.{module}.register adds no command {name!r}"
    assert _help_text(command).startswith(line.rstrip(".")), (_help_text(command), line)


def test_root_help_imports_no_stage_module():
    code = (
        "import json, sys; from scalingnote.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.startswith('scalingnote.') or m in ('torch', 'faiss', 'numpy'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == ["scalingnote.cli", "scalingnote.errors"], loaded


def test_a_stage_help_and_an_unknown_command():
    runner = CliRunner()
    r = runner.invoke(app, ["scaling", "--help"])
    assert r.exit_code == 0 and "plan-gpu" in r.stdout
    r = runner.invoke(app, ["serch"])
    assert r.exit_code == 2 and "No such command 'serch'. Did you mean 'search', 'serve'?" in r.output


def test_user_error_is_one_line_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["scaling", "fit", "-i", str(tmp_path / "missing.csv"), "--law", "nope"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: --law must be one of ['model', 'data', 'joint'], got 'nope'\n"


def test_the_root_group_is_the_lazy_one():
    import typer

    assert isinstance(typer.main.get_command(app), LazyStageGroup)


def test_a_dotted_path_names_a_module_in_the_current_directory(tmp_path, monkeypatch):
    """The console script (whose sys.path holds its bin directory, not the working directory)
    reads ``--corpus-format sn_cwd_reader_mod:read`` from a module beside the user."""
    from scalingnote.data import Query, write_qrels, write_queries
    from scalingnote.data.corpus import FORMATS

    (tmp_path / "sn_cwd_reader_mod.py").write_text(
        "from scalingnote.data import Document\n\n\ndef read(path):\n"
        "    for i, line in enumerate(open(path, encoding='utf-8')):\n"
        "        yield Document(f'd{i}', '', '', line.strip())\n",
        encoding="utf-8",
    )
    data = tmp_path / "data"
    data.mkdir()
    (data / "corpus.sncwd").write_text(
        "vitamin d fracture risk\nknee running injury\ncoffee and sleep\n", encoding="utf-8"
    )
    write_queries(data / "queries.jsonl", [Query("q1", "knee injury")])
    write_qrels(data / "qrels" / "test.tsv", {"q1": {"d1": 1}})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "sn_cwd_reader_mod", raising=False)
    with FORMATS.scoped(), pytest.raises(SystemExit) as e:
        main(
            [
                "bm25",
                "search",
                "--data",
                "data",
                "--corpus-format",
                "sn_cwd_reader_mod:read",
                "--out",
                "run.tsv",
                "--k",
                "2",
            ]
        )
    assert e.value.code == 0
    assert (tmp_path / "run.tsv").read_text().split()[2] == "d1"


def test_a_stage_help_reads_the_registry_at_each_invocation():
    """A back end or corpus format registered after a stage was first used is in that stage's
    next help (commands defined inside ``register`` and at module level alike)."""
    from scalingnote.data.corpus import FORMATS, register_corpus_format
    from scalingnote.index.backends import BACKENDS, register_backend

    runner = CliRunner()
    for command in (["search", "--help"], ["index", "encode", "--help"]):
        assert runner.invoke(app, command, env={"COLUMNS": "400"}).exit_code == 0
    with BACKENDS.scoped(), FORMATS.scoped():
        register_backend("test_root_late_backend", lambda loc, query_tower=None: None)
        register_corpus_format("test_root_late_format", lambda path: iter(()), suffixes=(".testrootlate",))
        r = runner.invoke(app, ["search", "--help"], env={"COLUMNS": "400"})
        assert "test_root_late_backend" in re.sub(r"[\s│]+", "", r.stdout), r.stdout
        r = runner.invoke(app, ["index", "encode", "--help"], env={"COLUMNS": "400"})
        assert "test_root_late_format" in re.sub(r"[\s│]+", "", r.stdout), r.stdout
