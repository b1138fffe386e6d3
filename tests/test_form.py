"""The form rules the linter cannot state (docs/contributing.md): no Python file over 500 lines, no
function over 100 lines (tests may have longer functions: a scenario reads top to bottom), and our
own modules imported under names that say what they are (no one- or two-letter aliases)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 100
AREAS = ("src", "benchmarks", "scripts", "tests", "docs")


def _files(area: str) -> list[Path]:
    return sorted(p for p in (ROOT / area).rglob("*.py") if "__pycache__" not in p.parts)


def long_files(paths: list[Path], limit: int = MAX_FILE_LINES) -> list[str]:
    """``path: N lines`` for every file over ``limit`` lines."""
    out = []
    for p in paths:
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out.append(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: {n} lines")
    return out


def long_functions(paths: list[Path], limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name: N lines`` for every function (or method) over ``limit`` lines."""
    out = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), filename=str(p))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > limit:
                    out.append(f"{p.name}:{node.lineno} {node.name}: {n} lines")
    return out


def short_aliases(paths: list[Path]) -> list[str]:
    """``path:line import ... as X`` for every own module imported under a one- or two-letter name."""
    out = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), filename=str(p))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mod = node.module if isinstance(node, ast.ImportFrom) else ""
                for a in node.names:
                    own = (mod or a.name or "").startswith(("scalingnote", "benchmarks")) or (
                        isinstance(node, ast.ImportFrom) and node.level > 0
                    )
                    if own and a.asname and len(a.asname) <= 2:
                        out.append(f"{p.name}:{node.lineno} import {a.name} as {a.asname}")
    return out


@pytest.mark.parametrize("area", AREAS)
def test_no_file_over_500_lines(area):
    assert long_files(_files(area)) == []


@pytest.mark.parametrize("area", ("src", "benchmarks", "scripts"))
def test_no_function_over_100_lines(area):
    assert long_functions(_files(area)) == []


@pytest.mark.parametrize("area", ("src", "benchmarks", "scripts"))
def test_own_modules_are_not_imported_under_short_aliases(area):
    assert short_aliases(_files(area)) == []


def test_the_form_checks_see_what_they_look_for(tmp_path):
    f = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(101))
    f.write_text(f"import scalingnote.quickstart.proxy as X\nimport numpy as np\n\ndef long():\n{body}\n")
    assert long_files([f], limit=100) == [f"{f}: {len(f.read_text().splitlines())} lines"]
    assert long_functions([f]) == ["m.py:4 long: 102 lines"]
    assert short_aliases([f]) == ["m.py:1 import scalingnote.quickstart.proxy as X"]
