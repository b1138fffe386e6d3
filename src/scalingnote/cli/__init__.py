"""The ``scalingnote`` command line: ``scalingnote <stage> <verb>``.

Each stage's commands live in their own module (``scalingnote.cli.<module>``, whose
``register(app)`` adds them) and are thin wrappers over the importable Python API. The root
command loads a stage module only when one of its commands runs (click's lazy-loading
pattern): :data:`COMMANDS` is the one table of the top-level commands, their module and the
one line the root ``--help`` shows, so ``scalingnote --help`` imports no stage. Errors caused
by user input (:class:`~scalingnote.errors.ScalingNoteError`) are printed as one line and exit
with status 2 — never a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from difflib import get_close_matches
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand, TyperGroup

from scalingnote.errors import ScalingNoteError

if TYPE_CHECKING:  # the click that typer ships: the types TyperGroup's methods take and return
    from typer._click.core import Command, Context

#: top-level command -> (module under scalingnote.cli whose ``register(app)`` adds it, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "eval": (
        "evaluate",
        "Evaluate a run: R@K (ScalingNote: hit if any relevant doc in the top K), Recall@K, MRR, nDCG, MAP, P@K, AUC.",
    ),
    "compare": (
        "evaluate",
        "Paired significance of run A vs run B on one metric: two-sided paired t-test and bootstrap CI of the mean "
        "difference.",
    ),
    "search": (
        "search",
        "Search an index (dense on any back end; BM25 or hybrid beside an index directory) and write a TREC run, or "
        "print one query's hits.",
    ),
    "train": (
        "train",
        "Train a dual-tower retriever (ScalingNote Stage I). Launch with torchrun for several processes.",
    ),
    "distill": ("distill", "Distil a Stage I query tower into a small BERT student (ScalingNote §3.3)."),
    "quickstart": (
        "quickstart",
        "plan (budget) -> data -> readable families -> proxy comparison -> Stage I large towers (teacher chosen on "
        "validation) -> mining round -> QKD student(s) -> matched-cost comparison -> index (structure chosen on "
        "validation) -> served default.",
    ),
    "serve": (
        "serve",
        "Serve top-k search over HTTP: POST /search, /search/batch, /admin/reload; GET /healthz, /metrics.",
    ),
    "data": (
        "data",
        "Data: triplets from search logs, pseudo-queries, synthetic note-search log, the mined-negatives audit.",
    ),
    "bm25": ("bm25", "BM25 lexical baseline (bm25s)."),
    "index": ("index", "Corpus encoding, FAISS indexes, semantic IDs."),
    "models": ("models", "Tower backbones: packaged models, HF directories, GGUF files."),
    "scaling": ("scaling", "Scaling laws (Fang et al. 2024; ScalingNote §4.4): sweep, fit, predict, plan, plot."),
    "pq": ("pq", "Learned product quantization (TMJ): joint training, negative mining, FAISS export."),
}


def load_stage(module: str) -> TyperGroup:
    """The click group of the commands ``scalingnote.cli.<module>``'s ``register(app)`` adds
    (registered now, so option help that reads a registry sees its current entries)."""
    stage = typer.Typer()
    importlib.import_module(f"scalingnote.cli.{module}").register(stage)
    return typer.main.get_group(stage)


class LazyStageGroup(TyperGroup):
    """The root command: lists :data:`COMMANDS` from the table and imports a stage module only
    when one of its commands is resolved (``--help`` of the root shows the table's lines)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._listing = False

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, help_line = COMMANDS[cmd_name]
        if self._listing:  # the root's help: the table's line, no import
            return TyperCommand(cmd_name, help=help_line, short_help=help_line)
        # loaded once per invocation (its options' help reads the registries as they are now)
        stages = ctx.meta.setdefault("scalingnote.stages", {})
        if module not in stages:
            stages[module] = load_stage(module)
        return stages[module].get_command(ctx, cmd_name)

    def resolve_command(self, ctx: Context, args: list[str]) -> tuple[str | None, Command | None, list[str]]:
        if args and args[0] not in COMMANDS and not args[0].startswith("-"):
            matches = get_close_matches(args[0], list(COMMANDS))
            ctx.fail(
                f"No such command {args[0]!r}." + (f" Did you mean {', '.join(map(repr, matches))}?" if matches else "")
            )
        return super().resolve_command(ctx, args)

    def format_help(self, ctx: Context, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="scalingnote",
    cls=LazyStageGroup,
    help="LLM-scaled dense retrieval: data -> train -> distill -> index -> serve -> evaluate -> scaling laws.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """The stages are :data:`COMMANDS`; nothing runs before them."""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point. The current directory is searched last for a dotted path
    ``module:attribute`` an option names (``--backend my_backend:open``), as ``python -m`` would."""
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        app(args=argv, standalone_mode=True)
    except ScalingNoteError as e:
        typer.secho(f"error: {e}", err=True, fg=typer.colors.RED)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
