"""The code checks are configured as docs/contributing.md says: ruff's rule set catches the bug classes
it is there for, B008 is allowed in the CLI only, and pre-commit runs the same three tools as
``scripts/check.sh`` (which the test command runs before the tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(not (BIN / "ruff").exists(), reason="ruff is not installed in this environment")


def ruff_codes(source: str, as_file: str) -> set[str]:
    """The rule codes ruff (with the project's configuration) reports for ``source`` read as ``as_file``."""
    proc = subprocess.run(
        [str(BIN / "ruff"), "check", "--no-fix", "--output-format", "concise", "--stdin-filename", as_file, "-"],
        input=source,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return {part.split()[0] for line in proc.stdout.splitlines() if ": " in line for part in [line.split(": ", 1)[1]]}


def test_the_rule_set_catches_the_bug_classes_it_is_there_for():
    source = (
        "def pair(ids, vectors):\n"
        "    return list(zip(ids, vectors))\n"
        "\n"
        "\n"
        "def callbacks(names):\n"
        "    out = []\n"
        "    for name in names:\n"
        "        out.append(lambda: name)\n"
        "    return out\n"
        "\n"
        "\n"
        "def read(path):\n"
        "    try:\n"
        "        return open(path).read()\n"
        "    except Exception:\n"
        "        return None\n"
    )
    assert {"B905", "B023", "BLE001"} <= ruff_codes(source, "src/scalingnote/data/example.py")


def test_typer_option_defaults_are_allowed_in_the_cli_only():
    source = (
        "from pathlib import Path\n\nimport typer\n\n\ndef cmd(p: Path = typer.Option(...)) -> None:\n    print(p)\n"
    )
    assert "B008" not in ruff_codes(source, "src/scalingnote/cli/example.py")
    assert "B008" in ruff_codes(source, "src/scalingnote/data/example.py")


def test_pre_commit_runs_the_same_tools_as_the_check_script():
    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))["repos"][0]["hooks"]
    entries = [h["entry"].split()[0].rsplit("/", 1)[-1] + " " + " ".join(h["entry"].split()[1:2]) for h in hooks]
    script = (ROOT / "scripts" / "check.sh").read_text(encoding="utf-8")
    assert [e.strip() for e in entries] == ["ruff check", "ruff format", "mypy"]
    assert '"$bin/ruff" check' in script and '"$bin/ruff" format --check' in script and '"$bin/mypy"' in script
    assert "scripts/check.sh" in (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
