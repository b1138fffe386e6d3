"""Write the built-in entries of every extension-point registry into ``docs/extending.md``.

The registries are the only place their names are listed; the doc's table of built-ins is made
from them here (between the ``<!-- registries:begin -->`` / ``<!-- registries:end -->`` markers),
so the doc cannot drift from the code. ``--check`` exits 1 when the doc is not current (the test
suite runs it)::

    python scripts/gen_registry_docs.py           # rewrite the block
    python scripts/gen_registry_docs.py --check   # is it current?
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from scalingnote.data.corpus import FORMATS  # noqa: E402
from scalingnote.index.backends import BACKENDS  # noqa: E402
from scalingnote.models.towers.pooling import POOLING_MODES  # noqa: E402
from scalingnote.training.losses import LOSSES  # noqa: E402
from scalingnote.utils.io import atomic_write  # noqa: E402

DOC = ROOT / "docs" / "extending.md"
BEGIN, END = "<!-- registries:begin -->", "<!-- registries:end -->"


def _first_line(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ").replace("|", "\\|")


def _table(title: str, where: str, head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = [f"**{title}** (`{where}`)", "", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def block() -> str:
    pooling = [
        (f"`{n}`", ", ".join(m.kinds), ", ".join(m.roles), m.st_mode or "--", m.description.replace("|", "\\|"))
        for n in POOLING_MODES.names()
        for m in [POOLING_MODES.get(n)]
    ]
    losses = [
        (f"`{n}`", f"`{inspect.getmodule(f).__name__}`", _first_line(f))
        for n in LOSSES.names()
        for f in [LOSSES.get(n)]
    ]
    backends = [
        (f"`{n}`", b.location, "yes" if b.export else "--", "yes" if b.live else "--", b.help.replace("|", "\\|"))
        for n in BACKENDS.names()
        for b in [BACKENDS.get(n)]
    ]
    formats = [
        (
            f"`{n}`",
            ", ".join(f"`{s}`" for s in f.suffixes),
            f"`{f.beir_file}`",
            _first_line(f.read) or f"`{f.read.__module__}.{f.read.__qualname__}`",
        )
        for n in FORMATS.names()
        for f in [FORMATS.get(n)]
    ]
    parts = [
        _table(
            "Pooling modes",
            "scalingnote.models.towers.pooling.POOLING_MODES",
            ("name", "towers", "roles", "sentence-transformers", "what"),
            pooling,
        ),
        _table("Losses", "scalingnote.training.losses.LOSSES", ("name", "module", "what"), losses),
        _table(
            "Back ends",
            "scalingnote.index.backends.BACKENDS",
            ("name", "located by", "export", "live", "what"),
            backends,
        ),
        _table(
            "Corpus formats",
            "scalingnote.data.corpus.FORMATS",
            ("name", "suffixes", "file in a BEIR directory", "reader"),
            formats,
        ),
    ]
    note = "<!-- made by scripts/gen_registry_docs.py from the registries; do not edit by hand -->"
    return "\n".join([BEGIN, note, "", "\n\n".join(parts), "", END])


def render(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC}: no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + block() + tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/extending.md is not current")
    args = ap.parse_args()
    text = DOC.read_text(encoding="utf-8")
    new = render(text)
    if args.check:
        if new != text:
            print(f"{DOC} is not current: run python scripts/gen_registry_docs.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        with atomic_write(DOC) as fh:
            fh.write(new)
    print(f"wrote the registry tables of {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
