"""The ``scalingnote`` command line: ``scalingnote <stage> <verb>``.

Each stage's commands live in their own module and are thin wrappers over the
importable Python API. Errors caused by user input
(:class:`~scalingnote.errors.ScalingNoteError`) are printed as one line and exit
with status 2 — never a traceback.
"""

from __future__ import annotations

import sys

import typer

from scalingnote.errors import ScalingNoteError

app = typer.Typer(
    name="scalingnote",
    help="LLM-scaled dense retrieval: data -> train -> distill -> index -> serve -> evaluate -> scaling laws.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    # Each stage module exposes `register(app)`; imports are local so `--help` stays fast.
    from scalingnote.cli import bm25 as _bm25
    from scalingnote.cli import data as _data
    from scalingnote.cli import evaluate as _evaluate
    from scalingnote.cli import index as _index
    from scalingnote.cli import models as _models
    from scalingnote.cli import pq as _pq
    from scalingnote.cli import distill as _distill
    from scalingnote.cli import quickstart as _quickstart
    from scalingnote.cli import serve as _serve
    from scalingnote.cli import train as _train
    from scalingnote.cli import scaling as _scaling

    for mod in (_data, _evaluate, _bm25, _index, _models, _train, _distill, _quickstart, _serve, _scaling, _pq):
        mod.register(app)


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        app(args=argv, standalone_mode=True)
    except ScalingNoteError as e:
        typer.secho(f"error: {e}", err=True, fg=typer.colors.RED)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
