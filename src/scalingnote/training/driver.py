"""``train(config)``: build the towers for a method, train Stage I, save, evaluate.

Methods (ScalingNote §4.3), all through one trainer and one loss:

- ``scaling_dual``: query and document towers both start from the same LLM checkpoint
  (independent copies of the weights) — Stage I of ScalingNote.
- ``scaling_doc``: a small BERT query tower + the LLM document tower, trained jointly.
- ``twinbert``: BERT query tower + BERT document tower.

Outputs in ``output_dir``: ``query_tower/``, ``doc_tower/`` (paired: the query tower's
compat id is the document tower's fingerprint), ``config.yaml`` (resolved),
``run.json`` (versions, machine, metrics), ``metrics.jsonl`` (training log),
``checkpoints/`` (for ``--resume``), ``doc_embeddings.npy`` + ``doc_ids.json`` (the
evaluation corpus encoded by the final document tower, reused by QKD).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.config import save_config
from scalingnote.models import pair_towers
from scalingnote.training import distributed
from scalingnote.training.config import TrainConfig
from scalingnote.training.data import TrainingData, load_training_data
from scalingnote.training.evaluate import evaluate_pair, make_validator
from scalingnote.training.fsdp import gather_towers
from scalingnote.training.heads import head_files, init_heads, load_heads
from scalingnote.training.resume import OnChange, as_input_path, begin_run, config_inputs, finish_run
from scalingnote.training.towers import build_towers, merge_lora, prefix_encoders, setup_lora
from scalingnote.training.trainer import Trainer
from scalingnote.utils import run_metadata, seed_everything, write_json


def train(cfg: TrainConfig, resume: bool = True, on_step=None, on_change: OnChange = "refuse") -> dict[str, Any]:
    """Run Stage I end to end. Returns the metrics dict also written to ``run.json``.

    ``resume``: continue from the newest checkpoint in ``output_dir`` when it was made from the
    same inputs (:func:`stage1_inputs`); checkpoints made from other inputs are refused with the
    keys that differ (``on_change="refuse"``) or cleared (``"redo"``)."""
    # 1. the run directory: checkpoints checked against this run's inputs, the resolved config saved
    distributed.init_from_env()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    inputs = stage1_inputs(cfg)
    begin_run(out, inputs, resume=resume, on_change=on_change)  # before config.yaml is overwritten or any work
    if distributed.rank() == 0:
        save_config(cfg, out / "config.yaml")
    seed_everything(cfg.seed)
    # 2. data and towers (+ the feature caches of towers that train only their top layers)
    device = distributed.local_device()
    data = load_training_data(
        cfg.data, cfg.seed, show_progress=cfg.show_progress and distributed.rank() == 0, out_dir=out
    )
    qt, dt = build_towers(cfg, device)
    encoders = prefix_encoders(cfg, qt, dt, data)
    results = _describe(cfg, qt, dt, data)
    # 3. the start: initial heads, and its scores
    results.update(_init_heads(cfg, qt, dt, data, encoders))
    if cfg.evaluate_zero_shot and data.eval_qrels and distributed.rank() == 0:
        results.update(evaluate_pair(cfg, qt, dt, data, prefix="zero_shot_", encoders=encoders))
    # 4. training, with early stopping on the held-out validation queries
    setup_lora(cfg, (qt, dt))
    trainer = Trainer(cfg, qt, dt, data.train, device, encoders=encoders)
    results["total_steps"] = trainer.total_steps
    validate = (
        make_validator(cfg, qt, dt, data, encoders) if data.validation and (cfg.eval_every or cfg.patience) else None
    )
    seed_everything(cfg.seed)
    last = trainer.train(resume=resume, on_step=on_step, validate=validate)
    if validate is not None:
        results["val_curve"] = trainer.best["curve"]
        # per-query nDCG@10 at the best step (paired tests)
        results["best_val_per_query"] = trainer.best.get("per_query")
        results.update({k: last.pop(k, None) for k in ("steps_run", "best_step", "best_val_score", "stopped_early")})
    qt, dt = _trained_towers(cfg, trainer, qt, dt, device)
    results["train_seconds"] = round(last.pop("train_seconds", 0.0), 2)
    results.update({f"final_{k}": v for k, v in last.items()})
    # 5. save the paired towers, evaluate them, record the run
    if distributed.rank() == 0:
        _save_and_evaluate(cfg, out, qt, dt, data, encoders, results)
    finish_run(out, inputs, {"total_steps": results.get("total_steps")})
    return results


def stage1_inputs(cfg: TrainConfig) -> dict[str, Any]:
    """What a Stage I run's checkpoints depend on (:mod:`scalingnote.training.resume`): the config
    with the data files and local model directories fingerprinted."""
    d = cfg.data
    return config_inputs(
        cfg,
        {
            "data.data_dir": d.data_dir,
            "data.triplets": d.triplets,
            "data.validation_triplets": d.validation_triplets,
            "query_tower.model": cfg.query_tower.model,
            "doc_tower.model": cfg.doc_tower.model,
            "init_heads_from": _head_inputs(cfg.init_heads_from),
            **({"data.mining.tower": _miner_inputs(d.mining.tower)} if d.negatives in ("dense", "mixed") else {}),
        },
    )


def _miner_inputs(tower: str | None) -> Any:
    """``data.mining.tower`` as inputs: a Stage I run's two tower directories fingerprinted (not its
    checkpoints or logs), else the path or name as :func:`as_input_path` gives it."""
    run = Path(tower or "").expanduser()
    if tower and (run / "query_tower").is_dir() and (run / "doc_tower").is_dir():
        return {"query_tower": run / "query_tower", "doc_tower": run / "doc_tower"}
    return as_input_path(tower)


def _head_inputs(run_dir: str | None) -> dict[str, Any] | None:
    """``init_heads_from`` as inputs: its two head files fingerprinted (not the whole run directory)."""
    return {side: as_input_path(str(f)) for side, f in head_files(run_dir).items()} if run_dir else None


def _describe(cfg: TrainConfig, qt, dt, data: TrainingData) -> dict[str, Any]:
    return {
        "method": cfg.method,
        "train_examples": len(data.train),
        "validation_examples": len(data.validation),
        "dropped_eval_overlap_queries": data.dropped_eval_overlap,
        **({"mining": data.mining} if data.mining is not None else {}),
        "query_tower_non_embedding_params": qt.non_embedding_params,
        "doc_tower_non_embedding_params": dt.non_embedding_params,
        "query_trainable_layers": cfg.query_tower.trainable_layers,
        "doc_trainable_layers": cfg.doc_tower.trainable_layers,
    }


def _init_heads(cfg: TrainConfig, qt, dt, data: TrainingData, encoders) -> dict[str, float] | dict[str, str]:
    """Centre (and initialise, ``projection_init``) both heads from a seeded sample of the training
    pairs, or load them from a finished run (``init_heads_from``)."""
    if not cfg.center:
        return {}
    if cfg.init_heads_from:
        return load_heads(qt, dt, cfg.init_heads_from)
    order = np.random.default_rng(cfg.seed).permutation(len(data.train))
    sample = [data.train[i] for i in order[: cfg.center_samples]]
    return init_heads(qt, dt, sample, cfg.projection_init, n=cfg.center_samples, encoders=encoders)


def _trained_towers(cfg: TrainConfig, trainer: Trainer, qt, dt, device):
    """The trained towers as ordinary modules: FSDP2 shards gathered on rank 0 (None elsewhere), LoRA merged."""
    if trainer.sharded:

        def fresh():  # same architecture (LoRA included) to load the gathered weights into
            towers = build_towers(cfg, device)
            setup_lora(cfg, towers)
            return towers

        qt, dt = gather_towers((qt, dt), fresh)
    merge_lora((qt, dt))
    return qt, dt


def _save_and_evaluate(
    cfg: TrainConfig, out: Path, qt, dt, data: TrainingData, encoders, results: dict[str, Any]
) -> None:
    pair_towers(qt, dt)
    qt.save(out / "query_tower")
    dt.save(out / "doc_tower")
    results["compat_id"] = qt.compat_id
    if data.eval_qrels or data.validation:
        results.update(evaluate_pair(cfg, qt, dt, data, save_embeddings=out, encoders=encoders))
    write_json(out / "run.json", {"metrics": results, **run_metadata(cfg)})


__all__ = ["stage1_inputs", "train"]
