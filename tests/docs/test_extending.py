"""The worked examples of ``docs/extending.md`` run: each ``## `` section's ```` ```python ````
blocks are joined in order and executed in a fresh interpreter, in an empty directory, with the
repository's ``src`` on the path. A section without code fails (the doc promises an example).
The four additions a contributor makes as built-ins in a copy of the repository are tested in
``test_extending_additions.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "extending.md"
SECTIONS = ("A pooling mode", "A loss", "A vector back end", "A corpus format")


def section_code(text: str, heading: str) -> str:
    """The Python blocks under ``## heading`` (up to the next ``## ``), joined in order."""
    m = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    if m is None:
        raise AssertionError(f"{DOC}: no section '## {heading}'")
    return "\n\n".join(re.findall(r"^```python\n(.*?)^```", m.group(1), flags=re.M | re.S))


def test_section_code_reads_only_its_own_section():
    text = "## A\n```python\nx = 1\n```\n## B\n```python\ny = 2\n```\n"
    assert section_code(text, "A") == "x = 1\n" and section_code(text, "B") == "y = 2\n"


@pytest.mark.parametrize("heading", SECTIONS)
def test_worked_example_runs(heading, tmp_path):
    code = section_code(DOC.read_text(encoding="utf-8"), heading)
    assert code.strip(), f"{DOC}: section '{heading}' has no ```python example"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(tmp_path)]), "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"'{heading}' example failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_builtin_tables_are_made_from_the_registries():
    """The doc's tables of built-in pooling modes, losses, back ends and corpus formats are
    generated from the registries (``scripts/gen_registry_docs.py``) and current."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_registry_docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
