"""Stage II: distil the Stage I query tower into a small BERT student (ScalingNote §3.3).

The student (own tokenizer, [CLS] first, Eq. 13; projection to the teacher's dim,
Eq. 14) is trained with Eq. 15 on queries only, against cached teacher embeddings.
ScalingNote = the student + the frozen Stage I document embeddings: documents are
never re-encoded, and the student carries the document tower's compat id so an
index built from those embeddings accepts it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from scalingnote.config import save_config
from scalingnote.distill.batches import bucketed_batches, cheapest_chunks, epoch_order, length_chunks
from scalingnote.distill.config import DistillConfig
from scalingnote.distill.data import QKDData, prepare_data, token_lengths
from scalingnote.distill.objective import qkd_batch_loss, qkd_validation_loss
from scalingnote.distill.student import _load_student, _use_bf16, build_student
from scalingnote.errors import ScalingNoteError
from scalingnote.evaluation.dense import dense_metrics, truncate_normalize
from scalingnote.training import distributed
from scalingnote.training.fsdp import gather_towers, shard_towers
from scalingnote.training.loop import LoopSettings, TrainLoop, param_groups
from scalingnote.training.resume import OnChange, as_input_path, begin_run, config_inputs, finish_run
from scalingnote.utils import run_metadata, seed_everything, write_json

log = logging.getLogger(__name__)


class QKDLoop(TrainLoop):
    """Stage II on the shared loop: Eq. 15 on a batch of queries against the cached teacher
    embeddings; validation = the loss on held-out queries (lower is better).

    Under torchrun each rank takes its slice of the global batch (``optim.batch_size``) and its
    loss is the slice's mean; the ranks' gradients are averaged (DDP all-reduce, or FSDP2's
    reduce-scatter with ``distributed: fsdp``), so a step equals one process's step on the whole
    batch (``tests/distill/test_qkd_distributed.py``)."""

    desc = "QKD"
    higher_is_better = False
    save_when_stopping = False

    def __init__(
        self,
        cfg: DistillConfig,
        out: Path,
        student,
        prefix,
        data: QKDData,
        on_step: Callable[[int], None] | None = None,
        *,
        deadline: float | None = None,
        min_steps: int = 0,
    ):
        o = cfg.optim
        ws = distributed.world_size()
        distributed.local_batch_size(o.batch_size)  # checks that the ranks split the global batch evenly
        bs = min(o.batch_size, len(data.train_idx))
        bs -= bs % ws
        if bs == 0:
            raise ScalingNoteError(f"distill: {len(data.train_idx)} training queries for {ws} processes")
        steps_per_epoch = max(1, len(data.train_idx) // bs)
        total = math.ceil(o.epochs * steps_per_epoch)
        total = min(total, o.max_steps) if o.max_steps else total
        settings = LoopSettings(
            **cfg.cadence(),
            max_grad_norm=o.max_grad_norm,
            eval_every=cfg.eval_every or steps_per_epoch,
            patience=cfg.patience,
            restore_best=True,
            max_seconds=o.max_seconds,
            deadline=deadline,
            min_steps=min(min_steps, total),
        )
        super().__init__(out, total, settings, is_main=distributed.rank() == 0)
        self.cfg, self.student, self.prefix = cfg, student, prefix
        self.data = data
        self.train_idx, self.val_idx, self.bs, self.steps_per_epoch = data.train_idx, data.val_idx, bs, steps_per_epoch
        self.device = next(student.parameters()).device
        self.use_bf16 = _use_bf16(cfg, self.device)
        self._on_step = on_step
        self.chunk = step_chunk(cfg, self.device)
        if (cfg.length_buckets or self.chunk) and data.lengths is None:
            data.lengths = token_lengths(student, data.texts)
        self._epoch_batches: tuple[int, np.ndarray] | None = None
        if cfg.distributed == "fsdp":  # shard before the optimizer sees the parameters
            self.sharded = shard_towers([student], self.device, cfg.fsdp, cfg.precision)
        self.build_optimizer(param_groups([student], o.lr, o.lr, o.weight_decay), o.warmup_ratio, o.betas, o.eps)

    def modules(self) -> list:
        return [self.student]

    def checkpoint_modules(self) -> dict:
        return {"student": self.student}

    def trainable_params(self) -> list[torch.Tensor]:
        return list(self.student.parameters())

    def batch_loss(self, idx: np.ndarray) -> torch.Tensor:
        return qkd_batch_loss(self.cfg, self.student, self.prefix, self.data, idx, self.device, self.use_bf16)

    def batch_for_step(self, step: int) -> np.ndarray:
        """This rank's rows of step ``step``: the global batch is a pure function of
        ``(seed, epoch, step)`` (a slice of the epoch's permutation or, with ``length_buckets``,
        a length-bucketed batch of it: :mod:`scalingnote.distill.batches`); rank r takes its
        ``r``-th slice."""
        epoch, i = divmod(step, self.steps_per_epoch)
        if not self.cfg.length_buckets:
            order = epoch_order(self.train_idx, self.cfg.seed, epoch)
            return distributed.rank_slice(order[i * self.bs : (i + 1) * self.bs])
        if self._epoch_batches is None or self._epoch_batches[0] != epoch:
            assert self.data.lengths is not None  # measured in __init__
            batches = bucketed_batches(
                self.train_idx,
                self.data.lengths,
                self.bs,
                self.steps_per_epoch,
                self.cfg.seed,
                epoch,
                self.cfg.length_buckets,
            )
            self._epoch_batches = (epoch, batches)
        return distributed.rank_slice(self._epoch_batches[1][i])

    def train_step(self, step: int) -> dict[str, float]:
        """Forward and backward of the step's batch, in length-sorted chunks (``step_chunk``): each
        chunk's mean loss weighted by its share of the batch, so the summed gradients and the loss
        are the batch mean's."""
        idx = self.batch_for_step(step)
        lengths = self.data.lengths
        if self.chunk == 0 or lengths is None:
            parts = [idx]
        else:
            parts = cheapest_chunks(idx, lengths) if self.chunk == "auto" else length_chunks(idx, lengths, self.chunk)
        total = 0.0
        for part in parts:
            loss = self.batch_loss(part) * (len(part) / len(idx))
            loss.backward()
            total += float(loss.detach())
        return {"loss": distributed.mean_over_ranks(total)}  # the global batch's loss

    def has_validation(self) -> bool:
        return len(self.val_idx) > 0

    def validate(self) -> float | None:
        """Mean Eq. 15 loss over the validation queries (:func:`qkd_validation_loss`)."""
        return qkd_validation_loss(self.cfg, self.student, self.prefix, self.data, self.device, self.use_bf16)

    def model_state(self) -> dict[str, Any]:
        return {"student": self.student.state_dict()}

    def load_model_state(self, state: dict[str, Any]) -> None:
        self.student.load_state_dict(state["student"])

    def after_step(self, step: int) -> None:
        if self._on_step is not None:
            self._on_step(step)

    def examples_per_step(self) -> int:
        return self.bs

    def log_record(self, comps: dict[str, float], validated: bool) -> dict[str, Any] | None:
        if not (self.step % self.cfg.log_every == 0 or self.step == self.total_steps or validated):
            return None
        rec: dict[str, Any] = {"step": self.step, "loss": comps["loss"], "lr": comps["lr"]}
        if validated:
            rec["val_loss"] = self.best["curve"][-1][1]
        return rec


