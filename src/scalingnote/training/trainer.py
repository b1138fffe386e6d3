"""The Stage I trainer (ScalingNote §3.2, Table 7): one loop for every method.

- AdamW (β 0.9/0.999, ε 1e-8, weight decay 1e-3 except biases and norms), linear
  warm-up over the first 10% of steps then linear decay, grad-norm clip 1.0.
- fp32 on CPU, bf16 autocast on GPU.
- Large batches through gradient caching (Gao et al., 2021): embeddings of the whole
  batch are computed without a graph, the loss and its gradient w.r.t. the embeddings
  are computed on the full batch, then each micro-batch is re-encoded with a graph and
  back-propagated with those gradients. The result equals one step on the full batch
  (same in-batch negatives), at the memory of one micro-batch. Dropout masks are
  replayed by restoring the RNG state per micro-batch.
- Cross-process negatives (``torchrun``): embeddings are all-gathered with gradients
  (:mod:`scalingnote.training.distributed`), the loss is each rank's local mean, and
  gradients are averaged across ranks.
- Checkpoints every ``save_every`` steps hold the towers, optimizer, scheduler, step and
  all RNG states; ``resume`` continues exactly (data order is a pure function of
  ``(seed, epoch)``). Ctrl-C writes a checkpoint before exiting.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from scalingnote.training import distributed as D
from scalingnote.training.checkpoint import load_latest_checkpoint, rng_state, save_checkpoint, set_rng_state
from scalingnote.training.config import TrainConfig
from scalingnote.training.data import Example, epoch_order
from scalingnote.training.losses import scalingnote_loss

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- tower adapter
def embed_queries(tower: nn.Module, texts: Sequence[str], device: torch.device) -> Tensor:
    """Query embeddings with a graph: [B, dim]."""
    batch = tower.tokenize_queries(list(texts))
    return tower({k: v.to(device) for k, v in batch.items()})


def embed_documents(tower: nn.Module, docs: Sequence, device: torch.device) -> dict[str, Tensor]:
    """Document views with a graph: {"title", "content", "emb"} -> [B, dim] (single-vector towers
    return their one view)."""
    batch = tower.tokenize_documents(list(docs))
    return tower({k: v.to(device) for k, v in batch.items()})


def _is_head(name: str) -> bool:
    return name.startswith("projection") or ".projection." in name


def param_groups(towers: Sequence[nn.Module], lr: float, head_lr: float, weight_decay: float) -> list[dict]:
    """Backbone / projection groups, weight decay off for biases and norm weights."""
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for tower in towers:
        for name, p in tower.named_parameters():
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            no_decay = p.ndim < 2 or "norm" in name.lower() or name.endswith(".bias")
            groups.setdefault((_is_head(name), no_decay), []).append(p)
    return [
        {"params": ps, "lr": head_lr if head else lr, "weight_decay": 0.0 if nd else weight_decay}
        for (head, nd), ps in groups.items()
    ]


def linear_warmup_decay(optimizer: torch.optim.Optimizer, total_steps: int, warmup_ratio: float):
    """Table 7: linear warm-up over ``warmup_ratio`` of the steps, then linear decay to 0."""
    from transformers import get_linear_schedule_with_warmup

    return get_linear_schedule_with_warmup(optimizer, math.ceil(warmup_ratio * total_steps), total_steps)


def _at_least_fp32(t: Tensor) -> Tensor:
    """fp32 for the loss (bf16/fp16 embeddings are upcast); float64 stays float64 (exactness tests)."""
    return t if t.dtype == torch.float64 else t.float()


class StopTraining(Exception):
    """Raised by a step callback to stop after a checkpoint (used by tests to simulate a kill)."""


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        query_tower: nn.Module,
        doc_tower: nn.Module,
        train_examples: list[Example],
        device: torch.device | None = None,
        encoders: tuple[Any, Any] = (None, None),
    ):
        """``encoders``: optional (query, document) :class:`~scalingnote.models.PrefixTower` that
        replace the full forward pass of a tower whose frozen prefix is cached."""
        self.cfg = cfg
        self.q_prefix, self.d_prefix = encoders
        self.q_tower = query_tower
        self.d_tower = doc_tower
        self.examples = train_examples
        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.out = Path(cfg.output_dir)
        ws = D.world_size()
        if cfg.optim.batch_size % ws:
            raise ValueError(f"optim.batch_size={cfg.optim.batch_size} must be divisible by the world size {ws}")
        self.local_batch = cfg.optim.batch_size // ws
        self.steps_per_epoch = len(train_examples) // cfg.optim.batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"{len(train_examples)} training examples < batch size {cfg.optim.batch_size}")
        total = math.ceil(cfg.optim.epochs * self.steps_per_epoch)
        self.total_steps = min(total, cfg.optim.max_steps) if cfg.optim.max_steps else total
        o = cfg.optim
        self.sharded = False  # FSDP2 (distributed: fsdp): towers sharded in place before the optimizer sees them
        if cfg.distributed == "fsdp":
            from scalingnote.training.fsdp import shard_towers

            self.sharded = shard_towers([query_tower, doc_tower], self.device, cfg.fsdp, cfg.precision)
        self.optimizer = torch.optim.AdamW(
            param_groups([query_tower, doc_tower], o.lr, o.head_lr, o.weight_decay), betas=tuple(o.betas), eps=o.eps
        )
        self.scheduler = linear_warmup_decay(self.optimizer, self.total_steps, o.warmup_ratio)
        self.use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and self.device.type == "cuda")
        self.step = 0
        # early stopping / best weights (ScalingNote trains a fixed schedule; on CPU we validate)
        self.best: dict[str, Any] = {"score": None, "step": 0, "state": None, "bad": 0, "curve": []}

    # -- one step -------------------------------------------------------------------------
    def _autocast(self):
        if self.use_bf16:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _forward(self, exs: Sequence[Example]) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor] | None]:
        with self._autocast():
            texts = [e.query for e in exs]
            q = self.q_prefix.queries(texts) if self.q_prefix is not None else embed_queries(self.q_tower, texts, self.device)
            has_neg = all(e.neg is not None for e in exs)
            docs = [e.pos for e in exs] + ([e.neg for e in exs] if has_neg else [])
            views = self.d_prefix.documents(docs) if self.d_prefix is not None else embed_documents(self.d_tower, docs, self.device)
        keep = getattr(getattr(self.d_tower, "prompt", None), "loss_views", None)  # prompt presets without some views (issue #21)
        if keep:
            views = {k: v for k, v in views.items() if k in keep}
        n = len(exs)
        f32 = _at_least_fp32
        q = f32(q)
        pos = {k: f32(v[:n]) for k, v in views.items()}
        neg = {k: f32(v[n:]) for k, v in views.items()} if has_neg else None
        return q, pos, neg

    def _loss(self, q: Tensor, pos: dict[str, Tensor], neg: dict[str, Tensor] | None) -> tuple[Tensor, dict[str, float]]:
        L = self.cfg.loss
        return scalingnote_loss(
            q,
            pos,
            neg,
            q_all=D.gather_with_grad(q),
            pos_all={k: D.gather_with_grad(v) for k, v in pos.items()},
            neg_all={k: D.gather_with_grad(v) for k, v in neg.items()} if neg is not None else None,
            offset=D.rank() * q.shape[0],
            dims=L.dims,
            weights=L.weights,
            hard_weights=L.hard_weights,
            tau=L.tau,
            margin=L.margin,
            alpha=L.alpha,
            hard_in_denominator=L.hard_in_denominator,
        )

    def compute_gradients(self, exs: Sequence[Example]) -> dict[str, float]:
        """Forward + backward for one (local) batch, with gradient caching when
        ``micro_batch_size`` is smaller than the local batch. Leaves gradients in ``.grad``."""
        micro = self.cfg.optim.micro_batch_size or len(exs)
        if micro >= len(exs):
            q, pos, neg = self._forward(exs)
            loss, comps = self._loss(q, pos, neg)
            loss.backward()
            return comps
        chunks = [exs[i : i + micro] for i in range(0, len(exs), micro)]
        states, qs, poss, negs = [], [], [], []
        with torch.no_grad():
            for c in chunks:
                states.append(rng_state())
                q, pos, neg = self._forward(c)
                qs.append(q)
                poss.append(pos)
                negs.append(neg)
        after = rng_state()
        q = torch.cat(qs).requires_grad_()
        pos = {k: torch.cat([p[k] for p in poss]).requires_grad_() for k in poss[0]}
        neg = None
        if all(n is not None for n in negs):
            neg = {k: torch.cat([n[k] for n in negs]).requires_grad_() for k in negs[0]}  # type: ignore[index]
        loss, comps = self._loss(q, pos, neg)
        loss.backward()
        start = 0
        for c, st in zip(chunks, states):
            set_rng_state(st)
            qc, posc, negc = self._forward(c)
            sl = slice(start, start + len(c))
            surrogate = (qc * q.grad[sl]).sum()
            for k in posc:
                surrogate = surrogate + (posc[k] * pos[k].grad[sl]).sum()
            if negc is not None and neg is not None:
                for k in negc:
                    surrogate = surrogate + (negc[k] * neg[k].grad[sl]).sum()
            surrogate.backward()
            start += len(c)
        set_rng_state(after)
        return comps

    def _all_reduce_grads(self) -> None:
        if not D.is_distributed() or self.sharded:  # FSDP2 reduce-scatters (averages) in backward
            return
        ws = D.world_size()
        for tower in (self.q_tower, self.d_tower):
            for p in tower.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= ws

    def optimizer_step(self) -> float:
        self._all_reduce_grads()
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        gnorm = torch.nn.utils.clip_grad_norm_(params, self.cfg.optim.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(gnorm)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self, rng: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "step": self.step,
            "query_tower": self.q_tower.state_dict(),
            "doc_tower": self.d_tower.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng if rng is not None else rng_state(),
            "total_steps": self.total_steps,
            "best": self.best,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("total_steps") != self.total_steps:
            raise ValueError(
                f"checkpoint was made for {state.get('total_steps')} total steps, this run has {self.total_steps}: "
                "the config changed; use a new output_dir"
            )
        self.q_tower.load_state_dict(state["query_tower"])
        self.d_tower.load_state_dict(state["doc_tower"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.best = state.get("best", self.best)

    def save(self, rng: dict[str, Any] | None = None) -> None:
        if self.sharded:
            from scalingnote.training.fsdp import save_sharded

            save_sharded(self, rng)
            return
        if D.rank() == 0:
            save_checkpoint(self.out, self.step, self.state_dict(rng), keep=self.cfg.keep_checkpoints)
        if D.is_distributed():
            dist.barrier()

    # -- loop -------------------------------------------------------------------------------
    def _batch_for_step(self, step: int) -> list[Example]:
        epoch, i = divmod(step, self.steps_per_epoch)
        idx = epoch_order(len(self.examples), self.cfg.optim.batch_size, self.cfg.seed, epoch)[i]
        r = D.rank()
        local = idx[r * self.local_batch : (r + 1) * self.local_batch]
        return [self.examples[j] for j in local]

    def _metrics_path(self) -> Path:
        return self.out / "metrics.jsonl"

    def _truncate_metrics(self, step: int) -> None:
        """On resume, drop log lines written after the checkpoint (they will be redone)."""
        p = self._metrics_path()
        if not p.exists() or D.rank() != 0:
            return
        keep = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step]
        p.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")

    def _trainable_state(self) -> dict[str, Tensor]:
        out = {}
        for name, tower in (("q", self.q_tower), ("d", self.d_tower)):
            for k, v in tower.named_parameters():
                if v.requires_grad:
                    out[f"{name}.{k}"] = v.detach().clone().cpu()
        return out

    def _restore_trainable(self, state: dict[str, Tensor]) -> None:
        towers = {"q": dict(self.q_tower.named_parameters()), "d": dict(self.d_tower.named_parameters())}
        with torch.no_grad():
            for key, v in state.items():
                t, name = key.split(".", 1)
                towers[t][name].copy_(v.to(towers[t][name].device))

    def _validate(self, validate: Callable[[], float], record: dict[str, float]) -> bool:
        """Evaluate, remember the best trainable weights; True when patience is exhausted."""
        self.q_tower.eval()
        self.d_tower.eval()
        try:
            score = float(validate())
        finally:
            self.q_tower.train()
            self.d_tower.train()
        b = self.best
        b["curve"].append([self.step, round(score, 6)])
        record["val_score"] = score
        if b["score"] is None or score > b["score"]:
            b.update(score=score, step=self.step, bad=0, state=self._trainable_state() if self.cfg.restore_best else None)
        else:
            b["bad"] += 1
        p = self.cfg.patience
        return p is not None and b["bad"] >= p

    def train(self, resume: bool = True, on_step: Callable[[int], None] | None = None,
              validate: Callable[[], float] | None = None) -> dict[str, float]:
        """Run to ``total_steps``. ``on_step(step)`` is called after each optimizer step (and
        after any checkpoint of that step); raising :class:`StopTraining` there stops cleanly.

        ``validate()`` (higher = better) runs at the start and every ``cfg.eval_every`` steps; with
        ``cfg.patience`` training stops early, and with ``cfg.restore_best`` the towers end with the
        best validated weights (the start counts: training that only hurts leaves the start)."""
        from tqdm.auto import tqdm

        self.out.mkdir(parents=True, exist_ok=True)
        if resume:
            if self.sharded:
                from scalingnote.training.fsdp import load_latest_sharded

                ck = load_latest_sharded(self)
            else:
                ck = load_latest_checkpoint(self.out)
                if ck is not None:
                    self.load_state_dict(ck[1])
            if ck is not None:
                self._truncate_metrics(self.step)
                log.info("resumed from step %d", self.step)
        self.q_tower.train()
        self.d_tower.train()
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc=f"stage I ({self.cfg.method})",
            disable=not self.cfg.show_progress or D.rank() != 0,
            dynamic_ncols=True,
        )
        last: dict[str, float] = {}
        t0 = time.perf_counter()
        steps_done = 0
        step_rng = rng_state()
        every = self.steps_per_epoch if self.cfg.eval_every == "epoch" else self.cfg.eval_every
        stop = False
        if validate is not None and self.step == 0 and not self.best["curve"]:
            stop = self._validate(validate, {})
        try:
            while self.step < self.total_steps and not stop:
                step_rng = rng_state()  # an interrupt mid-step checkpoints the state before the step
                batch = self._batch_for_step(self.step)
                comps = self.compute_gradients(batch)
                comps["grad_norm"] = self.optimizer_step()
                self.step += 1
                steps_done += 1
                comps["lr"] = self.scheduler.get_last_lr()[0]
                last = comps
                bar.update(1)
                bar.set_postfix(loss=f"{comps['loss']:.3f}")
                if validate is not None and every and (self.step % every == 0 or self.step == self.total_steps):
                    stop = self._validate(validate, comps)
                    bar.set_postfix(loss=f"{comps['loss']:.3f}", val=f"{comps['val_score']:.4f}")
                if D.rank() == 0 and (self.step % self.cfg.log_every == 0 or self.step == self.total_steps):
                    rec = {"step": self.step, **{k: round(v, 6) for k, v in comps.items()}}
                    rec["examples_per_s"] = round(steps_done * self.cfg.optim.batch_size / (time.perf_counter() - t0), 3)
                    with open(self._metrics_path(), "a", encoding="utf-8") as fh:
                        fh.write(json.dumps(rec) + "\n")
                if self.step % self.cfg.save_every == 0 and self.step < self.total_steps:
                    self.save()
                if on_step is not None:
                    on_step(self.step)
        except KeyboardInterrupt:
            bar.close()
            log.warning("interrupted at step %d: writing a checkpoint; rerun to resume", self.step)
            self.optimizer.zero_grad(set_to_none=True)
            self.save(rng=step_rng)
            raise
        finally:
            bar.close()
        if validate is not None and (not every or self.best["curve"][-1][0] != self.step):
            self._validate(validate, last)  # the final weights are a candidate too
        if validate is not None and self.cfg.restore_best and self.best["state"] is not None and self.best["step"] != self.step:
            log.info("restoring the best validated weights (step %d, %.4f)", self.best["step"], self.best["score"])
            self._restore_trainable(self.best["state"])
        self.q_tower.eval()
        self.d_tower.eval()
        last["train_seconds"] = time.perf_counter() - t0
        last["steps_run"] = self.step
        if validate is not None:
            last["best_step"] = self.best["step"]
            last["best_val_score"] = self.best["score"]
            last["stopped_early"] = float(self.step < self.total_steps)
        return last
