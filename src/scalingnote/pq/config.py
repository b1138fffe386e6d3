"""Typed configuration of a learned-PQ (TMJ) run: ``scalingnote pq train --config FILE``.

Learning rates (TMJ §5.1.3, AdamW): stage 1 — encoders 2e-5, centroids 5e-4; stage 2 —
query encoder 2e-6, centroids 2e-5 (document encoder frozen). Those are for a 110M-parameter
CoCondenser with 768-d inner-product embeddings; here they apply to transformer backbones
unchanged (``encoder_lr``). The projection heads ``W`` (hidden -> 128, part of the encoders,
trained from a random orthogonal init at 1e-3 in the warm-up) get their own rate
(``head_lr``): 1e-4 in stage 1 (chosen on held-out *training* queries of SciFact among
{3e-5, 1e-4, 1e-3}: 1e-3 moved the document embeddings away from the codebooks) and 1e-5 in
stage 2 (the paper's stage-2 / stage-1 encoder ratio, 0.1). Centroid rates are the paper's
(AdamW's step size does not depend on the gradient scale, so the smaller sub-vectors of
128-d unit embeddings need no rescaling).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from scalingnote.training.settings import RunSettings


@dataclass
class PQDataSpec:
    """A BEIR directory: positives from ``qrels/<train_split>.tsv``, evaluation on ``eval_split``."""

    data_dir: str
    train_split: str = "train"
    eval_split: str | None = "test"
    validation_fraction: float = 0.0  #: train queries held out (by query) for validation metrics
    max_train_queries: int | None = None
    max_eval_queries: int | None = None


@dataclass
class PQTowers:
    """The dual encoder to start from.

    ``query_model`` / ``doc_model``: packaged names (``minilm-l6``), Hugging Face directories,
    ``.gguf`` files, or saved tower directories (e.g. ``<stage1 run>/query_tower``). Base
    models get a projection to ``dim`` (None = no projection). ``train_*_backbone: false``
    freezes the transformer (only the projection ``W`` trains): its pooled outputs are then
    computed once and cached, and training / re-encoding cost a matrix product.
    ``doc_features_dir``: an embeddings directory (``scalingnote index encode``) made by the
    *projection-less* version of the document tower, reused as its pooled features (checked
    by fingerprint) instead of encoding the corpus again.
    """

    query_model: str = "minilm-l6"
    doc_model: str = "minilm-l6"
    dim: int | None = 128
    num_layers: int | None = None
    pooling: str | None = None
    query_max_length: int = 64
    doc_max_length: int = 256
    train_query_backbone: bool = False
    train_doc_backbone: bool = False
    doc_features_dir: str | None = None
    encode_batch_size: int = 32


@dataclass
class QuantizerSpec:
    """Product quantizer shape and its FAISS initialisation (TMJ §5.1.3: M=24, K=256 on 768-d)."""

    m: int = 16
    nbits: int = 8
    init: Literal["pq", "opq"] = "opq"
    niter: int = 25  #: k-means iterations per sub-space
    opq_niter: int = 20  #: OPQ alternations (FAISS default 50)
    train_size: int | None = None  #: seeded subsample for FAISS training (None: all documents)


@dataclass
class PhaseOptim:
    """One training phase: steps, batch, hard negatives per query, AdamW rates, schedule."""

    steps: int = 0
    batch_size: int = 32  #: queries per step (their positives and negatives are shared candidates)
    num_negatives: int = 8  #: hard negatives sampled per query per step
    encoder_lr: float = 2e-5  #: transformer backbones (when trained)
    head_lr: float = 1e-3  #: projection heads W
    centroid_lr: float = 5e-4  #: PQ codebooks
    weight_decay: float = 1e-3  #: not applied to biases, norms and codebooks
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0


@dataclass
class WarmupSpec(PhaseOptim):
    """Dense warm-up (Stage I, TwinBERT-style) with ``L_r`` only: the "well-trained" model TMJ
    starts from (§5.1.3). Negatives: top ``neg_depth`` of the starting model's dense ranking
    after skipping the first ``neg_skip`` (false-negative guard), minus positives."""

    steps: int = 0
    neg_depth: int = 100
    neg_skip: int = 0
    head_lr: float = 1e-3


@dataclass
class Stage1Spec(PhaseOptim):
    """Stage 1: ``L1`` (Eq. 9) or the conventional ``L0`` (Eq. 8); negatives from the top
    ``neg_depth`` of the warm-up model's PQ ranking with the initial codebooks (§3.2)."""

    steps: int = 300
    loss: Literal["l1", "l0"] = "l1"
    encoder_lr: float = 2e-5
    head_lr: float = 1e-4
    centroid_lr: float = 5e-4
    neg_depth: int = 100
    w_m: float = 1.0
    w_rhat: float = 1.0
    w_r: float = 1.0
    centroid_grad: bool = True  #: L_r̂ reaches the selected centroids (see losses.straight_through)


