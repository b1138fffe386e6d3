"""The root ``scalingnote`` command: every command of :data:`scalingnote.cli.COMMANDS` listed with
its line, no stage module imported for the root's help, each stage loaded when invoked, and user
errors as one line with exit status 2."""

from __future__ import annotations

import json
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
        assert any(row.split("│")[1].strip().startswith(f"{name} ") and line in " ".join(row.split()) for row in r.stdout.splitlines() if "│" in row), name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_table_line_is_the_start_of_its_command_help(name):
    module, line = COMMANDS[name]
    command = load_stage(module).get_command(None, name)
    assert command is not None, f"scalingnote.cli.{module}.register adds no command {name!r}"
    assert _help_text(command).startswith(line.rstrip(".")), (_help_text(command), line)


def test_root_help_imports_no_stage_module():
    code = ("import json, sys; from scalingnote.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('scalingnote.') or m in ('torch', 'faiss', 'numpy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, check=True)
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
