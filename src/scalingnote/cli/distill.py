"""``scalingnote distill``: Stage II query-based knowledge distillation."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from scalingnote.cli._options import parse_overrides
from scalingnote.config import load_config
from scalingnote.distill import DistillConfig, distill


def register(app: typer.Typer) -> None:
    @app.command("distill")
    def distill_cmd(
        config: Path = typer.Option(..., "--config", "-c", help="YAML DistillConfig (see configs/qkd_*.yaml)."),
        resume: bool = typer.Option(True, "--resume/--no-resume"),
        set_: list[str] = typer.Option(None, "--set", help="Override a key, e.g. --set optim.lr=1e-4 (repeatable)."),
    ) -> None:
        """Distil a Stage I query tower into a small BERT student (ScalingNote §3.3). Under
        torchrun (``distributed: ddp|fsdp``) rank 0 prints the metrics."""
        cfg = load_config(DistillConfig, config, **parse_overrides(set_))
        res = distill(cfg, resume=resume)
        if res:  # other ranks of a torchrun job return {}
            typer.echo(json.dumps(res, indent=2, default=str))
