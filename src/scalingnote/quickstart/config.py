"""Typed configuration of ``scalingnote quickstart`` and the two large-tower families it compares.

Nothing here is fixed to what won on one data set: the large tower that teaches, the LLM depth,
the head learning rate, the student and the fusion weight are all chosen on queries held out
from the user's training split (:mod:`scalingnote.quickstart.choose`). The fields below are the
candidate sets and the budgets those choices are made within.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from scalingnote.errors import ConfigError
from scalingnote.models.layers import is_bottom
from scalingnote.training.config import GUARD_RULES

FAMILIES = ("bert", "llm")

#: QKD's step cap on a CPU (``qkd_max_steps: auto``): a time budget, so that the quick start on
#: the embedded defaults keeps a margin inside 10 minutes on a 2-core machine from a fresh clone (at
#: 900 steps it took 659 s there). With the student starting from the layers that validate best
#: (``student_layers: choose``), 600 steps reach a validation nDCG@10 the bottom-layer start did
#: not reach in 900 (``benchmarks/results/qkd_corpus_texts_synthetic_start.json``).
CPU_QKD_STEPS = 600


@dataclass
class QuickstartConfig:
    out: str = "runs/quickstart"
    data: str | None = None  #: BEIR directory; None = generate the synthetic note-search log
    #: the format of ``data``'s corpus file: None = detected among the registered formats
    #: (:data:`scalingnote.data.corpus.FORMATS`), a format name, or a reader ``package.module:reader``
    #: (:func:`scalingnote.data.corpus.use_corpus_format`: registered for the directory's ``corpus.<suffix>``)
    corpus_format: str | None = None
    seed: int = 0
    #: the large-tower families trained in Stage I ("bert": a BERT-family encoder, e.g. MiniLM or any
    #: imported sentence-transformers model; "llm": a decoder LLM, SmolLM2 truncated). A family whose
    #: tokenizer cannot read the data's queries is skipped with its reason (``max_unk_share``).
    families: list[str] = field(default_factory=lambda: list(FAMILIES))
    #: the QKD teacher: "auto" = the large tower with the best validation nDCG@10, or pin a family
    teacher: Literal["auto", "bert", "llm"] = "auto"
    bert: str = "minilm-l6"
    bert_layers: int | None = None  #: large BERT tower depth (None = every layer of the model)
    bert_small_layers: int = 2  #: the online query-tower size of the BERT family (matched-cost rows, student)
    bert_lr: float = 1e-4  #: backbone learning rate of BERT layers that train
    llm: str = "smollm2-135m"
    #: candidate depths of the large LLM tower (SmolLM2 truncated), chosen on validation
    llm_depths: list[int] = field(default_factory=lambda: [2, 4])
    llm_small_layers: int = (
        1  #: the online query-tower size of the LLM family (1 SmolLM2 layer ~ 2 MiniLM layers of compute)
    )
    llm_lr: float = 5e-5
    #: SmolLM2 pooling: "mean" (not in the paper; a truncated, briefly trained decoder is at chance
    #: with the paper's placeholder pooling) or "placeholder" (§3.2)
    llm_pooling: str = "mean"
    dim: int = 128  #: embedding size (Matryoshka dims 16, 32, 64 ... up to it)
    #: also train each family's chosen large tower (depth, head learning rate) with the embedding size
    #: = its backbone's hidden size (MiniLM 384, SmolLM2 576), kept only when validation nDCG@10 is
    #: higher; the matched-cost rows and the student then use that size. The paper's dim = 128 (§4.1)
    #: reduces a 3,584-d state; a 384-d frozen MiniLM projected to 128 starts below its own zero-shot
    #: embeddings on validation (synthetic log 0.501 vs 0.524, SciFact 0.613 vs 0.617)
    full_dim: bool = True
    synth_docs: int = 1500
    synth_queries: int = 800
    #: seed of the synthetic note-search log: the embedded default is one fixed data set, as a BEIR
    #: directory is, so ``seed`` varies the training (draws, initialisation, order) and not the data
    synth_seed: int = 0
    #: layers of the large towers that train: 0 = heads over cached pooled states (the CPU recipe),
    #: k = the top k layers over cached token states, "all" = the paper's full fine-tuning (GPU)
    trainable_layers: int | Literal["all"] = 0
    #: heads first, then layers: once a family's depth and head learning rate are chosen (heads over
    #: cached pooled states), train the top ``unfreeze_layers`` layers of both its large towers from
    #: those heads (``TrainConfig.init_heads_from``) for up to ``unfreeze_epochs``, kept only when
    #: validation nDCG@10 improves. 0 = off; "auto" = 1 on a GPU, 0 on a CPU, where a layer step
    #: costs seconds and the measured gain is small (benchmarks/results/llm_layers_scifact.json)
    unfreeze_layers: int | Literal["auto"] = "auto"
    unfreeze_epochs: float = 5.0
    #: head learning rates tried for every large tower; the first is the default, kept unless another
    #: validates better beyond the noise (``choice_margin``; the paper gives no head-only rate: its
    #: Stage I peak rate, 3e-6, is for full fine-tuning; 1e-3 is the lower, steadier of the two)
    head_lrs: list[float] = field(default_factory=lambda: [1e-3, 3e-3])
    #: Stage I runs up to ``max_epochs`` epochs (``steps``: an optional cap), validating every epoch
    #: on held-out training queries and stopping after ``patience`` epochs without improvement
    max_epochs: float = 40.0
    #: epochs of the small towers trained end to end (twinbert_small / scaling_doc query tower)
    small_max_epochs: float = 10.0
    steps: int | None = None
    patience: int = 4
    #: Stage I's batch (its in-batch negatives); a smaller ``micro_batch_size`` computes it in pieces
    #: (gradient caching: the same large-batch gradients in less memory)
    batch_size: int = 64
    micro_batch_size: int | None = None
    #: token budgets of a query and of a document (an LLM document's §3.2 prompt counts against it)
    query_max_length: int = 32
    doc_max_length: int = 128
    #: QKD: up to ``qkd_epochs`` epochs, stopping after ``qkd_patience`` epochs without a better
    #: validation loss; "normalized" regresses the L2-normalised teacher embeddings ("raw": Eq. 15 as printed)
    qkd_epochs: float = 30.0
    qkd_patience: int = 3
    qkd_target: Literal["raw", "normalized"] = "normalized"
    qkd_batch_size: int = 128
    #: QKD's length-bucketed batches (``DistillConfig.length_buckets``): each batch drawn from a window of
    #: this many batches of the epoch's permutation sorted by token length, so it pads little; 0 = off.
    #: Off by default: 8 made a step 1.45x faster on the embedded default and 2.0x on SciFact, but fitted
    #: the teacher a little less well at equal steps in both seeds measured on each, and validated lower
    #: (``benchmarks/results/qkd_bucketing.json``, ``qkd_bucketing_scifact.json``)
    qkd_length_buckets: int = 0
    qkd_dropout: float | None = None  #: the student's dropout during QKD (None = its base model's own)
    #: QKD's peak learning rate; None = :func:`qkd_lr_for` (1e-3 for a BERT student, 1e-4 for an LLM one).
    #: The paper's 3e-4 (Table 7, stage II) is set for 40,000-query batches; at batch 128 and the steps a
    #: CPU budget leaves (measured at 200 and 267), 1e-3 fitted the teacher better
    #: (``benchmarks/results/qkd_lr_*.json``)
    qkd_lr: float | None = None
    qkd_max_pseudo_queries: int = 3000
    #: unlabelled corpus text (titles and sentences, a seeded sample of this many) added to QKD's query
    #: pool: the student imitates the teacher's query tower on the data's own vocabulary, not only on the
    #: few logged queries (``benchmarks/results/qkd_corpus_texts_<data>.json``); 0 = off
    qkd_corpus_texts: int = 10000
    #: QKD's step budget: at most this many steps (the schedule spans them), whatever the pool's size;
    #: None = ``qkd_epochs`` epochs (``qkd_patience`` stops it earlier); "auto" = :data:`CPU_QKD_STEPS`
    #: on a CPU (the quick start's 10 minutes), None on a GPU, where every CPU student's validation was
    #: still improving at its cap (``benchmarks/results/qkd_corpus_texts_synthetic_steps.json``)
    qkd_max_steps: int | None | Literal["auto"] = "auto"
    #: weights of QKD's listwise term over the teacher's top-k documents tried for every student (not in
    #: the paper; 0 = Eq. 15 alone): each is a QKD run, the best validation nDCG@10 wins, like ``head_lrs``.
    #: The validation queries are held out of QKD (``DistillConfig.exclude_teacher_validation``), so the
    #: choice is not made on queries the student imitated (``benchmarks/results/qkd_listwise.json``).
    #: Default [1.0]: 1 validated above 0 on all three recipe sets (synthetic 0.493 vs 0.485, SciFact 0.708
    #: vs 0.696, KUAKE-QTR 0.775 vs 0.770), and one run leaves the time for the larger pool; [0, 1] to choose
    qkd_rank_weights: list[float] = field(default_factory=lambda: [1.0])
    #: which of its family's large-tower layers a student starts from: "choose" = its bottom layers,
    #: layers spread from the first to the last (DistilBERT's start) or its top layers, whichever has
    #: the lowest QKD validation loss once its head is fitted (``DistillConfig.student_layer_candidates``;
    #: seconds, no training); "bottom" = the paper's truncated student. The matched-cost rows' small
    #: query towers start from the layers the family's student chose: one online tower, one start.
    student_layers: Literal["choose", "bottom"] = "choose"
    #: QKD students, "family:layers" (e.g. ["bert:1", "bert:2", "llm:1"]); None = the teacher family's
    #: small tower (another readable family's where it cannot read the data), or with
    #: ``student_p99_ms`` every readable family at 1..its small size
    students: list[str] | None = None
    #: latency budget: keep the best-validating student whose single-query p99 (ms, this machine,
    #: ``serve_backend``) is under it; None = no budget
    student_p99_ms: float | None = None
    serve_backend: Literal["torch", "onnx"] = "torch"
    #: a family is skipped when more than this share of its tokens on a query sample is unknown
    max_unk_share: float = 0.05
    #: the matched-cost comparison of the paper (twinbert_small, scaling_doc, scalingnote, scaling_dual):
    #: "teacher" = in the teacher's family (the one the served student comes from), "all" (or true) =
    #: in every readable family (two more Stage I runs and a QKD run per family), "none" (or false) =
    #: only what the served model needs
    compare: bool | Literal["teacher", "all", "none"] = "teacher"
    #: the time budget: minutes of pipeline the quick start plans against on this machine
    #: (:mod:`scalingnote.quickstart.budget`; the plan and the minutes spent per phase are printed and
    #: in ``results.json``). When the plan exceeds it, work is cut in a stated order (the comparison
    #: runs first) and named. None = no cut. The default holds the embedded default on 2 cores
    budget_minutes: float | None = 8.0
    #: a second round: teacher's Stage I config trained again on hard negatives mined by
    #: the teacher itself (``data.negatives: dense``, :mod:`scalingnote.training.mining`), kept only when
    #: it validates above the first round (:mod:`scalingnote.quickstart.mining_round`); students and the
    #: teacher family's matched-cost rows then train from / on it. "auto" = when the plan holds it within
    #: ``budget_minutes`` (always with ``full``), "on" (or true: YAML reads a bare on as true) = always,
    #: "off" (or false) = never (today's steps, same digests)
    mining_round: bool | Literal["auto", "on", "off"] = "auto"
    #: the round's mining settings. Defaults = what benchmarks/results/mined_negatives_synthetic.json
    #: measured on the embedded default's own data: 3 negatives per example from dense ranks 11..100; the
    #: guard near_positive (margin 0.05) + agree_top (r 30) removed 98% of hidden judged positives from
    #: the window at ~12% of the true negatives (guarded teacher validation 0.7131 vs 0.7115 for BM25).
    #: Whether the round is kept is decided on the user's validation queries, never by these numbers
    mining_num_negatives: int = 3
    mining_window: list[int] = field(default_factory=lambda: [10, 100])
    mining_guard: list[str] = field(default_factory=lambda: ["near_positive", "agree_top"])
    mining_negatives: Literal["dense", "mixed"] = "dense"
    #: the round's mined negatives also join the in-batch softmax denominators (ScalingNote Eq. 5;
    #: ``loss.hard_in_denominator``), as DPR, ANCE and RocketQA train on their hard negatives, beside the
    #: paper's Eq. 9 hinge (margin 0.2, which alone barely moves a model that already ranks its negatives
    #: below the positive). benchmarks/results/mined_negatives_*.json measure both; false = the hinge only
    mining_hard_in_denominator: bool = True
    #: the exhaustive quick start: no proxy and no budget, every candidate trained in full on the
    #: whole corpus (the steps a budgeted run finished are reused: same steps, same digests)
    full: bool = False
    #: the proxy the candidates are first compared on (:mod:`scalingnote.quickstart.proxy`):
    #: ``max(proxy_min_docs, proxy_fraction x corpus)`` documents (every validation query's judged
    #: documents, the kept training queries' positives and negatives, seeded distractors) and
    #: ``max(proxy_min_train_queries, proxy_fraction x training queries)`` training queries; not
    #: drawn when it would hold more than 60% of either (the full runs are then the comparison)
    proxy_fraction: float = 0.25
    proxy_min_docs: int = 500
    proxy_min_train_queries: int = 200
    #: successive halving's elimination margin: a candidate more than this below the proxy's best
    #: validation nDCG@10 (at its level: family, depth, head learning rate, width) is not trained in full
    proxy_margin: float = 0.02
    #: Stage I's choices (head learning rate, embedding size) keep their pre-declared default — the first
    #: of ``head_lrs``, the wider head — unless another candidate is better on the validation queries with
    #: p < 0.05 (paired t-test); a run without per-query scores falls back to a lead of more than this
    #: nDCG@10 (leads of 0.013 changed sign between two runs on one data set)
    choice_margin: float = 0.02
    index_factory: str | None = None  #: default: see :func:`scalingnote.quickstart.index_choice.default_factory`
    semantic_id_layers: int = 6
    rerank: int = 100
    nprobe: int = 16
    #: choose nprobe and the re-rank depth on validation + training queries (encoded by the served
    #: student): the cheapest setting whose top 10 holds this share of exact search's top 10
    #: (:func:`scalingnote.index.tune.tune_search`); None = serve ``nprobe`` / ``rerank`` as given
    index_recall: float | None = 0.99
    eval_split: str = "test"
    max_eval_queries: int | None = None
    #: Stage I and QKD compute: "auto" = fp32 on a CPU, bf16 autocast on a GPU; "bf16" on a CPU
    #: runs the GPU's mixed-precision code path (about 10x slower there: for checks, not speed)
    precision: str = "auto"
    #: keep ``features/`` (the frozen backbones' pooled states) after a finished run: a later run over
    #: the same data with other candidates reuses them; by default a finished run drops them (a run
    #: stores what it trained: on KUAKE-QTR they were 283 of 433 MB) and a re-run of the same
    #: config redoes no step, so needs none
    keep_feature_cache: bool = False
    show_progress: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.compare, bool):
            self.compare = "all" if self.compare else "none"
        if self.compare not in ("teacher", "all", "none"):
            raise ConfigError(
                None, None, "compare", f"must be teacher, all or none (or true / false), got {self.compare!r}"
            )
        bad = [f for f in self.families if f not in FAMILIES]
        if bad or not self.families:
            raise ConfigError(
                None, None, "families", f"must be a non-empty subset of {list(FAMILIES)}, got {self.families!r}"
            )
        if self.llm_pooling not in ("mean", "placeholder"):
            raise ConfigError(None, None, "llm_pooling", f"must be 'mean' or 'placeholder', got {self.llm_pooling!r}")
        if self.teacher != "auto" and self.teacher not in self.families:
            raise ConfigError(None, None, "teacher", f"{self.teacher!r} is not among families {self.families}")
        if not self.llm_depths or min(self.llm_depths) < 1:
            raise ConfigError(None, None, "llm_depths", f"needs depths >= 1, got {self.llm_depths!r}")
        u = self.unfreeze_layers
        if u != "auto" and (isinstance(u, bool) or not isinstance(u, int) or u < 0):
            raise ConfigError(None, None, "unfreeze_layers", f"must be 'auto' or an integer >= 0, got {u!r}")
        if u != "auto" and u:
            if self.trainable_layers != 0:
                raise ConfigError(
                    None,
                    None,
                    "unfreeze_layers",
                    f"starts from heads-only large towers: needs trainable_layers 0, got {self.trainable_layers!r}",
                )
            if u > min(self.llm_depths):
                raise ConfigError(
                    None, None, "unfreeze_layers", f"{u} > the shallowest llm_depths {min(self.llm_depths)}"
                )
        if not self.head_lrs or min(self.head_lrs) <= 0:
            raise ConfigError(None, None, "head_lrs", f"needs positive learning rates, got {self.head_lrs!r}")
        self._check_qkd()
        if self.student_p99_ms is not None and self.student_p99_ms <= 0:
            raise ConfigError(None, None, "student_p99_ms", f"must be > 0 ms, got {self.student_p99_ms}")
        if self.index_recall is not None and not 0 < self.index_recall <= 1:
            raise ConfigError(
                None,
                None,
                "index_recall",
                f"must be in (0, 1] (a share of exact search's top 10) or null, got {self.index_recall}",
            )
        for s in self.students or []:
            parse_student(s)
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise ConfigError(
                None, None, "budget_minutes", f"must be > 0 minutes or null (no budget), got {self.budget_minutes}"
            )
        if not 0 < self.proxy_fraction <= 1:
            raise ConfigError(None, None, "proxy_fraction", f"must be in (0, 1], got {self.proxy_fraction}")
        if self.proxy_margin < 0 or self.proxy_min_docs < 1 or self.proxy_min_train_queries < 1:
            raise ConfigError(
                None,
                None,
                "proxy_margin" if self.proxy_margin < 0 else "proxy_min_docs",
                "the proxy needs margin >= 0 and at least 1 document and 1 training query, got "
                f"{self.proxy_margin}, {self.proxy_min_docs}, {self.proxy_min_train_queries}",
            )
        if isinstance(self.mining_round, bool):
            self.mining_round = "on" if self.mining_round else "off"
        if self.mining_round not in ("auto", "on", "off"):
            raise ConfigError(None, None, "mining_round", f"must be auto, on or off, got {self.mining_round!r}")
        if self.mining_negatives not in ("dense", "mixed"):
            raise ConfigError(None, None, "mining_negatives", f"must be dense or mixed, got {self.mining_negatives!r}")
        if (
            isinstance(self.mining_num_negatives, bool)
            or not isinstance(self.mining_num_negatives, int)
            or self.mining_num_negatives < 1
        ):
            raise ConfigError(
                None, None, "mining_num_negatives", f"must be an integer >= 1, got {self.mining_num_negatives!r}"
            )
        if not isinstance(self.mining_hard_in_denominator, bool):
            raise ConfigError(
                None,
                None,
                "mining_hard_in_denominator",
                f"must be true or false, got {self.mining_hard_in_denominator!r}",
            )
        w = self.mining_window
        if len(w) != 2 or not 0 <= int(w[0]) < int(w[1]):
            raise ConfigError(
                None, None, "mining_window", f"must be [K, T] with 0 <= K < T (dense ranks K+1..T), got {w!r}"
            )
        bad_rule = [r for r in self.mining_guard if r not in GUARD_RULES]
        if bad_rule:
            raise ConfigError(
                None, None, "mining_guard", f"unknown guard rule {bad_rule[0]!r} (known: {', '.join(GUARD_RULES)})"
            )
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ConfigError(None, None, "precision", f"must be auto, fp32 or bf16, got {self.precision!r}")

    def _check_qkd(self) -> None:
        if self.qkd_corpus_texts < 0:
            raise ConfigError(None, None, "qkd_corpus_texts", f"must be >= 0 (0 = off), got {self.qkd_corpus_texts}")
        b = self.qkd_length_buckets
        if isinstance(b, bool) or not isinstance(b, int) or b < 0 or b == 1:
            raise ConfigError(
                None, None, "qkd_length_buckets", f"must be 0 (off) or a window of >= 2 batches, got {b!r}"
            )
        m = self.qkd_max_steps
        if m is not None and m != "auto" and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ConfigError(None, None, "qkd_max_steps", f"must be 'auto', an integer >= 1 or null, got {m!r}")
        if self.qkd_lr is not None and (isinstance(self.qkd_lr, bool) or not self.qkd_lr > 0):
            raise ConfigError(None, None, "qkd_lr", f"must be a learning rate > 0 or null, got {self.qkd_lr!r}")
        if not self.qkd_rank_weights or min(self.qkd_rank_weights) < 0:
            raise ConfigError(None, None, "qkd_rank_weights", f"needs weights >= 0, got {self.qkd_rank_weights!r}")

    def qkd_lr_for(self, family: str) -> float:
        """``qkd_lr`` resolved for a student of ``family``: 1e-3 for BERT (measured: SciFact at 200 steps,
        the embedded default at 267, ``benchmarks/results/qkd_lr_*.json``), 1e-4 for an LLM (not re-measured)."""
        if self.qkd_lr is not None:
            return self.qkd_lr
        return 1e-3 if family == "bert" else 1e-4

    def qkd_step_cap(self, gpu: bool) -> int | None:
        """``qkd_max_steps`` resolved: "auto" = :data:`CPU_QKD_STEPS` on a CPU, no cap on a GPU."""
        if self.qkd_max_steps == "auto":
            return None if gpu else CPU_QKD_STEPS
        return self.qkd_max_steps

    def unfreeze_k(self, gpu: bool) -> int:
        """``unfreeze_layers`` resolved: "auto" = 1 on a GPU (heads-only large towers), 0 on a CPU."""
        if self.unfreeze_layers == "auto":
            return 1 if gpu and self.trainable_layers == 0 else 0
        return int(self.unfreeze_layers)


@dataclass(frozen=True)
class Family:
    """One large-tower family: its model, the candidate depths of its large tower, the size of its
    small (online) query tower, pooling and backbone learning rate."""

    name: str
    model: str
    depths: tuple[int | None, ...]
    small_layers: int
    pooling: str | None
    lr: float

    def tower(self, layers: int | None, k: int | str, max_length: int, keep: list[int] | None = None) -> dict:
        """A TowerSpec dict: ``layers`` layers (None = all), the top ``k`` training; ``keep`` = which
        of the base model's layers (None = the first ``layers``)."""
        spec = {"model": self.model, "max_length": max_length, "trainable_layers": k}
        if layers is not None:
            spec["num_layers"] = layers
        if keep is not None and not is_bottom(keep):  # None: the bottom layers
            spec["layers"] = list(keep)
        if self.pooling is not None:
            spec["pooling"] = self.pooling
        return spec


def family(cfg: QuickstartConfig, name: str) -> Family:
    if name == "bert":
        return Family("bert", cfg.bert, (cfg.bert_layers,), cfg.bert_small_layers, "mean", cfg.bert_lr)
    pooling = "mean" if cfg.llm_pooling == "mean" else None
    return Family("llm", cfg.llm, tuple(sorted(set(cfg.llm_depths))), cfg.llm_small_layers, pooling, cfg.llm_lr)


def parse_student(s: str) -> tuple[str, int]:
    """``"bert:2"`` -> ("bert", 2)."""
    fam, _, layers = str(s).partition(":")
    if fam not in FAMILIES or not layers.isdigit() or int(layers) < 1:
        raise ConfigError(
            None, None, "students", f"each entry is 'family:layers' with family in {list(FAMILIES)}, got {s!r}"
        )
    return fam, int(layers)


__all__ = ["FAMILIES", "Family", "QuickstartConfig", "family", "parse_student"]