def step_chunk(cfg: DistillConfig, device: torch.device) -> int | Literal["auto"]:
    """``step_chunk`` resolved (0 = one forward over the batch): null is "auto" on a CPU
    (:func:`cheapest_chunks`) and 0 on a GPU; 0 under FSDP (its backward reduce-scatters each
    pass's gradients)."""
    if cfg.distributed == "fsdp" and distributed.is_distributed():
        return 0
    if cfg.step_chunk is None:
        return "auto" if device.type == "cpu" else 0
    return cfg.step_chunk


def qkd_inputs(cfg: DistillConfig) -> dict[str, Any]:
    """What a QKD run's checkpoints depend on (:mod:`scalingnote.training.resume`): the config
    (teacher-cache location and batch sizes aside) with the teacher's query tower and document
    embeddings, the query sources, the evaluation data and a local student model fingerprinted."""
    inputs = config_inputs(cfg, {"eval_data": cfg.eval_data, "student.model": cfg.student.model})
    inputs.pop("cache_dir", None)
    inputs.pop("teacher_batch_size", None)
    inputs.pop("cpu_batch_size", None)
    inputs.pop("step_chunk", None)
    teacher = Path(cfg.teacher)
    inputs["teacher"] = {
        "dir": str(teacher.resolve()),
        "query_tower": teacher / "query_tower",
        "doc_embeddings": teacher / "doc_embeddings.npy",
    }
    inputs["queries"] = [{**q, "path": as_input_path(q["path"])} for q in inputs["queries"]]
    return inputs


