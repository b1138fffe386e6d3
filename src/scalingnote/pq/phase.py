"""One TMJ phase (warm-up, stage 1, stage 2) on the shared training loop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from scalingnote.pq.config import PhaseOptim
from scalingnote.pq.encoders import Side
from scalingnote.training.loop import LoopSettings, TrainLoop


class PhaseOwner(Protocol):
    """What a phase uses of the trainer that runs it (:class:`scalingnote.pq.train.TMJTrainer`)."""

    cfg: Any  # PQTrainConfig: log_every, save_every, keep_checkpoints
    out: Path
    progress: bool
    q_tower: Any
    n_train: int
    on_step: Callable[[str, int], None] | None

    def _batch(self, phase: str, spec: PhaseOptim, step: int, negatives: list[np.ndarray]) -> tuple: ...

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, snapshot: dict[str, Any]) -> None: ...


class PhaseLoop(TrainLoop):
    """One TMJ phase (warm-up, stage 1, stage 2) on the shared training loop: checkpoints under
    ``<out>/<phase>/``, log lines tagged with the phase, negatives re-mined every
    ``remine_every`` steps and saved with the checkpoint."""

    def __init__(
        self,
        tr: PhaseOwner,
        phase: str,
        spec: PhaseOptim,
        groups: list[dict],
        loss_fn,
        negatives: list[np.ndarray],
        remine: Callable[[], list[np.ndarray]] | None,
        remine_every: int,
        sides: tuple[Side, ...],
    ):
        cfg = tr.cfg
        settings = LoopSettings(**{**cfg.cadence(), "show_progress": tr.progress}, max_grad_norm=spec.max_grad_norm)
        super().__init__(tr.out / phase, int(spec.steps), settings, metrics_path=tr.out / "metrics.jsonl")
        self.desc = f"TMJ {phase}"
        self.tr, self.phase, self.spec, self.loss_fn, self.negatives = tr, phase, spec, loss_fn, negatives
        self.remine, self.remine_every, self.sides = remine, remine_every, sides
        self.build_optimizer(groups, spec.warmup_ratio)

    def _set_train(self, on: bool) -> None:
        for side in self.sides:
            side.train_mode(on)

    def run(self, resume: bool = True) -> dict[str, float]:
        try:
            return super().run(resume)
        finally:
            self._set_train(False)

    def before_step(self, step: int) -> None:
        if self.remine is not None and self.remine_every and step % self.remine_every == 0:
            self.negatives = self.remine()

    def train_step(self, step: int) -> dict[str, float]:
        qrows, cand, targets, mask = self.tr._batch(self.phase, self.spec, step, self.negatives)
        dev = self.tr.q_tower.device
        loss, comps = self.loss_fn(qrows, cand, targets.to(dev), mask.to(dev))
        assert self.optimizer is not None  # built by the phase before its first step
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return comps

    def after_step(self, step: int) -> None:
        if self.tr.on_step is not None:
            self.tr.on_step(self.phase, step)

    def model_state(self) -> dict[str, Any]:
        return {"snapshot": self.tr.snapshot(), "negatives": self.negatives}

    def load_model_state(self, state: dict[str, Any]) -> None:
        self.tr.restore(state["snapshot"])
        self.negatives = state["negatives"]

    def examples_per_step(self) -> int:
        return min(self.spec.batch_size, self.tr.n_train)  # TMJTrainer._batch

    def log_record(self, comps: dict[str, float], validated: bool) -> dict[str, Any] | None:
        rec = super().log_record(comps, validated)
        return None if rec is None else {"phase": self.phase, **rec}

    def keep_log_line(self, rec: dict[str, Any], step: int) -> bool:
        return rec.get("phase") != self.phase or rec.get("step", 0) <= step
