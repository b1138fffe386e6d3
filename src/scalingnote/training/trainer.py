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
- The loop itself (optimizer, schedule, checkpoints every ``save_every`` steps with exact
  resume — data order is a pure function of ``(seed, epoch)`` —, Ctrl-C checkpoint, metrics
  log, validation with early stopping) is the shared :class:`~scalingnote.training.loop.TrainLoop`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor, nn

from scalingnote.models import DocumentTower, QueryTower
from scalingnote.training import distributed
from scalingnote.training.checkpoint import rng_state, set_rng_state
from scalingnote.training.config import TrainConfig
from scalingnote.training.data import Example, epoch_order
from scalingnote.training.fsdp import shard_towers
from scalingnote.training.loop import LoopSettings, StopTraining, TrainLoop
from scalingnote.training.losses import LossBatch, get_loss
from scalingnote.training.params import load_trained_state, param_groups, trained_state
from scalingnote.training.schedule import linear_warmup_decay

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- tower adapter
def embed_queries(tower: QueryTower, texts: Sequence[str], device: torch.device) -> Tensor:
    """Query embeddings with a graph: [B, dim]."""
    batch = tower.tokenize_queries(list(texts))
    return tower({k: v.to(device) for k, v in batch.items()})


def embed_documents(tower: DocumentTower, docs: Sequence, device: torch.device) -> dict[str, Tensor]:
    """Document views with a graph: {"title", "content", "emb"} -> [B, dim] (single-vector towers
    return their one view)."""
    batch = tower.tokenize_documents(list(docs))
    return tower({k: v.to(device) for k, v in batch.items()})


def _grad(t: Tensor) -> Tensor:
    """The gradient ``backward()`` left in ``t`` (a leaf tensor the loss used)."""
    assert t.grad is not None
    return t.grad


def negative_mask(exs: Sequence[Example], n_neg: int) -> Tensor | None:
    """[B*n_neg] bools, query-major: True where example i has a j-th hard negative (j < n_neg);
    None when every example has ``n_neg``. An example with fewer negatives than the batch's
    largest is padded instead of cutting every example to the smallest count (which dropped all
    of a batch's hard negatives when one example had none)."""
    have = [min(len(e.negs), n_neg) for e in exs]
    if all(h == n_neg for h in have):
        return None
    return torch.tensor([j < h for h in have for j in range(n_neg)], dtype=torch.bool)


def batch_negatives(exs: Sequence[Example]) -> int:
    """Hard-negative slots per example of a batch: its largest count (shorter examples are padded
    and masked: :func:`negative_mask`), under ``torchrun`` the largest over ranks — every rank
    gathers rows of one shape, and a rank whose examples have none pads with masked rows instead
    of skipping the gather the others make."""
    return distributed.max_over_ranks(max((len(e.negs) for e in exs), default=0))


def _at_least_fp32(t: Tensor) -> Tensor:
    """fp32 for the loss (bf16/fp16 embeddings are upcast); float64 stays float64 (exactness tests)."""
    return t if t.dtype == torch.float64 else t.float()


