"""The quick start's data: the given BEIR directory, or the synthetic note-search set made as a step,
with its corpus file and the fingerprint that identifies it in every later step's inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalingnote.data.build import load_build_config, run_build
from scalingnote.data.corpus import find_corpus_file, use_corpus_format
from scalingnote.data.synth import SynthConfig, synthesize
from scalingnote.quickstart.config import QuickstartConfig
from scalingnote.quickstart.step_markers import banner, mark_done, step_done
from scalingnote.utils.steps import file_sha256


def prepare_data(cfg: QuickstartConfig, out: Path) -> dict[str, Any]:
    """Returns {"beir": dir, "corpus": its corpus file, "triplets": path|None, "validation_triplets":
    path|None, "fingerprint": ...}. ``cfg.corpus_format`` is made readable by every stage first."""
    if cfg.data:
        fmt = use_corpus_format(cfg.corpus_format, cfg.data) if cfg.corpus_format else None
        data: dict[str, Any] = {"beir": str(Path(cfg.data).resolve()), "triplets": None, "validation_triplets": None}
        data["corpus"] = str(find_corpus_file(data["beir"], fmt))
        return {**data, "fingerprint": data_fingerprint(data)}
    d = out / "data"
    inputs = {"synth_docs": cfg.synth_docs, "synth_queries": cfg.synth_queries, "seed": cfg.synth_seed}
    if not step_done(d, inputs):
        banner("data: synthetic note-search log -> triplets (click/relevance, one-hop/multi-hop)")
        synthesize(
            d,
            SynthConfig(seed=cfg.synth_seed, num_docs=cfg.synth_docs, num_queries=cfg.synth_queries),
            progress=cfg.show_progress,
        )
        run_build(load_build_config(d / "build.yaml"), progress=cfg.show_progress)
        mark_done(d, inputs)
    data = {
        "beir": str(d),
        "corpus": str(find_corpus_file(d)),
        "triplets": str(d / "triplets" / "train.jsonl"),
        "validation_triplets": str(d / "triplets" / "validation.jsonl"),
    }
    return {**data, "fingerprint": data_fingerprint(data)}


def corpus_file(data: dict[str, Any]) -> Path:
    """The corpus file of the run's data (``data["corpus"]``, else detected in ``data["beir"]``)."""
    return Path(data["corpus"]) if data.get("corpus") else find_corpus_file(data["beir"])


def data_fingerprint(data: dict[str, Any]) -> dict[str, Any]:
    """What identifies the training data of a step: the BEIR files' sizes and SHA-256 digests
    (content, not modification times: a copied or re-provisioned data set with the same bytes
    reuses every step). Computed once per run by :func:`prepare_data` (``data["fingerprint"]``)."""
    if "fingerprint" in data:
        return data["fingerprint"]
    beir = Path(data["beir"])
    files = {}
    for p in sorted(
        [corpus_file(data), beir / "queries.jsonl", *sorted((beir / "qrels").glob("*.tsv"))]
        + [Path(t) for t in (data.get("triplets"), data.get("validation_triplets")) if t]
    ):
        if p.exists():
            files[str(p)] = [p.stat().st_size, file_sha256(p)]
    return files


__all__ = ["corpus_file", "data_fingerprint", "prepare_data"]
