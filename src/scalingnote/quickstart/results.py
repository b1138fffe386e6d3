"""The quick start from Python: :func:`run_quickstart` runs it (as ``scalingnote quickstart`` does)
and returns a :class:`QuickstartResult`; :func:`read_results` reads a finished run's output
directory; :func:`served_paths` finds what ``scalingnote serve`` serves from it. The package
itself is callable: ``scalingnote.quickstart(...)`` is :func:`run_quickstart`."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalingnote.config import load_config
from scalingnote.errors import ScalingNoteError
from scalingnote.quickstart.config import QuickstartConfig
from scalingnote.quickstart.main import quickstart as _run
from scalingnote.quickstart.pipeline import check_inputs
from scalingnote.utils.io import relocated

#: where a quick start (or a recipe run on it) keeps the served index, whatever its structure
INDEX_DIR = Path("index") / "ivfpq"


@dataclass(frozen=True)
class QuickstartResult:
    """A finished quick start: its output directory ``out``, the results table's ``rows`` (one dict
    per row: ``method``, ``ndcg@10``, ``r@100``, ``chosen`` ...), the ``choices`` it made on
    validation queries (families, teacher, student, served default, index, budget), and what
    ``scalingnote serve`` serves: ``index_dir``, ``query_tower`` and the ``serve_command``."""

    out: Path
    rows: list[dict[str, Any]]
    choices: dict[str, Any]
    index_dir: Path
    query_tower: Path

    @property
    def serve_command(self) -> str:
        """The command that serves this run over HTTP (port 8080)."""
        return (
            f"scalingnote serve --index {shlex.quote(str(self.index_dir))} --query-tower "
            f"{shlex.quote(str(self.query_tower))} --port 8080"
        )

    @property
    def served(self) -> dict[str, Any]:
        """The served configuration's row (what a query to the service gets)."""
        return next(r for r in self.rows if "served" in str(r.get("chosen", "")))


def served_paths(run_dir: str | Path, results: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """``(index directory, query tower directory)`` that the quick start's printed ``scalingnote
    serve`` command serves from its output ``run_dir``: ``<run_dir>/index/ivfpq`` and the chosen
    student's query tower (``results.json``'s ``choices``)."""
    run_dir = Path(run_dir)
    if results is None:
        results = _read_json(run_dir)
    try:
        student = results["choices"]["student"]
        chosen = next(c for c in student["candidates"] if c["name"] == student["chosen"])
        tower = relocated(chosen["dir"], run_dir)
    except (KeyError, TypeError, StopIteration):
        raise ScalingNoteError(
            f"{run_dir / 'results.json'}: field 'choices.student': no chosen student with its directory"
        ) from None
    index_dir = run_dir / INDEX_DIR
    for what, p in (("index", index_dir / "manifest.json"), ("query tower", tower)):
        if not p.exists():
            raise ScalingNoteError(f"{run_dir}: the served {what} is missing ({p})")
    return index_dir, tower


def _read_json(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "results.json"
    if not run_dir.is_dir():
        raise ScalingNoteError(f"{run_dir}: no such directory (the output of `scalingnote quickstart --out DIR`)")
    if not path.is_file():
        raise ScalingNoteError(
            f"{path}: not found: {run_dir} is not a finished quick start's output (run `scalingnote "
            f"quickstart --out {run_dir}`; "
            "re-running resumes)"
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ScalingNoteError(f"{path}: unreadable: {e}") from None


def read_results(run_dir: str | Path) -> QuickstartResult:
    """The :class:`QuickstartResult` of a finished quick start (or recipe) output directory."""
    run_dir = Path(run_dir)
    res = _read_json(run_dir)
    index_dir, tower = served_paths(run_dir, res)
    return QuickstartResult(
        out=run_dir,
        rows=list(res.get("rows", [])),
        choices=dict(res.get("choices", {})),
        index_dir=index_dir,
        query_tower=tower,
    )


def run_quickstart(
    data: str | Path | None = None,
    out: str | Path = "runs/quickstart",
    budget_minutes: float | None = 8,
    **options: Any,
) -> QuickstartResult:
    """Run (or resume) the quick start, as ``scalingnote quickstart`` does, and return its results.

    ``data``: a BEIR directory (None: the synthetic note-search log); ``out``: the output directory
    (re-running resumes); ``budget_minutes``: the time budget planned against (None: no budget);
    Progress and the results table are printed as the command prints them. ``tiny`` below: the
    tests' small sizes and random models; ``run_dir``: a finished run's output (re-running resumes).
    ``options``: any other :class:`~scalingnote.quickstart.config.QuickstartConfig` key (``seed``,
    ``full``, ``llm_depths``, ``corpus_format`` ...). A bad value is a
    :class:`~scalingnote.errors.ConfigError` naming the key, raised before any work.

    >>> result = scalingnote.quickstart(out=run_dir, **tiny)  # doctest: +ELLIPSIS
    [quickstart] ...
    >>> result.served["method"], result.serve_command.startswith("scalingnote serve --index")
    ('served', True)
    """
    check_inputs(Path(out), Path(data) if data is not None else None, corpus_format=options.get("corpus_format"))
    cfg = load_config(
        QuickstartConfig,
        {"out": str(out), "data": str(data) if data is not None else None, "budget_minutes": budget_minutes, **options},
    )
    _run(cfg)
    return read_results(Path(cfg.out).resolve())
