"""Typed configuration of a Stage I run (``scalingnote train --config FILE``).

Defaults follow ScalingNote §4.2 and Table 7 (stage I) where they transfer to small
models; the learning rate is scaled up for small models and small batches (the
paper's 3e-6 is for a 7B model at batch 480) and the randomly initialised
projection W gets its own, larger learning rate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from scalingnote.config import load_config
from scalingnote.models.spec import TowerSpec  # the one tower spec, part of this config
from scalingnote.training.losses.spec import LossSpec  # the loss block, part of this config
from scalingnote.training.settings import AdamWSettings, RunSettings

Method = Literal["scaling_dual", "scaling_doc", "twinbert"]


GUARD_RULES = ("near_positive", "agree_top")  #: the false-negative guard's rules (scalingnote.training.mining)


@dataclass
class MiningSpec:
    """Hard negatives mined by a dense tower (``data.negatives: dense | mixed``; ANCE / RocketQA's
    denoised negatives, not in ScalingNote, which mines from BM25-style ranks, §4.1.1).

    The tower encodes every training query and the corpus (a Stage I run's stored
    ``doc_embeddings.npy`` when a re-encoded sample agrees with it); an exact inner-product search (FAISS
    Flat) ranks the corpus; negatives are drawn from ranks ``skip_top+1 .. max_rank`` with the
    query's known positives removed, after the false-negative ``guard`` dropped candidates that
    look like unlabelled positives (see :mod:`scalingnote.training.mining`)."""

    #: a finished Stage I run directory (its ``query_tower/`` and ``doc_tower/``), a saved tower
    #: directory, or a model name / path used on both sides
    tower: str | None = None
    skip_top: int | None = None  #: K of the dense window (None: ``data.neg_skip_top``)
    max_rank: int | None = None  #: T of the dense window (None: ``data.neg_max_rank``)
    #: rules of the false-negative guard, by name: "near_positive" (dense score >= the weakest
    #: known positive's score − ``guard_margin``), "agree_top" (in the top ``guard_top_r`` of both
    #: the BM25 and the dense ranking); [] = no guard
    guard: list[str] = field(default_factory=list)
    guard_margin: float = 0.05
    guard_top_r: int = 30  #: > the window's K, or agree_top cannot fire inside the window
    batch_size: int = 64  #: encoding batch
    #: where mined triplets are cached (keyed by the tower fingerprint and these settings);
    #: None: ``<output_dir>/mined_negatives`` of the run (or the model cache without one)
    cache_dir: str | None = None
    audit_queries: int = 50  #: queries sampled (seeded) into ``mining_audit.jsonl``

    def __post_init__(self) -> None:
        bad = [r for r in self.guard if r not in GUARD_RULES]
        if bad:
            raise ValueError(f"guard: unknown rule {bad[0]!r} (known: {', '.join(GUARD_RULES)})")
        if self.guard_top_r < 1 or self.batch_size < 1 or self.audit_queries < 0:
            raise ValueError("guard_top_r and batch_size must be >= 1, audit_queries >= 0")


@dataclass
class DataSpec:
    """Training data: a BEIR directory (qrels split -> positives, BM25-mined hard negatives,
    ScalingNote §4.1.1) or a triplet JSONL built by ``scalingnote data build``."""

    data_dir: str
    train_split: str = "train"
    eval_split: str | None = "test"
    triplets: str | None = None  #: triplet JSONL; default: pairs from qrels/<train_split>.tsv
    validation_triplets: str | None = None
    #: hard negatives: BM25 ranks K+1..T (ScalingNote §4.1.1), none, mined by a dense tower
    #: (``mining``), or "mixed": drawn from the union of the BM25 and the dense windows
    negatives: Literal["bm25", "none", "dense", "mixed"] = "bm25"
    num_negatives: int = 1  #: hard negatives per (query, positive) example (the loss takes n >= 1)
    mining: MiningSpec = field(default_factory=MiningSpec)
    neg_skip_top: int = 10  #: K: drop the top-K BM25 results (false-negative guard)
    neg_max_rank: int = 100  #: T: draw the hard negative from ranks K+1..T
    validation_fraction: float = 0.1  #: queries held out (by query) for contrastive perplexity
    max_train_examples: int | None = None
    max_eval_queries: int | None = None
    #: evaluation queries that are also training queries: "error", or "drop" them from training
    #: (e.g. KUAKE-QTR: 1,328 of its 1,473 test queries also have train qrels, with other titles)
    eval_overlap: Literal["error", "drop"] = "error"

    def __post_init__(self) -> None:
        """The settings of several fields together (ValueError naming them)."""
        if self.num_negatives < 1:
            raise ValueError(f"data.num_negatives must be >= 1, got {self.num_negatives}")
        if self.negatives in ("dense", "mixed") and self.triplets:
            raise ValueError(
                f"data.negatives: {self.negatives} mines for the judged pairs of qrels/<train_split>; "
                "data.triplets carry their own negatives (unset one of them)"
            )
        if self.negatives in ("dense", "mixed") and not self.mining.tower:
            raise ValueError(f"data.negatives: {self.negatives} needs data.mining.tower (a Stage I run or a tower)")
        m = self.mining
        k, t = (
            m.skip_top if m.skip_top is not None else self.neg_skip_top,
            m.max_rank if m.max_rank is not None else self.neg_max_rank,
        )
        if not 0 <= k < t:
            raise ValueError(f"need 0 <= data.mining.skip_top < data.mining.max_rank, got {k}, {t}")

    def dense_window(self) -> tuple[int, int]:
        """(K, T) of the dense window."""
        m = self.mining
        return (
            m.skip_top if m.skip_top is not None else self.neg_skip_top,
            m.max_rank if m.max_rank is not None else self.neg_max_rank,
        )


@dataclass
class OptimSpec(AdamWSettings):
    """Table 7, stage I: AdamW(0.9, 0.999, 1e-8), weight decay 1e-3, warm-up 10% then linear decay,
    max grad norm 1.0 (the :class:`~scalingnote.training.settings.AdamWSettings` fields)."""

    lr: float = 2e-5
    head_lr: float = 1e-3  #: learning rate of the projection W (randomly initialised)
    batch_size: int = 32  #: global batch (all processes together): the in-batch negatives
    micro_batch_size: int | None = None  #: < local batch -> gradient caching (exact large-batch gradients)
    epochs: float = 1.0
    max_steps: int | None = None
    #: "linear": Table 7 (warm-up then linear decay to 0); "constant": warm-up then a constant rate, so
    #: runs of different lengths end at the same rate (scaling sweeps, Fang et al. §3.4 fixed-step training)
    schedule: Literal["linear", "constant"] = "linear"
    #: warm-up length in steps (overrides ``warmup_ratio``): the same warm-up for runs of any length
    warmup_steps: int | None = None


@dataclass
class LoraSpec:
    """Optional LoRA (PEFT) on the LLM backbones."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class FsdpSpec:
    """FSDP2 options (``distributed: fsdp``; see :mod:`scalingnote.training.fsdp`)."""

    activation_checkpointing: bool = True  #: recompute each transformer block in backward
    reshard_after_forward: bool = True  #: free a block's full weights after its forward (ZeRO-3); False = ZeRO-2
    reduce_dtype: Literal["bf16", "fp32"] = "bf16"  #: gradient reduce-scatter dtype when parameters are bf16 (GPU)


