"""``scalingnote quickstart``: the whole pipeline on embedded defaults (README command 1)."""

from __future__ import annotations

from pathlib import Path

import typer

from scalingnote.cli._options import corpus_format_option, parse_overrides
from scalingnote.config import load_config
from scalingnote.quickstart import QuickstartConfig, quickstart
from scalingnote.quickstart.pipeline import check_inputs


def register(app: typer.Typer) -> None:
    @app.command(
        "quickstart",
        help="plan (budget) -> data -> readable families -> proxy comparison -> Stage I large towers (teacher chosen "
        "on validation) -> mining round -> QKD student(s) -> matched-cost comparison -> index (structure chosen on "
        "validation) -> served default.",
    )
    def quickstart_cmd(
        out: Path = typer.Option(
            Path("runs/quickstart"), "--out", help="Directory for every artefact (re-running resumes)."
        ),
        data: Path | None = typer.Option(
            None, "--data", help="A BEIR directory instead of the synthetic note-search log."
        ),
        corpus_format: str | None = corpus_format_option(),
        seed: int = typer.Option(
            0,
            "--seed",
            help="Seed of the training (draws, initialisation, order); the embedded data set stays the same "
            "(--set synth_seed=N draws another).",
        ),
        steps: int | None = typer.Option(
            None, "--steps", help="Cap on Stage I optimiser steps per method (default: epochs with early stopping)."
        ),
        llm_depths: str | None = typer.Option(
            None,
            "--llm-depths",
            help="Candidate SmolLM2 depths of the large LLM tower, chosen on validation (e.g. 2,4).",
        ),
        teacher: str | None = typer.Option(
            None, "--teacher", help="Pin the QKD teacher's family (bert or llm); default: the best on validation."
        ),
        student_p99_ms: float | None = typer.Option(
            None,
            "--student-p99-ms",
            help="Latency budget: the best-validating student whose single-query p99 (ms) is under it.",
        ),
        max_eval_queries: int | None = typer.Option(None, "--max-eval-queries"),
        budget_minutes: float | None = typer.Option(
            None,
            "--budget-minutes",
            help="Minutes of pipeline to plan against on this machine (default 8): the plan is printed first; "
            "candidates are compared on a proxy sample and only those that can still win are trained in full; work "
            "the budget "
            "cannot hold is skipped and named.",
        ),
        full: bool = typer.Option(
            False,
            "--full",
            help="Exhaustive: every candidate trained in full on the whole corpus, no proxy, no "
            "budget (reuses the steps a budgeted run finished).",
        ),
        set_: list[str] = typer.Option(
            None, "--set", help="Override any QuickstartConfig key, e.g. --set qkd_epochs=3."
        ),
    ) -> None:
        check_inputs(
            out, data, corpus_format=corpus_format
        )  # before any work: a bad --data fails now, not after Stage I started
        over = {k.replace("__", "."): v for k, v in parse_overrides(set_).items()}
        given = {
            "llm_depths": [int(x) for x in llm_depths.split(",")] if llm_depths else None,
            "teacher": teacher,
            "student_p99_ms": student_p99_ms,
            "corpus_format": corpus_format,
            "budget_minutes": budget_minutes,
            "full": full,
        }
        cfg = load_config(
            QuickstartConfig,
            {
                "out": str(out),
                "data": str(data) if data else None,
                "seed": seed,
                "steps": steps,
                "max_eval_queries": max_eval_queries,
                **{k: v for k, v in given.items() if v},
                **over,
            },
        )
        quickstart(cfg)
