"""The fenced code blocks of the README and the docs, and the rule each must follow.

Every block is run by a test or marked as not runnable, with the reason, by an HTML comment on the
line before it: ``<!-- not-run: needs a GPU -->``. Blocks in ``text`` or ``mermaid`` are output,
layouts or diagrams, not code. The blocks tests run:

* the README's ``python`` blocks (``tests/docs/test_readme.py``, on a small quick start);
* the ``python`` blocks of ``docs/extending.md``'s worked examples (``tests/docs/test_extending.py``);
* every unmarked ``bash`` block whose every line is a ``scalingnote ... --help`` call
  (``tests/docs/test_site.py`` runs each line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_CODE = {"text", "mermaid"}
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(?P<reason>\S.*?)\s*-->$")
HELP_LINE = re.compile(r"^(?:\.venv/bin/)?scalingnote(?: [a-z0-9-]+)* --help$")


@dataclass
class Block:
    path: Path
    line: int  #: 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None  #: the reason, when marked

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path`` with their language and not-run marker."""
    lines = path.read_text(encoding="utf-8").split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if m is None:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        marker = NOT_RUN.match(prev)
        out.append(
            Block(
                path,
                start + 1,
                m.group(1),
                "\n".join(lines[start + 1 : j]) + "\n",
                marker["reason"] if marker else None,
            )
        )
        i = j + 1
    return out


def doc_files() -> list[Path]:
    """The README and every page of the site."""
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)]


def help_block(block: Block) -> bool:
    """An unmarked shell block of ``scalingnote ... --help`` lines only (cheap: ``test_site`` runs it)."""
    lines = [line.strip() for line in block.code.splitlines() if line.strip()]
    return block.lang in ("bash", "sh", "console") and bool(lines) and all(HELP_LINE.match(line) for line in lines)


def extending_sections() -> list[tuple[int, int]]:
    """Line ranges (1-based, inclusive start) of the worked-example sections ``tests/docs/test_extending.py`` runs."""
    from tests.docs.test_extending import SECTIONS

    lines = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8").split("\n")
    heads = [i + 1 for i, line in enumerate(lines) if line.startswith("## ")]
    ranges = []
    for i, line in enumerate(lines):
        if line.startswith("## ") and line[3:].strip() in SECTIONS:
            end = next((h for h in heads if h > i + 1), len(lines) + 1)
            ranges.append((i + 1, end))
    return ranges


def run_by(block: Block) -> str | None:
    """Which test runs ``block`` (None: no test does)."""
    rel = block.path.relative_to(ROOT).as_posix()
    if rel == "README.md" and block.lang == "python":
        return "tests/docs/test_readme.py"
    if (
        rel == "docs/extending.md"
        and block.lang == "python"
        and any(a <= block.line < b for a, b in extending_sections())
    ):
        return "tests/docs/test_extending.py"
    if help_block(block):
        return "tests/docs/test_site.py"
    return None
