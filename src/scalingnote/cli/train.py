"""``scalingnote train``: Stage I (ScalingDual) and the TwinBERT / ScalingDoc baselines."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from scalingnote.cli._options import parse_overrides
from scalingnote.training import load_train_config, train


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        config: Path = typer.Option(..., "--config", "-c", help="YAML TrainConfig (see configs/stage1_*.yaml)."),
        resume: bool = typer.Option(
            True, "--resume/--no-resume", help="Continue from the last checkpoint in output_dir."
        ),
        set_: list[str] = typer.Option(
            None, "--set", help="Override a config key, e.g. --set optim.lr=1e-4 (repeatable)."
        ),
        output_dir: Path | None = typer.Option(None, "--output-dir", "-o", help="Override output_dir."),
    ) -> None:
        """Train a dual-tower retriever (ScalingNote Stage I). Launch with torchrun for several processes."""
        over = parse_overrides(set_)
        if output_dir is not None:
            over["output_dir"] = str(output_dir)
        cfg = load_train_config(config, **over)
        res = train(cfg, resume=resume)
        typer.echo(json.dumps(res, indent=2, default=str))