@dataclass
class Stage2Spec(PhaseOptim):
    """Stage 2: document tower frozen, query tower + centroids trained with ``L_r̂`` (Eq. 6);
    negatives = ``S_u ∩ S_c`` (top-``mine_depth`` of flat and PQ) minus positives (§3.4),
    re-mined every ``mine_every`` steps."""

    steps: int = 200
    encoder_lr: float = 2e-6
    head_lr: float = 1e-5
    centroid_lr: float = 2e-5
    mine_depth: int = 200
    mine_every: int = 50
    negatives: Literal["intersection", "pq_top", "difference"] = "intersection"


@dataclass
class ExportSpec:
    """FAISS indexes written with the learned codebooks (see :mod:`scalingnote.index.faiss.learned_pq`)."""

    indexes: list[str] = field(default_factory=lambda: ["PQ", "IVF64,PQ", "HNSW32,PQ"])
    nprobe: int | None = None
    ef_search: int | None = None
    semantic_ids_layers: int = 0
    verify: bool = True  #: search the exported indexes with the eval queries and record the metrics


@dataclass
class PQTrainConfig(RunSettings):
    data: PQDataSpec
    output_dir: str = "runs/tmj"
    towers: PQTowers = field(default_factory=PQTowers)
    pq: QuantizerSpec = field(default_factory=QuantizerSpec)
    warmup: WarmupSpec = field(default_factory=WarmupSpec)
    stage1: Stage1Spec = field(default_factory=Stage1Spec)
    stage2: Stage2Spec = field(default_factory=Stage2Spec)
    export: ExportSpec = field(default_factory=ExportSpec)
    tau: float = 0.05  #: softmax temperature on cosine scores (the toolkit's Stage I value)
    threads: int | None = None  #: torch / FAISS threads (None: leave the defaults)
    eval_k: int = 100

    def __post_init__(self) -> None:
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")
        for name in ("warmup", "stage1", "stage2"):
            ph = getattr(self, name)
            if ph.steps < 0:
                raise ValueError(f"{name}.steps must be >= 0, got {ph.steps}")
            if ph.batch_size < 1:
                raise ValueError(f"{name}.batch_size must be >= 1, got {ph.batch_size}")
            if ph.num_negatives < 0:
                raise ValueError(f"{name}.num_negatives must be >= 0, got {ph.num_negatives}")
        if self.stage2.mine_every < 1:
            raise ValueError(f"stage2.mine_every must be >= 1, got {self.stage2.mine_every}")
        if self.pq.m < 1 or not 1 <= self.pq.nbits <= 16:
            raise ValueError(f"pq: need m >= 1 and 1 <= nbits <= 16, got m={self.pq.m} nbits={self.pq.nbits}")
        if not 0 <= self.data.validation_fraction < 1:
            raise ValueError(f"data.validation_fraction must be in [0, 1), got {self.data.validation_fraction}")
        if self.save_every < 1 or self.log_every < 1:
            raise ValueError("save_every and log_every must be >= 1")