@dataclass
class TrainConfig(RunSettings):
    #: keys older configs may hold: ``null`` is read (and dropped), a value is refused with the reason
    __config_removed__ = {
        "deepspeed": "DeepSpeed was never wired in; use `distributed: fsdp` (PyTorch FSDP2, the same "
        "ZeRO-3 sharding) under torchrun"
    }

    method: Method = "scaling_dual"
    output_dir: str = "runs/stage1"
    query_tower: TowerSpec = field(default_factory=lambda: TowerSpec("smollm2-135m", num_layers=4, max_length=64))
    doc_tower: TowerSpec = field(default_factory=lambda: TowerSpec("smollm2-135m", num_layers=4, max_length=256))
    dim: int = 128
    data: DataSpec = field(default_factory=lambda: DataSpec("../shared/data/scifact"))
    loss: LossSpec = field(default_factory=LossSpec)
    optim: OptimSpec = field(default_factory=OptimSpec)
    lora: LoraSpec | None = None
    #: data parallelism under torchrun: "ddp" (replicated towers, all-reduced gradients) or
    #: "fsdp" (FSDP2: towers, gradients and optimizer state sharded across ranks)
    distributed: Literal["ddp", "fsdp"] = "ddp"
    fsdp: FsdpSpec = field(default_factory=FsdpSpec)
    precision: Literal["auto", "fp32", "bf16"] = "auto"  #: auto: fp32 on CPU, bf16 autocast on GPU
    eval_batch_size: int = 64
    evaluate_zero_shot: bool = False  #: also evaluate the starting point (after the centre / W init)
    #: Subtract the mean pooled state (over ``center_samples`` training texts) before W. Not in
    #: the paper: decoder hidden states are strongly anisotropic (SmolLM2 placeholder states have
    #: mean pairwise cosine ~0.97), which leaves a short CPU run at chance; centring fixes that.
    center: bool = True
    center_samples: int = 256
    #: Initial W (Eq. 3-4 / Eq. 14): "orthogonal" (random, seeded) or "pca": the top principal
    #: directions of the centred pooled states of the ``center_samples`` texts (needs ``center``),
    #: fitted jointly over both towers when they share a base model so their spaces stay aligned.
    #: Not in the paper: a random 576->128 W throws away most of a pre-trained space, which a short
    #: CPU run cannot re-learn (measured in benchmarks/results/stage1_scifact.json).
    #: "pairs": centre, then the document head = top principal directions of the document states and
    #: the query head = the ridge least-squares map from query states to their positive documents'
    #: coordinates (so towers that do not share a space start aligned; not in the paper);
    #: "auto" = "pairs" when the two towers come from different base models, else "pca".
    projection_init: Literal["orthogonal", "pca", "pairs", "auto"] = "auto"
    #: a finished Stage I run directory whose trained heads (centre and W of its ``query_tower/``
    #: and ``doc_tower/``) start this run instead of ``projection_init``: train the heads first over
    #: cached pooled states (cheap), then unfreeze the top layers from them (gradual unfreezing;
    #: not in the paper). Its towers must pool the same base model at the same depth.
    init_heads_from: str | None = None
    #: where cached frozen-prefix features live (towers with trainable_layers != "all");
    #: default <output_dir>/feature_cache. Share it between runs over the same data to reuse features.
    feature_cache_dir: str | None = None
    #: storage of token caches (0 < trainable_layers): float16 halves disk and page cache; float32 is exact
    feature_cache_dtype: Literal["float16", "float32"] = "float16"
    #: validation during training (queries held out from the training split, never the eval split):
    #: every ``eval_every`` steps ("epoch" = once per epoch; None = only at the end) compute
    #: ``validation_metric`` over the full corpus; stop after ``patience`` evaluations without
    #: improvement (None = never), and restore the best weights at the end (``restore_best``).
    eval_every: int | Literal["epoch"] | None = None
    validation_metric: Literal["ndcg@10", "contrastive_ppl"] = "ndcg@10"
    patience: int | None = None
    restore_best: bool = True

    def __post_init__(self) -> None:
        if self.dim not in self.loss.dims:
            raise ValueError(f"dim={self.dim} must be the largest Matryoshka dim (loss.dims={self.loss.dims})")
        if max(self.loss.dims) != self.dim:
            raise ValueError(f"loss.dims={self.loss.dims} must not exceed dim={self.dim}")
        if self.init_heads_from is not None and not self.center:
            raise ValueError("init_heads_from needs center=True (the loaded heads include the centre)")
        if self.projection_init in ("pca", "pairs", "auto") and not self.center:
            raise ValueError(
                f"projection_init={self.projection_init!r} needs center=True (fitted on the centred pooled states)"
            )
        if isinstance(self.eval_every, int) and self.eval_every < 1:
            raise ValueError("eval_every must be >= 1 or null")
        if self.patience is not None and self.eval_every is None:
            raise ValueError(
                "patience needs eval_every (early stopping checks the validation metric every eval_every steps)"
            )
        for name, spec in (("query_tower", self.query_tower), ("doc_tower", self.doc_tower)):
            k = spec.trainable_layers
            if k != "all" and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
                raise ValueError(f"{name}.trainable_layers must be 'all' or an integer >= 0, got {k!r}")
        if self.distributed == "fsdp" and (
            self.query_tower.prefix_k is not None or self.doc_tower.prefix_k is not None
        ):
            raise ValueError(
                "distributed: fsdp shards the transformer blocks of a full forward pass; "
                "towers with a cached frozen prefix (trainable_layers != 'all') run only their top layers "
                "and head: use distributed: ddp"
            )
        ks = [s.prefix_k for s in (self.query_tower, self.doc_tower)]
        if self.lora is not None and all(k == 0 for k in ks):
            raise ValueError("lora needs trainable layers: with trainable_layers 0 on both towers only the heads train")
        # lora with 0 < trainable_layers: adapters on the top k layers only (the cached prefix stays frozen)
        if self.optim.batch_size < 2:
            raise ValueError("optim.batch_size must be >= 2 (in-batch negatives)")
        if not 0 <= self.data.neg_skip_top < self.data.neg_max_rank:
            raise ValueError(
                "need 0 <= data.neg_skip_top < data.neg_max_rank, "
                f"got {self.data.neg_skip_top}, {self.data.neg_max_rank}"
            )


