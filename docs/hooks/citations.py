"""Citations of measured figures in the docs: ``FIGURE (`FILE: ROW: COLUMN`)``.

``FILE`` names ``benchmarks/results/FILE.json``; ``ROW`` selects its one row whose fields have the
given values (``key=value``, several joined by `` & ``); ``COLUMN`` is the field the figure quotes.
A figure matches when the field, rounded to the figure's decimals, equals it. The docs test checks
every citation; the docs hook lists each cited file's machine and date.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

#: a figure, then "(" or "," and the citation in a code span
CITE = re.compile(
    r"(?P<figure>[-+]?\d[\d,]*(?:\.\d+)?)\s*[(,]\s*`(?P<file>[\w.@-]+): (?P<row>[^`]+?): (?P<column>[^`:]+)`"
)


@dataclass
class Citation:
    figure: str
    file: str
    row: dict[str, str]
    column: str

    def check(self) -> str | None:
        """None when the results file holds the figure; otherwise what is wrong."""
        path = RESULTS / f"{self.file}.json"
        if not path.exists():
            return f"{self.figure}: no results file {path.relative_to(ROOT)}"
        rows = [
            r
            for r in json.loads(path.read_text(encoding="utf-8"))["rows"]
            if all(str(r.get(k)) == v for k, v in self.row.items())
        ]
        if len(rows) != 1:
            return f"{self.figure}: {len(rows)} rows of {self.file} match {self.row} (one expected)"
        value = rows[0].get(self.column)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return f"{self.figure}: {self.file} {self.row} has no number in {self.column!r} ({value!r})"
        text = self.figure.replace(",", "")
        decimals = len(text.split(".")[1]) if "." in text else 0
        if round(float(value), decimals) != float(text):
            return f"{self.figure}: {self.file} {self.row} {self.column} is {value}"
        return None


def citations(markdown: str) -> list[Citation]:
    """Every citation in ``markdown``, in order."""
    out = []
    for m in CITE.finditer(markdown):
        pairs = [p.split("=", 1) for p in re.split(r"\s*&\s*", " ".join(m["row"].split()))]
        out.append(Citation(m["figure"], m["file"], {k.strip(): v.strip() for k, v in pairs}, m["column"].strip()))
    return out


def sources_table(markdown: str) -> str:
    """A table of the results files ``markdown`` cites, with the machine and date each records."""
    lines = ["| results file | machine | date |", "|---|---|---|"]
    for name in sorted({c.file for c in citations(markdown)}):
        path = RESULTS / f"{name}.json"
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        lines.append(
            f"| `benchmarks/results/{name}.json` | {data.get('machine', '?')} | {str(data.get('created', '?'))[:10]} |"
        )
    return "\n".join(lines)
