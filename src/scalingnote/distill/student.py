"""The Stage II student (ScalingNote §3.3: own tokenizer, [CLS] first, Eq. 13; projection to
the teacher's dim, Eq. 14): loading it, its cached frozen prefix, its initial head and the
choice of the base model's layers it starts from."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalingnote.distill.config import DistillConfig
from scalingnote.distill.data import QKDData, forward_batch
from scalingnote.distill.objective import qkd_validation_loss
from scalingnote.models import PrefixTower, load_tower
from scalingnote.models.towers import matryoshka_dims_for
from scalingnote.training import distributed
from scalingnote.training.heads import init_student_head

log = logging.getLogger(__name__)


def build_student(cfg: DistillConfig, data: QKDData, device: torch.device | None = None):
    """The student (Eq. 13-14) with its initial head, its :class:`PrefixTower` when its bottom
    layers are frozen and cached (``student.trainable_layers != "all"``; else None) and, with
    ``cfg.student_layer_candidates``, which of its base model's layers it starts from: each
    candidate gets a ``head_init`` head fitted on ``layer_choice_samples`` training queries and the
    QKD validation loss, the lowest is kept and its head fitted again on ``head_init_samples``
    (None when there was nothing to choose)."""
    cands = cfg.student_layer_candidates or []
    if len(cands) < 2 or not len(data.val_idx):
        if len(cands) > 1:
            log.warning("student_layer_candidates: no validation queries to choose with; starting from %s", cands[0])
        return (*_student_start(cfg, data, device, cands[0] if cands else cfg.student.layers), None)
    tried: list[dict[str, Any]] = []
    best: tuple[Any, Any, float, list[int]] | None = None
    for layers in cands:
        student, prefix = _student_start(cfg, data, device, layers, scoring=True)
        v = qkd_validation_loss(cfg, student, prefix, data, _device(student), _use_bf16(cfg, _device(student)))
        assert v is not None  # there are validation queries (checked above)
        tried.append({"layers": list(layers), "val_loss": round(float(v), 6)})
        if best is None or v < best[2]:
            best = (student, prefix, v, list(layers))
        del student, prefix
    assert best is not None  # at least two candidates were scored
    n_score = min(
        len(data.train_idx),
        scoring_samples(best[0].config.hidden_size, cfg.layer_choice_samples, cfg.head_init_samples),
    )
    if cfg.head_init == "lstsq" and n_score < min(len(data.train_idx), cfg.head_init_samples):
        _fit_head(cfg, data, best[0], best[1], cfg.head_init_samples)  # the winner's head on the full sample
    choice = {
        "layers": best[3],
        "tried": tried,
        "reason": f"lowest QKD validation loss at the start (head fitted on {n_score} training queries, before "
        "any step): " + ", ".join(f"{t['layers']} {t['val_loss']:.4f}" for t in tried),
    }
    log.info("student layers: %s (%s)", best[3], choice["reason"])
    return best[0], best[1], choice


def _device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def _use_bf16(cfg: DistillConfig, device: torch.device) -> bool:
    return cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")


def _student_start(
    cfg: DistillConfig, data: QKDData, device: torch.device | None, layers: list[int] | None, scoring: bool = False
):
    """One student start: the student with ``layers`` of its base model, its prefix and its head
    (fitted on ``head_init_samples`` training queries, or on :func:`scoring_samples` when it is
    ``scoring`` a layer candidate). Under torchrun rank 0 fills the feature cache and fits the
    head; the other ranks read the cache after it and receive rank 0's weights, so every replica
    starts identical."""

    s = cfg.student
    student = _load_student(cfg, data.dim, device, layers)
    if student.kind != "bert":
        log.info("the student is a %s tower (ScalingNote distils into a small BERT)", student.kind)
    s_prefix = None
    main = distributed.rank() == 0
    if s.prefix_k is not None:
        if not main:
            distributed.barrier()  # rank 0 fills the cache first
        s_prefix = PrefixTower(
            student,
            s.prefix_k,
            cfg.feature_cache_dir or Path(cfg.output_dir) / "feature_cache",
            batch_size=forward_batch(cfg),
            show_progress=cfg.show_progress and main,
        )
        s_prefix.ensure(list(data.texts))
        if main:
            distributed.barrier()
    if cfg.head_init == "lstsq":
        hidden = student.config.hidden_size
        n = (
            scoring_samples(hidden, cfg.layer_choice_samples, cfg.head_init_samples)
            if scoring
            else cfg.head_init_samples
        )
        _fit_head(cfg, data, student, s_prefix, n)
    return student, s_prefix


def scoring_samples(hidden: int, layer_choice_samples: int, head_init_samples: int) -> int:
    """The head fit that scores a layer candidate: ``layer_choice_samples`` training queries, at
    least twice the student's ``hidden`` size (a least-squares fit needs them), at most
    ``head_init_samples`` (the quick start's cost model prices the same count)."""
    return min(head_init_samples, max(layer_choice_samples, 2 * hidden))


def _fit_head(cfg: DistillConfig, data: QKDData, student, prefix, n: int) -> None:
    """The ``lstsq`` head (:func:`init_student_head`) on ``n`` seeded training queries (fewer
    than twice the student's hidden size keep the random W)."""
    train_idx = data.train_idx
    need = 2 * student.config.hidden_size
    if min(len(train_idx), n) < need:
        log.warning("head_init=lstsq needs >= 2x hidden size (%d) training queries; keeping the random W", need)
        return
    main = distributed.rank() == 0
    if main:
        pick = np.sort(np.random.default_rng(cfg.seed).permutation(train_idx)[:n])
        init_student_head(
            student,
            [data.texts[i] for i in pick],
            data.targets[pick],
            batch_size=forward_batch(cfg),
            prefix=prefix,
        )
    distributed.broadcast_module(student)  # rank 0's W and centre
    if not main:
        student.set_projection("lstsq")


def _load_student(cfg: DistillConfig, dim: int, device: torch.device | None, layers: list[int] | None = None):
    """A fresh student (``layers`` of its base model; None = ``student.layers`` or its first
    ``student.num_layers``) with a (seeded, random) projection to the teacher's ``dim``; fp32
    master weights (bf16 compute on GPU comes from autocast / FSDP2's MixedPrecisionPolicy)."""

    s = cfg.student
    layers = layers if layers is not None else s.layers
    student = load_tower(
        s.model,
        "query",
        num_layers=s.num_layers,
        pooling=s.pooling,
        dim=dim,
        matryoshka_dims=_mdims(dim),
        max_query_length=s.max_length,
        projection_seed=cfg.seed,
        device=device,
        dtype=torch.float32,
        layers=layers,
    )
    if cfg.student_dropout is not None:
        for m in student.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = float(cfg.student_dropout)
    return student


def _mdims(dim: int) -> list[int]:
    return matryoshka_dims_for(dim)
