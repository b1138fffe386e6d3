"""Typed configuration of Stage II, query-based knowledge distillation (``scalingnote distill``).

Defaults from ScalingNote Table 7, stage II: AdamW (0.9, 0.999, 1e-8), weight decay
1e-3, peak learning rate 3e-4, 10% warm-up then linear decay, grad-norm clip 1.0,
large batches (the paper uses 40,000; here 256 by default for CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from scalingnote.models.spec import TowerSpec
from scalingnote.training.config import FsdpSpec
from scalingnote.training.settings import AdamWSettings, RunSettings


@dataclass
class QuerySource:
    """Queries to distil on: a BEIR directory (optionally only the queries judged in
    ``qrels/<split>.tsv``) or a ``queries.jsonl`` file (e.g. pseudo-queries). Labels are not used."""

    path: str
    split: str | None = None
    max_queries: int | None = None


@dataclass
class DistillOptim(AdamWSettings):
    """QKD's AdamW: the Table 7 settings (:class:`~scalingnote.training.settings.AdamWSettings`),
    its learning rate, batch and length."""

    lr: float = 3e-4
    batch_size: int = 256
    epochs: float = 10.0
    max_steps: int | None = None
    #: a time box in seconds (the loop's steps and validations, resumed runs included): the step count
    #: is re-planned to what fits at the measured pace and the schedule ends there
    #: (:mod:`scalingnote.training.timebox`); None = ``epochs`` / ``max_steps`` alone
    max_seconds: float | None = None


@dataclass
class DistillConfig(RunSettings):
    teacher: str  #: a Stage I output directory (query_tower/, doc_tower/, doc_embeddings.npy, doc_ids.json)
    output_dir: str = "runs/qkd"
    student: TowerSpec = field(default_factory=lambda: TowerSpec("minilm-l6", max_length=32))
    queries: list[QuerySource] = field(default_factory=list)
    lam: float = 1.0  #: λ of Eq. 15 (§4.2: 1)
    #: weight of the listwise term (not in the paper): KL between the teacher's and the student's score
    #: distributions over each query's teacher top ``rank_k`` documents at temperature ``rank_tau``
    #: (:func:`scalingnote.distill.loss.qkd_rank_loss`); 0 = Eq. 15 alone, as in the paper
    rank_weight: float = 0.0
    rank_k: int = 32
    rank_tau: float = 0.05
    validation_fraction: float = 0.05
    #: length-bucketed batches (not in the paper): each batch is drawn from a window of
    #: ``length_buckets x batch_size`` texts of the epoch's seeded permutation, sorted by the student's
    #: token length, so it pads little; the order of the epoch's batches is shuffled with the same seed
    #: (:mod:`scalingnote.distill.batches`). The same texts per epoch, a pure function of (seed, epoch,
    #: step). 0 = off: batches are slices of the permutation (see ``step_chunk`` for the padding within one)
    length_buckets: int = 0
    #: drop the teacher's own held-out validation queries (its Stage I validation split) from the
    #: distillation queries, as the evaluation split is dropped: a student's validation nDCG@10 (what
    #: the quick start chooses students, loss terms and the served default with) is then measured on
    #: queries it never imitated. Off only to reproduce runs made before this setting existed.
    exclude_teacher_validation: bool = True
    #: dropout of the student while it distils (every ``nn.Dropout`` of its backbone); None = the
    #: base model's own (MiniLM: 0.1). Eq. 15 regresses fixed teacher vectors, and dropout's noise
    #: slows that fit (not in the paper, which does not say).
    student_dropout: float | None = None
    optim: DistillOptim = field(default_factory=DistillOptim)
    eval_data: str | None = None  #: BEIR directory to evaluate ScalingNote on (doc embeddings from the teacher run)
    eval_split: str = "test"
    cache_dir: str | None = None  #: teacher cache (default <output_dir>/teacher_cache)
    teacher_batch_size: int = 128
    #: the forward batch of the teacher cache and the head fits on a CPU (``teacher_batch_size`` on a
    #: GPU): length-sorted batches of 32 ran 1,500 pool texts through MiniLM-L6 in 5.6 s, batches of 128
    #: in 7.5 s (2 cores). Speed only: the cached vectors do not depend on it.
    cpu_batch_size: int = 32
    #: a training step's forward and backward in length-sorted chunks of its queries, each padded to
    #: its own longest text, their gradients summed with weight chunk / batch: the same step as one
    #: forward over the batch (Eq. 15 and the listwise term are means over queries; with dropout each
    #: chunk draws its own masks), over fewer padded tokens (not in the paper). null (auto): on a CPU, per
    #: step the number of chunks (1, 2, 4, 8) whose padded tokens plus a pass's own cost are fewest
    #: (:func:`scalingnote.distill.batches.cheapest_chunks`), the whole batch on a GPU or under FSDP;
    #: ``k`` >= 1: chunks of at most ``k`` queries; 0 = the whole batch. Speed only: it is not one of
    #: the inputs a resumed run is checked against.
    step_chunk: int | None = None
    #: Initial W_stu (Eq. 14): "lstsq" = centre the student's pooled states and solve a ridge
    #: least-squares fit to the teacher embeddings on ``head_init_samples`` training queries (a
    #: linear probe; not in the paper), or "orthogonal" = random. Training then fits Eq. 15 from there.
    head_init: Literal["lstsq", "orthogonal"] = "lstsq"
    head_init_samples: int = 4096
    #: which of its base model's layers the student starts from, chosen on validation: each list
    #: (e.g. ``[[0, 1], [0, 5], [4, 5]]``) is built, given its ``head_init`` head, and scored with
    #: the QKD validation loss; the lowest trains (a tie keeps the earlier list). None = the first
    #: ``student.num_layers`` layers (or ``student.layers``), the paper's truncated student.
    student_layer_candidates: list[list[int]] | None = None
    #: the training queries of the head fit that scores each of ``student_layer_candidates`` (at
    #: least 2x the student's hidden size); the chosen start's head is then fitted again on
    #: ``head_init_samples``. On SciFact and the embedded default the three MiniLM starts ranked the
    #: same at 1,024 as at 4,096 (a quarter of each candidate's forward pass).
    layer_choice_samples: int = 1024
    #: Eq. 15 regresses the teacher's raw projected embeddings ("raw", the paper). Retrieval only
    #: uses their direction and the raw magnitude dominates the squared error, so "normalized"
    #: regresses the L2-normalised teacher embeddings instead (not in the paper).
    target: Literal["raw", "normalized"] = "raw"
    #: validation loss every ``eval_every`` steps (None = once per epoch); stop after ``patience``
    #: evaluations without improvement (None = run all epochs) and keep the best student weights.
    eval_every: int | None = None
    patience: int | None = None
    #: feature cache of the Stage I run (TrainConfig.feature_cache_dir): a teacher trained with
    #: ``trainable_layers: 0`` is encoded from its cached pooled states instead of a forward pass;
    #: also where a student with ``trainable_layers != "all"`` caches its frozen prefix
    feature_cache_dir: str | None = None
    #: data parallelism under ``torchrun`` (one process: ignored): "ddp" (replicated student,
    #: all-reduced gradients) or "fsdp" (FSDP2: student, gradients and AdamW state sharded across
    #: ranks; ``fsdp`` options as in Stage I). ``optim.batch_size`` is the global batch either way.
    distributed: Literal["ddp", "fsdp"] = "ddp"
    fsdp: FsdpSpec = field(default_factory=FsdpSpec)
    precision: Literal["auto", "fp32", "bf16"] = "auto"  #: auto: fp32 on CPU, bf16 on GPU
    save_every: int = field(default=100, kw_only=True)  #: the RunSettings field, with the QKD default

    def __post_init__(self) -> None:
        if not self.queries:
            raise ValueError("queries: give at least one query source (a BEIR directory or a queries.jsonl)")
        if self.student_dropout is not None and not 0 <= self.student_dropout < 1:
            raise ValueError(f"student_dropout must be in [0, 1) or null, got {self.student_dropout}")
        if isinstance(self.length_buckets, bool) or self.length_buckets < 0 or self.length_buckets == 1:
            raise ValueError(f"length_buckets must be 0 (off) or a window of >= 2 batches, got {self.length_buckets!r}")
        if self.step_chunk is not None and (isinstance(self.step_chunk, bool) or self.step_chunk < 0):
            raise ValueError(f"step_chunk must be null (auto) or an integer >= 0, got {self.step_chunk!r}")
        if self.optim.batch_size < 1:
            raise ValueError("optim.batch_size must be >= 1")
        if isinstance(self.layer_choice_samples, bool) or self.layer_choice_samples < 1:
            raise ValueError(f"layer_choice_samples must be >= 1, got {self.layer_choice_samples!r}")
        if self.rank_weight < 0 or self.rank_k < 2 or self.rank_tau <= 0:
            raise ValueError(
                f"rank_weight must be >= 0, rank_k >= 2 and rank_tau > 0; got {self.rank_weight}, {self.rank_k}, "
                f"{self.rank_tau}"
            )
        sizes = {len(c) for c in self.student_layer_candidates or []}
        if self.student_layer_candidates is not None and (
            not self.student_layer_candidates or 0 in sizes or len(sizes) > 1
        ):
            raise ValueError(
                "student_layer_candidates: non-empty lists of layer indices of one length, got "
                f"{self.student_layer_candidates!r}"
            )
        if self.patience is not None and self.patience < 1:
            raise ValueError("patience must be >= 1 or null")
        if self.eval_every is not None and self.eval_every < 1:
            raise ValueError("eval_every must be >= 1 or null")
        if self.distributed == "fsdp" and self.student.prefix_k is not None:
            raise ValueError(
                "distributed: fsdp shards the student's transformer blocks for a full forward pass; a student with a "
                "cached frozen prefix (student.trainable_layers != 'all') runs only its top layers and head: use "
                "distributed: ddp"
            )
