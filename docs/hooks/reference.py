"""MkDocs hook: the generated reference pages.

* ``reference/cli.md`` holds the marker ``<!-- cli-reference -->``, replaced by the reference of the
  command typer builds from the ``scalingnote`` app (:func:`cli_markdown`): every command, option and
  default comes from the command objects, never typed by hand.
* the benchmark plots are published beside the pages (:func:`on_files`);
* the page of findings lists the machine and date of each results file it cites (``<!-- findings-sources -->``,
  :func:`citations.sources_table`);
* ``reference/api.md`` holds the marker ``<!-- api-modules -->``; this hook replaces it with one
  mkdocstrings ``:::`` block per module of :data:`API_MODULES` that exists in ``src/``, so the
  page documents the modules the checkout has.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
if str(SRC) not in sys.path:  # the checkout's package, as mkdocstrings' `paths: [src]` reads it
    sys.path.insert(0, str(SRC))

from citations import sources_table  # noqa: E402 (beside this hook: MkDocs puts its folder on the path)

from scalingnote.cli import app  # noqa: E402

#: the root command, as typer builds it from the ``scalingnote`` app
command = typer.main.get_command(app)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def cli_markdown(cmd=None, ctx=None, depth: int = 2) -> str:
    """The reference of ``cmd`` and every subcommand below it, as Markdown: help text, usage and a
    table of options, each read from the command objects (``--help`` prints the same)."""
    from typer._click.core import Context

    cmd = command if cmd is None else cmd
    ctx = ctx or Context(cmd, info_name="scalingnote")
    out = [f"{'#' * min(depth, 6)} `{ctx.command_path}`", ""]
    if cmd.help:
        out += [cmd.help.strip().split("\n\n")[0].strip(), ""]
    out += ["```text", f"{ctx.command_path} {' '.join(cmd.collect_usage_pieces(ctx))}", "```", ""]
    records = [r for r in (p.get_help_record(ctx) for p in cmd.get_params(ctx)) if r]
    if records:
        out += ["| option | description |", "|---|---|"]
        out += [f"| `{_cell(names)}` | {_cell(text)} |" for names, text in records]
        out.append("")
    for name in cmd.list_commands(ctx) if hasattr(cmd, "list_commands") else []:
        sub = cmd.get_command(ctx, name)
        if sub is not None and not getattr(sub, "hidden", False):
            out.append(cli_markdown(sub, Context(sub, info_name=name, parent=ctx), depth + 1))
    return "\n".join(out)


#: the modules of the Python API reference, in page order
API_MODULES = [
    "scalingnote",
    "scalingnote.api",
    "scalingnote.data.corpus",
    "scalingnote.models.towers.pooling",
    "scalingnote.training.losses.registry",
    "scalingnote.index.backends",
    "scalingnote.index.searcher",
    "scalingnote.quickstart.config",
    "scalingnote.errors",
]
MARKER = "<!-- api-modules -->"
CLI = "<!-- cli-reference -->"
SOURCES = "<!-- findings-sources -->"


def module_exists(name: str) -> bool:
    """Whether ``src/`` has the module (a ``.py`` file or a package)."""
    path = SRC.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def api_blocks() -> str:
    """One ``:::`` block per existing module of :data:`API_MODULES`."""
    return "\n\n".join(f"::: {name}" for name in API_MODULES if module_exists(name))


def on_files(files, config):
    """Publish the benchmark plots (``benchmarks/results/plots/*.png``) under the same path, so a page's
    ``![...](benchmarks/results/plots/NAME.png)`` shows the plot the benchmark drew."""
    from mkdocs.structure.files import File

    for png in sorted((ROOT / "benchmarks" / "results" / "plots").glob("*.png")):
        files.append(
            File(
                png.relative_to(ROOT).as_posix(),
                src_dir=str(ROOT),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, api_blocks())
    if CLI in markdown:
        markdown = markdown.replace(CLI, cli_markdown())
    if SOURCES in markdown:
        markdown = markdown.replace(SOURCES, sources_table(markdown))
    return markdown
