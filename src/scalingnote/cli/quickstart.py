"""``scalingnote quickstart``: the whole pipeline on embedded defaults (README command 1)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("quickstart")
    def quickstart_cmd(
        out: Path = typer.Option(Path("runs/quickstart"), "--out", help="Directory for every artefact (re-running resumes)."),
        data: Path | None = typer.Option(None, "--data", help="A BEIR directory instead of the synthetic note-search log."),
        seed: int = typer.Option(0, "--seed"),
        steps: int | None = typer.Option(None, "--steps", help="Cap on Stage I optimiser steps per method (default: epochs with early stopping)."),
        llm_layers: int | None = typer.Option(None, "--llm-layers", help="SmolLM2 layers kept (model-size knob; default: QuickstartConfig)."),
        max_eval_queries: int | None = typer.Option(None, "--max-eval-queries"),
        set_: list[str] = typer.Option(None, "--set", help="Override any QuickstartConfig key, e.g. --set qkd_epochs=3."),
    ) -> None:
        """data -> Stage I (ScalingDual) -> ScalingDoc/TwinBERT -> QKD -> IVFPQ + semantic IDs -> evaluation."""
        from scalingnote.cli.train import parse_overrides
        from scalingnote.config import load_config
        from scalingnote.quickstart import QuickstartConfig, quickstart

        check_inputs(out, data)  # before any work: a bad --data fails now, not after Stage I started
        over = {k.replace("__", "."): v for k, v in parse_overrides(set_).items()}
        cfg = load_config(
            QuickstartConfig,
            {"out": str(out), "data": str(data) if data else None, "seed": seed, "steps": steps,
             **({"llm_layers": llm_layers} if llm_layers is not None else {}), "max_eval_queries": max_eval_queries, **over},
        )
        quickstart(cfg)


def check_inputs(out: Path, data: Path | None) -> None:
    """``--data`` must be a BEIR directory (corpus.jsonl, queries.jsonl, qrels/) and ``--out``
    a directory (or not exist yet); a :class:`~scalingnote.errors.ScalingNoteError` names the path."""
    from scalingnote.errors import ScalingNoteError

    if out.exists() and not out.is_dir():
        raise ScalingNoteError(f"--out {out}: exists and is not a directory")
    if data is None:
        return
    if not data.exists():
        raise ScalingNoteError(f"--data {data}: no such directory")
    if not data.is_dir():
        raise ScalingNoteError(f"--data {data}: not a directory (give a BEIR directory: corpus.jsonl, queries.jsonl, qrels/)")
    missing = [name for name in ("corpus.jsonl", "queries.jsonl", "qrels") if not (data / name).exists()]
    if missing:
        raise ScalingNoteError(f"--data {data}: not a BEIR directory, missing {', '.join(missing)}")