class Trainer(TrainLoop):
    """Stage I on the shared loop: ``train_step`` = one (gradient-cached, all-gathered) batch."""

    def __init__(
        self,
        cfg: TrainConfig,
        query_tower: QueryTower,
        doc_tower: DocumentTower,
        train_examples: list[Example],
        device: torch.device | None = None,
        encoders: tuple[Any, Any] = (None, None),
    ):
        """``encoders``: optional (query, document) :class:`~scalingnote.models.PrefixTower` that
        replace the full forward pass of a tower whose frozen prefix is cached."""
        self.cfg = cfg
        self.loss_fn = get_loss(cfg.loss.loss_name)
        self.q_prefix, self.d_prefix = encoders
        self.q_tower = query_tower
        self.d_tower = doc_tower
        self.examples = train_examples
        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.local_batch = distributed.local_batch_size(cfg.optim.batch_size)
        self.steps_per_epoch = len(train_examples) // cfg.optim.batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"{len(train_examples)} training examples < batch size {cfg.optim.batch_size}")
        total = math.ceil(cfg.optim.epochs * self.steps_per_epoch)
        o = cfg.optim
        settings = LoopSettings(
            **cfg.cadence(),
            max_grad_norm=o.max_grad_norm,
            eval_every=self.steps_per_epoch if cfg.eval_every == "epoch" else cfg.eval_every,
            patience=cfg.patience,
            restore_best=cfg.restore_best,
        )
        super().__init__(
            cfg.output_dir, min(total, o.max_steps) if o.max_steps else total, settings, is_main=distributed.rank() == 0
        )
        self.desc = f"stage I ({cfg.method})"
        # FSDP2 (distributed: fsdp): towers sharded in place before the optimizer sees them
        if cfg.distributed == "fsdp":
            self.sharded = shard_towers([query_tower, doc_tower], self.device, cfg.fsdp, cfg.precision)
        self.build_optimizer(
            param_groups([query_tower, doc_tower], o.lr, o.head_lr, o.weight_decay),
            o.warmup_ratio,
            o.betas,
            o.eps,
            schedule=o.schedule,
            warmup_steps=o.warmup_steps,
        )
        self.use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and self.device.type == "cuda")
        self._validate_fn: Callable[[], float] | None = None
        self._on_step: Callable[[int], None] | None = None

    # -- one step -------------------------------------------------------------------------
    def _autocast(self):
        if self.use_bf16:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _forward(
        self, exs: Sequence[Example], n_neg: int, mask: Tensor | None
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor] | None]:
        """The batch's embeddings: queries, positives and ``n_neg`` hard-negative rows per query
        (query-major; ``mask``, :func:`negative_mask` of ``exs``: zero rows in the missing slots)."""
        with self._autocast():
            texts = [e.query for e in exs]
            q = (
                self.q_prefix.queries(texts)
                if self.q_prefix is not None
                else embed_queries(self.q_tower, texts, self.device)
            )
            docs = [e.pos for e in exs] + [
                d for e in exs for d in e.negs[:n_neg]
            ]  # only the real negatives are encoded
            views = (
                self.d_prefix.documents(docs)
                if self.d_prefix is not None
                else embed_documents(self.d_tower, docs, self.device)
            )
        keep = getattr(getattr(self.d_tower, "prompt", None), "loss_views", None)  # prompt presets without some views
        if keep:
            views = {k: v for k, v in views.items() if k in keep}
        n = len(exs)
        f32 = _at_least_fp32
        q = f32(q)
        pos = {k: f32(v[:n]) for k, v in views.items()}
        if not n_neg:
            return q, pos, None
        real = {k: f32(v[n:]) for k, v in views.items()}
        if mask is None:
            return q, pos, real
        rows = mask.nonzero().squeeze(1).to(q.device)  # the real negatives' slots in the padded [B*n] layout
        return q, pos, {k: r.new_zeros(n * n_neg, r.shape[-1]).index_copy(0, rows, r) for k, r in real.items()}

    def _loss(
        self, q: Tensor, pos: dict[str, Tensor], neg: dict[str, Tensor] | None, mask: Tensor | None = None
    ) -> tuple[Tensor, dict[str, float]]:
        """The configured Stage I loss (``loss.name``; the paper's Eq. 12 by default) over this
        process's batch and the batch gathered from every process (cross-process negatives);
        ``mask`` marks the real rows of a padded ``neg`` (:func:`negative_mask`)."""
        if (
            neg is not None and mask is None and distributed.is_distributed()
        ):  # every rank gathers a mask when any may pad
            mask = torch.ones(next(iter(neg.values())).shape[0], dtype=torch.bool)
        if mask is not None:
            mask = mask.to(q.device)
        batch = LossBatch(
            q,
            pos,
            neg,
            q_all=distributed.gather_with_grad(q),
            pos_all={k: distributed.gather_with_grad(v) for k, v in pos.items()},
            neg_all={k: distributed.gather_with_grad(v) for k, v in neg.items()} if neg is not None else None,
            offset=distributed.rank() * q.shape[0],
            neg_mask=mask,
            neg_mask_all=distributed.gather_with_grad(mask.to(torch.uint8)).bool()
            if mask is not None and distributed.is_distributed()
            else mask,
        )
        return self.loss_fn(batch, self.cfg.loss)

    def compute_gradients(self, exs: Sequence[Example]) -> dict[str, float]:
        """Forward + backward for one (local) batch, with gradient caching when
        ``micro_batch_size`` is smaller than the local batch. Leaves gradients in ``.grad``."""
        micro = self.cfg.optim.micro_batch_size or len(exs)
        n_neg = batch_negatives(exs)  # the batch's largest (over ranks); shorter examples are padded and masked
        mask = negative_mask(exs, n_neg) if n_neg else None
        if micro >= len(exs):
            q, pos, neg = self._forward(exs, n_neg, mask)
            loss, comps = self._loss(q, pos, neg, mask)
            loss.backward()
            return comps
        chunks = [exs[i : i + micro] for i in range(0, len(exs), micro)]
        cuts = [
            None if mask is None else mask[i * n_neg : (i + len(c)) * n_neg]
            for i, c in zip(range(0, len(exs), micro), chunks, strict=True)
        ]
        masks = [None if m is None or bool(m.all()) else m for m in cuts]  # each chunk's slice of the batch's mask
        states, qs, poss, negs = [], [], [], []
        with torch.no_grad():
            for c, cm in zip(chunks, masks, strict=True):
                states.append(rng_state())
                q, pos, neg = self._forward(c, n_neg, cm)
                qs.append(q)
                poss.append(pos)
                negs.append(neg)
        after = rng_state()
        q = torch.cat(qs).requires_grad_()
        pos = {k: torch.cat([p[k] for p in poss]).requires_grad_() for k in poss[0]}
        neg = None
        if n_neg:  # every chunk has n_neg rows per query (padded where an example has fewer)
            chunk_negs = [n for n in negs if n is not None]
            assert len(chunk_negs) == len(negs)
            neg = {k: torch.cat([n[k] for n in chunk_negs]).requires_grad_() for k in chunk_negs[0]}
        loss, comps = self._loss(q, pos, neg, mask)
        loss.backward()
        start = 0
        for c, cm, st in zip(chunks, masks, states, strict=True):
            set_rng_state(st)
            qc, posc, negc = self._forward(c, n_neg, cm)
            sl = slice(start, start + len(c))
            surrogate = (qc * _grad(q)[sl]).sum()
            for k in posc:
                surrogate = surrogate + (posc[k] * _grad(pos[k])[sl]).sum()
            if negc is not None and neg is not None:
                nsl = slice(start * n_neg, (start + len(c)) * n_neg)  # the chunk's negatives (query-major)
                for k in negc:
                    surrogate = surrogate + (negc[k] * _grad(neg[k])[nsl]).sum()
            surrogate.backward()
            start += len(c)
        set_rng_state(after)
        return comps

    # -- TrainLoop hooks ----------------------------------------------------------------------
    def modules(self) -> list[nn.Module]:
        return [self.q_tower, self.d_tower]

    def train_step(self, step: int) -> dict[str, float]:
        return self.compute_gradients(self._batch_for_step(step))

    def checkpoint_modules(self) -> dict[str, nn.Module]:
        return {"query_tower": self.q_tower, "doc_tower": self.d_tower}

    def model_state(self) -> dict[str, Any]:
        return {"query_tower": trained_state(self.q_tower), "doc_tower": trained_state(self.d_tower)}

    def load_model_state(self, state: dict[str, Any]) -> None:
        load_trained_state(self.q_tower, state["query_tower"], f"{self.out} (query tower)")
        load_trained_state(self.d_tower, state["doc_tower"], f"{self.out} (document tower)")

    def validate(self) -> float | None:
        return None if self._validate_fn is None else float(self._validate_fn())

    def val_per_query(self) -> dict[str, float] | None:
        return getattr(self._validate_fn, "per_query", None)

    def has_validation(self) -> bool:
        return self._validate_fn is not None

    def after_step(self, step: int) -> None:
        if self._on_step is not None:
            self._on_step(step)

    def log_record(self, comps: dict[str, float], validated: bool) -> dict[str, Any] | None:
        rec = super().log_record(comps, validated)
        if rec is not None:
            rec["examples_per_s"] = round(self.steps_done * self.cfg.optim.batch_size / self._elapsed(), 3)
        return rec

    def examples_per_step(self) -> int:
        return self.cfg.optim.batch_size

    def val_tag(self) -> str:  # make_validator: nDCG@10, or minus the contrastive perplexity
        return (
            "val/neg_contrastive_ppl"
            if self.cfg.validation_metric == "contrastive_ppl"
            else f"val/{self.cfg.validation_metric}"
        )

    def _batch_for_step(self, step: int) -> list[Example]:
        epoch, i = divmod(step, self.steps_per_epoch)
        idx = epoch_order(len(self.examples), self.cfg.optim.batch_size, self.cfg.seed, epoch)[i]
        return [self.examples[j] for j in distributed.rank_slice(idx)]

    def train(
        self,
        resume: bool = True,
        on_step: Callable[[int], None] | None = None,
        validate: Callable[[], float] | None = None,
    ) -> dict[str, float]:
        """Run to ``total_steps``. ``on_step(step)`` is called after each optimizer step (and
        after any checkpoint of that step); raising :class:`StopTraining` there stops cleanly.

        ``validate()`` (higher = better) runs at the start and every ``cfg.eval_every`` steps; with
        ``cfg.patience`` training stops early, and with ``cfg.restore_best`` the towers end with the
        best validated weights (the start counts: training that only hurts leaves the start)."""
        self._on_step, self._validate_fn = on_step, validate
        try:
            return self.run(resume=resume)
        finally:
            self._on_step = self._validate_fn = None


__all__ = [
    "StopTraining",
    "Trainer",
    "batch_negatives",
    "embed_documents",
    "embed_queries",
    "linear_warmup_decay",
    "negative_mask",
    "param_groups",
]