def distill(
    cfg: DistillConfig,
    resume: bool = True,
    on_step: Callable[[int], None] | None = None,
    on_change: OnChange = "refuse",
    *,
    deadline: float | None = None,
    min_steps: int = 0,
) -> dict[str, Any]:
    """Run QKD end to end; returns the metrics also written to ``run.json`` (under torchrun: by
    rank 0, which also saves and evaluates the gathered student; other ranks return ``{}``).
    ``on_step(step)`` runs after every optimizer step (and its checkpoint). ``resume`` continues
    from checkpoints made from the same inputs (:func:`qkd_inputs`); others are refused with the
    keys that differ (``on_change="refuse"``) or cleared (``"redo"``). ``deadline`` (a
    ``time.monotonic()`` instant, e.g. a time budget's) boxes the loop like ``optim.max_seconds``,
    never below ``min_steps`` steps (:mod:`scalingnote.training.timebox`)."""
    distributed.init_from_env()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    inputs = qkd_inputs(cfg)
    begin_run(
        out,
        inputs,
        resume=resume,
        on_change=on_change,  # before config.yaml is overwritten or any work
        stale=() if cfg.cache_dir else ("teacher_cache",),
    )  # a redo re-encodes its queries with the teacher
    main = distributed.rank() == 0
    if main:
        save_config(cfg, out / "config.yaml")
    seed_everything(cfg.seed)
    data = prepare_data(cfg)
    device = distributed.local_device()
    student, s_prefix, layer_choice = build_student(cfg, data, device)
    n_params, n_layers = student.non_embedding_params, student.config.num_layers
    loop = QKDLoop(cfg, out, student, s_prefix, data, on_step=on_step, deadline=deadline, min_steps=min_steps)
    last = loop.run(resume=resume)
    train_loss = float(last.get("loss", float("nan")))
    val = loop.validate()  # collective when sharded: every rank takes part
    if loop.sharded:  # FSDP2: rank 0 gets an ordinary student with the trained weights
        (student,) = gather_towers(
            [student], lambda: [_load_student(cfg, data.dim, device, student.config.base_layers)]
        )
    distributed.barrier()
    if not main:
        return {}
    student.eval()
    # ScalingNote: the student serves queries against the frozen Stage I document embeddings
    student.compat_id = data.compat_id
    student.save(out / "query_tower")
    best = loop.best
    res: dict[str, Any] = {
        "student": cfg.student.model,
        "student_layers": n_layers,
        "student_base_layers": student.config.base_layers,  #: None = the base model's first student_layers
        "student_layer_choice": layer_choice,
        "student_non_embedding_params": n_params,
        "train_queries": int(len(data.train_idx)),
        "validation_queries": int(len(data.val_idx)),
        "processes": distributed.world_size(),
        "distributed": cfg.distributed if distributed.is_distributed() else "none",
        "steps": loop.total_steps,
        "planned_steps": loop.planned_steps,  # before a time box re-planned them (= steps without one)
        "steps_run": loop.step,
        "best_step": best["step"],
        "stopped_early": loop.step < loop.total_steps,
        "val_curve": best["curve"],
        "target": cfg.target,
        "rank_weight": cfg.rank_weight,
        "length_buckets": cfg.length_buckets,
        "student_trainable_layers": cfg.student.trainable_layers,
        "train_seconds": round(loop.total_train_seconds, 2),  # summed over resumed runs
        "qkd_train_loss": train_loss,
        "qkd_val_loss": val,
        "compat_id": student.compat_id,
        **{f"queries_{k}": v for k, v in data.query_stats.items()},
    }
    if data.eval_qrels:
        res.update(evaluate_student(student, cfg.teacher, data.eval_queries, data.eval_qrels))
    write_json(out / "run.json", {"metrics": res, **run_metadata(cfg)})
    finish_run(out, inputs, {"steps": loop.total_steps})
    return res


def evaluate_student(
    student, teacher_dir: str | Path, queries: dict[str, str], qrels, tau: float = 0.05
) -> dict[str, float]:
    """ScalingNote retrieval: student query embeddings against the Stage I document embeddings."""

    t = Path(teacher_dir)
    d_emb = np.load(t / "doc_embeddings.npy", mmap_mode="r")
    doc_ids = json.loads((t / "doc_ids.json").read_text(encoding="utf-8"))
    qids = list(queries)
    q = truncate_normalize(student.encode_queries([queries[x] for x in qids], batch_size=256, show_progress=False))
    return dense_metrics(q, qids, truncate_normalize(d_emb), doc_ids, qrels, tau=tau)