def load_train_config(path: str | Path | None, **overrides: Any) -> TrainConfig:
    """A :class:`TrainConfig` from a YAML file (or the defaults), with dotted-key ``overrides``."""
    return load_config(TrainConfig, path, **overrides)


def load_run_config(run_dir: str | Path) -> TrainConfig:
    """The config a finished run recorded (``<run_dir>/config.yaml``), its data paths followed where the run
    was moved or copied with its data (a quick start's output directory moved whole): a recorded path that
    no longer exists is read relative to the run's recorded ``output_dir`` and found from ``run_dir``."""
    run_dir = Path(run_dir)
    cfg = load_train_config(run_dir / "config.yaml")
    old = cfg.output_dir
    if not old or Path(old).resolve() == run_dir.resolve():
        return cfg

    def follow(p: str | None) -> str | None:
        if not p or Path(p).exists():
            return p
        there = (run_dir / os.path.relpath(p, old)).resolve()
        return str(there) if there.exists() else p

    d = cfg.data
    data = replace(
        d,
        data_dir=follow(d.data_dir) or d.data_dir,
        triplets=follow(d.triplets),
        validation_triplets=follow(d.validation_triplets),
        mining=replace(d.mining, tower=follow(d.mining.tower)),
    )
    return replace(cfg, data=data, output_dir=str(run_dir))
