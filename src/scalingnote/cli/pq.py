"""``scalingnote pq train``: learned product quantization (TMJ) — a thin wrapper over
:mod:`scalingnote.pq`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from scalingnote.cli._options import parse_overrides
from scalingnote.pq import load_pq_config, train


def register(app: typer.Typer) -> None:
    pq_app = typer.Typer(
        help="Learned product quantization (TMJ): joint training, negative mining, FAISS export.", no_args_is_help=True
    )

    @pq_app.command("train")
    def train_cmd(
        config: Path = typer.Option(..., "--config", "-c", help="YAML PQTrainConfig (see configs/tmj_scifact.yaml)."),
        set_: list[str] = typer.Option(
            None, "--set", help="Override a config key, e.g. --set stage1.loss=l0 (repeatable)."
        ),
        output_dir: Path | None = typer.Option(None, "--output-dir", "-o", help="Override output_dir."),
        seed: int | None = typer.Option(None, "--seed", help="Override seed."),
    ) -> None:
        """Warm-up, PQ/OPQ init, stage 1 (L1 or L0), stage 2 (PQ-oriented negatives), export.
        Rerunning with the same output_dir resumes from the last checkpoint / finished phase."""
        over = parse_overrides(set_)
        if output_dir is not None:
            over["output_dir"] = str(output_dir)
        if seed is not None:
            over["seed"] = seed
        cfg = load_pq_config(config, **over)
        res = train(cfg)
        typer.echo(json.dumps(res, indent=2, default=str))

    app.add_typer(pq_app, name="pq")
