"""The stages of ``benchmarks/chaos.py``: the tiny models every stage uses and, per stage, the
``scalingnote`` command line that produces its outputs in a given directory."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any


def prepare(work: Path, seed: int) -> dict[str, Any]:
    """The tiny models every stage uses."""
    import torch

    torch.set_num_threads(1)
    from scalingnote.models import build_tiny_model

    models = work / "models"
    llm = build_tiny_model(models / "llm", "llm", num_layers=2)
    bert = build_tiny_model(models / "bert", "bert", num_layers=2)
    return {"llm": str(llm), "bert": str(bert)}


def models_of(work: Path) -> dict[str, str]:
    """The tiny models' directories under ``work`` (made by :func:`prepare`)."""
    return {"llm": str(work / "models" / "llm"), "bert": str(work / "models" / "bert")}


def quickstart_args(models: dict, out: Path, seed: int) -> list[str]:
    sets = dict(
        llm=models["llm"],
        bert=models["bert"],
        bert_small_layers=1,
        dim=32,
        synth_docs=120,
        synth_queries=60,
        batch_size=4,
        qkd_epochs=1.0,
        qkd_batch_size=16,
        qkd_max_pseudo_queries=60,
        semantic_id_layers=2,
        query_max_length=16,
        doc_max_length=64,
        show_progress=False,
    )
    args = ["quickstart", "--out", str(out), "--seed", str(seed), "--steps", "3", "--llm-depths", "2"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    return args


def _write_stage1_config(work: Path, models: dict, ref_qs: Path, seed: int, data: dict) -> Path:
    """The ScalingDual training config of the ``stage1`` stage (checkpoints every 10 steps)."""
    from scalingnote.config import save_config
    from scalingnote.quickstart import QuickstartConfig, stage1_config

    qcfg = QuickstartConfig(
        out=str(ref_qs),
        llm=models["llm"],
        bert=models["bert"],
        llm_depths=[2],
        bert_small_layers=1,
        dim=32,
        synth_docs=120,
        synth_queries=60,
        steps=30,
        batch_size=4,
        query_max_length=16,
        doc_max_length=64,
        show_progress=False,
        seed=seed,
    )
    llm = {"model": models["llm"], "num_layers": 2, "pooling": "mean", "trainable_layers": 0}
    tc = stage1_config(
        qcfg,
        "scaling_dual",
        data,
        work / "unused",
        {**llm, "max_length": 16},
        {**llm, "max_length": 64},
        lr=qcfg.llm_lr,
        head_lr=qcfg.head_lrs[-1],
        max_epochs=qcfg.max_epochs,
    )
    tc.save_every = 10
    save_config(tc, work / "stage1.yaml")
    return work / "stage1.yaml"


def _qkd_yaml(teacher: Path, models: dict, data: dict, seed: int, out: Path) -> Path:
    """The QKD config of the ``qkd_cache`` stage, written beside ``out``."""
    from scalingnote.config import load_config, save_config
    from scalingnote.distill import DistillConfig

    dc = load_config(
        DistillConfig,
        {
            "teacher": str(teacher),
            "output_dir": str(out),
            "student": {"model": models["bert"], "num_layers": 1, "max_length": 16},
            "queries": [{"path": data["beir"]}],
            "optim": {"batch_size": 16, "epochs": 2.0},
            "teacher_batch_size": 8,
            "save_every": 5,
            "seed": seed,
            "show_progress": False,
        },
    )
    y = out.with_name(out.name + ".qkd.yaml")
    save_config(dc, y)
    return y


def _encode_args(teacher: Path, data: dict, out: Path, shard_size: str, batch_size: str) -> list[str]:
    return [
        "index",
        "encode",
        "--tower",
        str(teacher / "doc_tower"),
        "--data",
        data["beir"],
        "--out",
        str(out),
        "--shard-size",
        shard_size,
        "--batch-size",
        batch_size,
    ]


def _build_args(enc_ref: Path, seed: int, out: Path) -> list[str]:
    return [
        "index",
        "build",
        "--embeddings",
        str(enc_ref),
        "--out",
        str(out),
        "--factory",
        "IVF4,PQ8x4",
        "--semantic-ids-layers",
        "2",
        "--codebook-size",
        "4",
        "--seed",
        str(seed),
        "--overwrite",
    ]


def stage_commands(work: Path, models: dict, ref_qs: Path, seed: int) -> dict[str, Any]:
    """``{stage: f(out_dir) -> argv}`` built from the reference quick start's artefacts."""
    data = {
        "beir": str(ref_qs / "data"),
        "triplets": str(ref_qs / "data" / "triplets" / "train.jsonl"),
        "validation_triplets": str(ref_qs / "data" / "triplets" / "validation.jsonl"),
    }
    stage1_yaml = _write_stage1_config(work, models, ref_qs, seed, data)
    teacher = Path(json.loads((ref_qs / "results.json").read_text())["choices"]["teacher"]["dir"])
    qkd_yaml = partial(_qkd_yaml, teacher, models, data, seed)
    enc_ref = work / "encode_for_build"
    return {
        "stage1": lambda out: ["train", "--config", str(stage1_yaml), "--output-dir", str(out)],
        "qkd_cache": lambda out: ["distill", "--config", str(qkd_yaml(out))],
        "index_encode": lambda out: _encode_args(teacher, data, out, "16", "8"),
        "index_build": partial(_build_args, enc_ref, seed),
        "quickstart": lambda out: quickstart_args(models, out, seed),
        "_encode_for_build": lambda: _encode_args(teacher, data, enc_ref, "64", "16"),
    }
