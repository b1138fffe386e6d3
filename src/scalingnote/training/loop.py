"""The one training loop of every stage (Stage I, QKD, the TMJ learned-PQ phases).

:class:`TrainLoop` owns the scaffolding the three trainers share: AdamW with the
Table 7 parameter groups and the linear warm-up/decay schedule, the step loop with gradient
clipping, progress bar, ``metrics.jsonl`` logging and TensorBoard curves
(:mod:`scalingnote.training.curves`: loss, learning rate, validation metric, throughput per step),
checkpoints every ``save_every`` steps with
exact resume (model + optimizer + scheduler + step + every RNG state; log lines written after
the checkpoint are dropped on resume), a checkpoint on Ctrl-C, and validation with early
stopping and best-weights restore. A stage subclasses it (the shape of FlagEmbedding's
``AbsRunner``) and fills in:

* :meth:`train_step` — forward + backward for step ``step`` (gradients left in ``.grad``),
  returning the loss components to log;
* :meth:`model_state` / :meth:`load_model_state` — what of the model goes into a checkpoint;
* optionally :meth:`validate` (a score, ``higher_is_better``), :meth:`before_step`,
  :meth:`after_step`, :meth:`log_record`, :meth:`checkpoint_modules` (names in sharded
  checkpoints), :meth:`trainable_state` / :meth:`restore_trainable` (best weights),
  :meth:`examples_per_step` (throughput) and :meth:`val_tag` (the validation curve's name).

Under ``torchrun`` the loop is data parallel: with ``sharded`` False (DDP) it averages the
gradients of :meth:`modules` across ranks before clipping and rank 0 writes the checkpoints;
with ``sharded`` True (the stage applied FSDP2, :mod:`scalingnote.training.fsdp`) the
reduce-scatter in backward has averaged them already and every rank writes its shards.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from scalingnote.errors import ScalingNoteError
from scalingnote.training import distributed
from scalingnote.training.checkpoint import load_latest_checkpoint, rng_state, save_checkpoint, set_rng_state
from scalingnote.training.curves import Curves
from scalingnote.training.fsdp import load_latest_sharded, save_sharded
from scalingnote.training.params import adamw, load_trained_state, param_groups, trained_state
from scalingnote.training.schedule import linear_warmup_decay
from scalingnote.training.settings import LoopCadence
from scalingnote.training.timebox import PACE_PROBE, check_resumed_total, fit_to_box

log = logging.getLogger(__name__)


def _local(t: Tensor) -> Tensor:
    """This rank's shard of an FSDP2 (DTensor) parameter; the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


class StopTraining(Exception):
    """Raised by a step callback to stop after a checkpoint (used by tests to simulate a kill)."""


@dataclass
class LoopSettings(LoopCadence):
    """How the loop runs: clipping, logging / checkpoint / validation periods (the
    :class:`~scalingnote.training.settings.LoopCadence` fields), early stopping."""

    max_grad_norm: float = 1.0
    eval_every: int | None = 0  # 0 or None: validate only at the start and the end
    patience: int | None = None  # validations without improvement before stopping (None: never stop)
    restore_best: bool = True  # end with the best validated weights
    # a time box (scalingnote.training.timebox): the loop's own seconds (earlier runs included) and/or
    # a time.monotonic() deadline; the step count is re-planned to fit, never below min_steps
    max_seconds: float | None = None
    deadline: float | None = None
    min_steps: int = 0


class TrainLoop:
    """Shared step loop; see the module docstring for the hooks a stage fills in."""

    desc = "train"
    higher_is_better = True  # validate() returns a score (True) or a loss (False)
    save_when_stopping = True  # checkpoint at a save_every step even when validation stops there

    def __init__(
        self,
        out_dir: str | Path,
        total_steps: int,
        settings: LoopSettings,
        *,
        metrics_path: str | Path | None = None,
        is_main: bool = True,
    ):
        self.out = Path(out_dir)
        self.total_steps = self.planned_steps = int(total_steps)  # total_steps: as a time box re-planned it
        self.settings = settings
        self.val_seconds = self.last_val_seconds = 0.0  # validation time of this run (the time box's pace)
        self.metrics_path = Path(metrics_path) if metrics_path is not None else self.out / "metrics.jsonl"
        self.is_main = is_main
        self.step = 0
        self.prior_seconds = 0.0  # optimiser time of earlier (interrupted) runs
        self.best: dict[str, Any] = {"score": None, "step": 0, "state": None, "bad": 0, "curve": []}
        self.optimizer: torch.optim.Optimizer | None = None  # build_optimizer()
        self._t0: float | None = None  # perf_counter() when run() started its steps
        self.scheduler: Any = None
        self.sharded = False  # set by a stage that applied FSDP2 to its modules
        self.curves = Curves(self.out, enabled=False)  # opened by run()

    # -- optimizer ----------------------------------------------------------------------------
    def build_optimizer(
        self,
        groups: list[dict],
        warmup_ratio: float,
        betas: Sequence[float] = (0.9, 0.999),
        eps: float = 1e-8,
        *,
        schedule: str = "linear",
        warmup_steps: int | None = None,
    ) -> None:
        """AdamW over ``groups`` (see :func:`param_groups`) + :func:`linear_warmup_decay`."""
        groups = [g for g in groups if g["params"]]
        if not groups:
            raise ScalingNoteError(f"{self.desc}: nothing to train (every parameter is frozen)")
        self.optimizer = adamw(groups, betas, eps)
        warm = warmup_steps if warmup_steps is not None else math.ceil(warmup_ratio * self.total_steps)
        self.schedule_args, self.warmup_steps = (schedule, warm), warm  # the planned warm-up; the current one
        self.scheduler = linear_warmup_decay(
            self.optimizer, self.total_steps, warmup_ratio, schedule=schedule, warmup_steps=warm
        )

    def _built_optimizer(self) -> torch.optim.Optimizer:
        assert self.optimizer is not None, "build_optimizer() comes first"
        return self.optimizer

    def trainable_params(self) -> list[Tensor]:
        return [p for g in self._built_optimizer().param_groups for p in g["params"]]

    # -- hooks a stage fills in ------------------------------------------------------------------
    def modules(self) -> list[nn.Module]:
        """Modules switched to train mode during the loop (and back to eval after it)."""
        return []

    def train_step(self, step: int) -> dict[str, float]:
        """Forward + backward of step ``step``; returns the loss components (``loss`` first)."""
        raise NotImplementedError

    def model_state(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_model_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def val_per_query(self) -> dict[str, float] | None:
        """Per-query scores of the last :meth:`validate` (kept with the best step), or None."""
        return None

    def validate(self) -> float | None:
        """Validation score (or loss, ``higher_is_better = False``); None: no validation."""
        return None

    def has_validation(self) -> bool:
        return type(self).validate is not TrainLoop.validate

    def before_step(self, step: int) -> None:
        """Called before :meth:`train_step` (e.g. re-mining negatives)."""

    def after_step(self, step: int) -> None:
        """Called after each optimizer step and its checkpoint; may raise :class:`StopTraining`."""

    def reduce_gradients(self) -> None:
        """Called between backward and clipping: under torchrun without sharding, DDP's
        average of the gradients over ranks (FSDP2 has reduce-scattered them in backward)."""
        if not self.sharded:
            distributed.average_gradients(self.modules())

    def checkpoint_modules(self) -> dict[str, nn.Module]:
        """The modules of a sharded checkpoint, by the name their keys are stored under."""
        return {str(i): m for i, m in enumerate(self.modules())}

    def log_record(self, comps: dict[str, float], validated: bool) -> dict[str, Any] | None:
        """The ``metrics.jsonl`` line for this step, or None to skip it."""
        if self.step % self.settings.log_every == 0 or self.step == self.total_steps:
            return {"step": self.step, **{k: round(v, 6) for k, v in comps.items()}}
        return None

    def examples_per_step(self) -> int | None:
        """Examples in one optimizer step (all ranks), for the throughput curve; None: log steps/s."""
        return None

    def val_tag(self) -> str:
        """The TensorBoard tag of the validation curve."""
        return "val/score" if self.higher_is_better else "val/loss"

    def keep_log_line(self, rec: dict[str, Any], step: int) -> bool:
        """On resume at ``step``: keep this earlier log line (lines of later steps are redone)."""
        return rec.get("step", 0) <= step

    def trainable_state(self) -> dict[str, Tensor]:
        """The weights that training changes (the best-weights snapshot; this rank's shards
        when sharded)."""
        return {
            f"{i}.{k}": _local(v).detach().clone().cpu()
            for i, m in enumerate(self.modules())
            for k, v in m.named_parameters()
            if v.requires_grad
        }

    def restore_trainable(self, state: dict[str, Tensor]) -> None:
        params = {f"{i}.{k}": v for i, m in enumerate(self.modules()) for k, v in m.named_parameters()}
        with torch.no_grad():
            for key, v in state.items():
                dst = _local(params[key])
                dst.copy_(v.to(dst.device))

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self, rng: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "step": self.step,
            "total_steps": self.total_steps,
            "planned_steps": self.planned_steps,
            "warmup_steps": getattr(self, "warmup_steps", None),
            "optimizer": self._built_optimizer().state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng if rng is not None else rng_state(),
            "best": self.best,
            "train_seconds": self.train_seconds(),
            **self.model_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_resumed_total(self, state, self.out)
        self.load_model_state(state)
        self._built_optimizer().load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        per_rank = state.get("rng_ranks")  # a data-parallel (DDP) run: every rank's own RNG streams
        if per_rank and len(per_rank) == distributed.world_size():
            set_rng_state(per_rank[distributed.rank()])
        elif state.get("rng") is not None:
            if per_rank:
                log.warning(
                    "%s: checkpoint written by %d processes, this run has %d: RNG streams are not replayed exactly",
                    self.out,
                    len(per_rank),
                    distributed.world_size(),
                )
            set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.best = state.get("best") or self.best
        self.prior_seconds = float(state.get("train_seconds", 0.0))

    def save(self, rng: dict[str, Any] | None = None) -> None:
        """Checkpoint the current step (collective under torchrun)."""
        self.curves.flush()  # the curves up to a checkpoint survive a crash after it
        if self.sharded:
            save_sharded(self, rng)
            return
        rng = rng if rng is not None else rng_state()
        per_rank = distributed.gather_to_rank0(rng)  # rank 0 writes the file; each rank resumes its own dropout streams
        if self.is_main:
            state = self.state_dict(rng)
            if per_rank is not None:
                state["rng_ranks"] = per_rank
            save_checkpoint(self.out, self.step, state, keep=self.settings.keep_checkpoints)
        distributed.barrier()

    def load_latest(self) -> bool:
        """Load the newest checkpoint under ``out``; True when there was one."""
        if self.sharded:
            return load_latest_sharded(self) is not None
        ck = load_latest_checkpoint(self.out)
        if ck is None:
            return False
        self.load_state_dict(ck[1])
        return True

    # -- metrics log ----------------------------------------------------------------------------
    def _truncate_log(self, step: int) -> None:
        p = self.metrics_path
        if not p.exists() or not self.is_main:
            return
        keep = [
            ln
            for ln in p.read_text(encoding="utf-8").splitlines()
            if ln.strip() and self.keep_log_line(json.loads(ln), step)
        ]
        p.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")

    def _log_step(self, comps: dict[str, float], validated: bool, seconds: float) -> None:
        """This step's curves (every step) and its ``metrics.jsonl`` line (every ``log_every``)."""
        self.curves.scalars("train", {k: v for k, v in comps.items() if k not in ("val_score", "val_loss")}, self.step)
        n = self.examples_per_step()
        if seconds > 0:
            self.curves.scalar(
                "throughput/examples_per_s" if n else "throughput/steps_per_s", (n or 1) / seconds, self.step
            )
        rec = self.log_record(comps, validated)
        if rec is not None:
            self.write_log(rec)

    def write_log(self, rec: dict[str, Any]) -> None:
        if self.is_main:
            self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.metrics_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(rec) + "\n")

    # -- validation -----------------------------------------------------------------------------
    def _set_train(self, on: bool) -> None:
        for m in self.modules():
            m.train(on)

    def check_validation(self, comps: dict[str, float]) -> bool:
        """Validate, remember the best trainable weights; True when ``patience`` is exhausted."""
        self._set_train(False)
        t0 = time.perf_counter()
        try:
            score = self.validate()
        finally:
            self._set_train(True)
            self.last_val_seconds = time.perf_counter() - t0
            self.val_seconds += self.last_val_seconds
        if score is None:
            return False
        # every rank validates (a sharded forward is collective); rank 0's score decides, so the
        # ranks cannot part ways on early stopping over a last-bit difference
        score = float(distributed.broadcast_float(float(score)))
        b = self.best
        b["curve"].append([self.step, round(score, 6)])
        self.curves.scalar(self.val_tag(), score, self.step)
        comps["val_score" if self.higher_is_better else "val_loss"] = score
        better = b["score"] is None or (score > b["score"] if self.higher_is_better else score < b["score"])
        if better:
            b.update(
                score=score,
                step=self.step,
                bad=0,
                state=self.trainable_state() if self.settings.restore_best else None,
                per_query=self.val_per_query(),
            )
        else:
            b["bad"] += 1
        return self.settings.patience is not None and b["bad"] >= self.settings.patience

    # -- the loop -------------------------------------------------------------------------------
    def train_seconds(self) -> float:
        """Optimiser time so far, earlier (interrupted and resumed) runs included."""
        return self.prior_seconds + self._elapsed()

    def _elapsed(self) -> float:
        t0 = getattr(self, "_t0", None)
        return time.perf_counter() - t0 if t0 is not None else 0.0

    def optimizer_step(self) -> float:
        self.reduce_gradients()
        gnorm = torch.nn.utils.clip_grad_norm_(self.trainable_params(), self.settings.max_grad_norm)
        self._built_optimizer().step()
        self.scheduler.step()
        self._built_optimizer().zero_grad(set_to_none=True)
        return float(gnorm)

    def _postfix(self, bar, comps: dict[str, float]) -> None:
        extra = {}
        for key in ("val_score", "val_loss"):
            if key in comps:
                extra["val"] = f"{comps[key]:.4f}"
        bar.set_postfix(loss=f"{comps['loss']:.4f}", **extra)

    def run(self, resume: bool = True) -> dict[str, float]:
        """Train to ``total_steps`` (resuming from the newest checkpoint with ``resume``); returns
        the last step's components plus ``train_seconds`` (this run), ``steps_run`` and, with
        validation, ``best_step`` / ``best_val_score`` / ``stopped_early``."""
        self.out.mkdir(parents=True, exist_ok=True)
        self._t0 = None
        if resume and self.load_latest():
            log.info("%s: resumed from step %d", self.desc, self.step)
        self._truncate_log(self.step)
        self.curves = Curves(self.out, self.step, enabled=self.is_main)
        try:
            return self._run()
        finally:
            self.curves.close()

    def _run(self) -> dict[str, float]:
        from tqdm.auto import tqdm

        self._set_train(True)
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc=self.desc,
            disable=not self.settings.show_progress or not self.is_main,
            dynamic_ncols=True,
        )
        last: dict[str, float] = {}
        self._t0 = time.perf_counter()
        self.steps_done = 0
        step_rng = rng_state()
        validating = self.has_validation()
        every = self.settings.eval_every
        stop = False
        # where a Ctrl-C lands: "grad" (weights untouched: checkpoint the state before the step),
        # "update" (optimizer mid-update: no consistent state, no checkpoint), "done" (checkpoint now)
        zone = "done"
        if validating and self.step == 0 and not self.best["curve"]:
            stop = self.check_validation({})  # the start is a candidate too
        try:
            while self.step < self.total_steps and not stop:
                t_step = time.perf_counter()
                step_rng = rng_state()  # an interrupt mid-step checkpoints the state before the step
                zone = "grad"
                self.before_step(self.step)
                comps = self.train_step(self.step)
                zone = "update"
                comps["grad_norm"] = self.optimizer_step()
                self.step += 1
                zone = "done"
                step_seconds = time.perf_counter() - t_step  # forward, backward and update (not validation)
                self.steps_done += 1
                comps["lr"] = float(self.scheduler.get_last_lr()[0])
                last = comps
                bar.update(1)
                validated = False
                if validating and every and (self.step % every == 0 or self.step == self.total_steps):
                    stop = self.check_validation(comps)
                    validated = True
                if validated or self.steps_done % PACE_PROBE == 0:
                    fit_to_box(self)  # a time box: the end re-planned at the pace measured so far
                    bar.total = self.total_steps
                self._postfix(bar, comps)
                self._log_step(comps, validated, step_seconds)
                if (
                    self.step % self.settings.save_every == 0
                    and self.step < self.total_steps
                    and (self.save_when_stopping or not stop)
                ):
                    self.save()
                self.after_step(self.step)
        except KeyboardInterrupt:
            bar.close()
            if zone != "update":
                log.warning("%s: interrupted at step %d: writing a checkpoint; rerun to resume", self.desc, self.step)
                self._built_optimizer().zero_grad(set_to_none=True)
                self.save(rng=step_rng if zone == "grad" else None)
            raise
        finally:
            bar.close()
        if validating and (not every or not self.best["curve"] or self.best["curve"][-1][0] != self.step):
            self.check_validation(last)  # the final weights are a candidate too
        b = self.best
        if validating and self.settings.restore_best and b["state"] is not None and b["step"] != self.step:
            log.info("%s: restoring the best validated weights (step %d, %.4f)", self.desc, b["step"], b["score"])
            self.restore_trainable(b["state"])
        self._set_train(False)
        last["train_seconds"] = self._elapsed()
        self.total_train_seconds = self.prior_seconds + last["train_seconds"]
        last["steps_run"] = self.step
        last["planned_steps"] = self.planned_steps
        if validating:
            last["best_step"] = b["step"]
            last["best_val_score"] = b["score"]
            last["stopped_early"] = float(self.step < self.total_steps)
        return last


__all__ = [
    "LoopSettings",
    "StopTraining",
    "TrainLoop",
    "adamw",
    "linear_warmup_decay",
    "load_trained_state",
    "param_groups",
    "trained_state",
]
