"""The quick start's cost model: what each phase's work costs on this machine.

It counts the work each phase does — transformer layers over the corpus's tokens (the frozen-prefix
feature passes; tokens counted per family from its tokenizer on the data and its document prompt),
optimiser steps of the heads, QKD's teacher cache and steps — at per-unit costs measured on 2 idle
cores (:data:`TOKEN_LAYER_S`: MiniLM ~15 us and SmolLM2 ~33 us per token and layer; a head step over
cached features 15 ms + 0.07 ms per embedding dimension; a QKD step priced by its batch's padded
length, :func:`qkd_step_seconds`), each family's work scaled by this machine's measured speed
(:attr:`Sizes.speed_by`, :mod:`scalingnote.quickstart.calibrate`). The plan made from it, and what
the budget cuts, are :mod:`scalingnote.quickstart.budget`'s.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalingnote.data import load_corpus
from scalingnote.data.pseudo import text_units
from scalingnote.distill import DistillConfig
from scalingnote.distill.batches import cheapest_count, chunk_cost
from scalingnote.distill.student import scoring_samples
from scalingnote.models.loading import resolve_source
from scalingnote.quickstart.config import Family, QuickstartConfig
from scalingnote.training.mining import STORED_SAMPLE

#: seconds per token and layer of a frozen-prefix pass, per family (2 cores, fp32): the Stage I passes
#: of the budgeted runs in ``quickstart_budget.json`` (2026-11-27, idle): MiniLM 14.5 us on SciFact
#: (3.9k abstracts past the proxy's, 256 tokens, 6 layers) and on the embedded default; SmolLM2 32 us on
#: KUAKE-QTR (27k titles behind its document prompt, 94 tokens, 2 layers). Measured 20 / 50 us earlier,
#: before the passes ran length-sorted batches and the proxy's features were reused.
TOKEN_LAYER_S = {"bert": 15e-6, "llm": 33e-6}
#: a QKD step of batch ``qkd_batch_size`` (128) costs fixed + per student layer x the batch's
#: *padded* length (each length-sorted chunk of the batch is padded to its longest text:
#: :func:`qkd_padded_tokens`) + the trainer's own work (tokenising, the cached teacher's rows, the
#: loss, periodic validation). Forward + backward
#: + AdamW at batch 128, 2 idle cores, fp32 (2026-11-28): MiniLM 2 layers 0.26 / 0.44 / 0.87 s at 16 /
#: 32 / 64 tokens; SmolLM2 1 layer 0.33 / 0.48 / 0.83 s, 2 layers 0.50 / 0.79 / 1.44 s (its fixed part:
#: the optimiser over the 28M-parameter embedding matrix). The trainer's own part from the budgeted
#: runs of ``quickstart_budget.json`` (SciFact's 2-layer MiniLM: 0.93 s a step at 64 tokens).
QKD_FIXED_S = {"bert": 0.05, "llm": 0.16}
QKD_LAYER_TOKEN_S = {"bert": 0.0064, "llm": 0.0098}
QKD_TRAINER_S = 0.06
QKD_PAD_BATCHES = 256  #: simulated batches behind :func:`qkd_padded_tokens`
SMALL_STEP_S = 0.09  #: per small-tower layer and step (twinbert_small / scaling_doc, batch 64)
#: the index phase (the student encodes the validation and pseudo-queries; every candidate structure
#: is built and swept on them): fixed + per document, the least-squares line through the budgeted
#: runs of ``quickstart_budget.json`` at code 0849f86 (2 idle cores): 14-15 s on the embedded
#: default's 1,500 documents, 31-36 s on SciFact's 5,183, 77-79 s on KUAKE-QTR's 32,176.
INDEX_FIXED_S = 17.0
INDEX_DOC_S = 0.0019
EPOCHS_EST = 12  #: Stage I epochs until early stopping (the embedded default's runs stopped after 8-12)
SMALL_EPOCHS_EST = 6


@dataclass
class Sizes:
    """What the work scales with, counted before any training."""

    docs: int
    doc_tokens: float  #: mean tokens per document (capped by ``doc_max_length``)
    train_examples: int
    train_queries: int
    val_queries: int
    query_tokens: float = 10.0
    #: per family: mean document tokens (its tokenizer's characters per token on the data + its
    #: document prompt, §3.2) and query tokens; a family not in them falls back to the two above
    doc_tokens_by: dict[str, float] = field(default_factory=dict)
    query_tokens_by: dict[str, float] = field(default_factory=dict)
    doc_chars: float = 0.0  #: mean characters per document (the QKD pool's corpus texts)
    #: characters of the titles and sentences of the corpus's first 2,000 documents (what QKD's
    #: corpus texts and ICT pseudo-queries are drawn from) and each family's measured characters per
    #: token: the QKD pool's length distribution, whose batch maxima QKD pays for
    pool_chars_sample: tuple[float, ...] = ()
    chars_per_token_by: dict[str, float] = field(default_factory=dict)
    #: per family: this machine's time over the model's, measured before the plan
    #: (:func:`scalingnote.quickstart.calibrate.calibrate`); a family not in it runs at the model's
    speed_by: dict[str, float] = field(default_factory=dict)

    def doc_tok(self, fam: str) -> float:
        return self.doc_tokens_by.get(fam, self.doc_tokens)

    def query_tok(self, fam: str) -> float:
        return self.query_tokens_by.get(fam, self.query_tokens)

    def speed(self, fam: str) -> float:
        return float(self.speed_by.get(fam, 1.0))


def family_tokens(
    cfg: QuickstartConfig, doc_chars: float, report: dict[str, Any] | None
) -> tuple[dict[str, float], dict[str, float]]:
    """Per family, mean document and query tokens from its tokenizer's measured characters per token
    on the data (``readable_families``' report): English BPE/WordPiece ~4.3 characters per token,
    Chinese through SmolLM2's byte-level BPE ~1 (4x the tokens a fixed 4.3 assumed), plus the
    document prompt's fixed tokens (§3.2) of an LLM tower; capped by the length settings."""
    docs, queries = {}, {}
    for name, rep in (report or {}).items():
        cpt = float(rep.get("chars_per_token") or 0.0)
        if cpt <= 0:
            continue
        docs[name] = min(float(cfg.doc_max_length), doc_chars / cpt + 2 + float(rep.get("prompt_tokens", 0)))
        if rep.get("texts"):
            queries[name] = min(float(cfg.query_max_length), rep["tokens"] / rep["texts"] + 2)
    return docs, queries


def measure_sizes(cfg: QuickstartConfig, data: dict, report: dict[str, Any] | None = None) -> Sizes:
    """Count the corpus and the training pairs (no model runs); ``report``: the families' tokenizer
    report (characters per token, prompt tokens) that prices their tokens."""
    corpus = load_corpus(Path(data["corpus"]))
    head = list(corpus.values())[:2000]
    chars = [len(d.text) for d in head]
    mean_chars = sum(chars) / max(1, len(chars))
    tokens = min(float(cfg.doc_max_length), mean_chars / 4.3 + 2)
    by_doc, by_query = family_tokens(cfg, mean_chars, report)
    cpt = {
        name: float(rep["chars_per_token"])
        for name, rep in (report or {}).items()
        if float(rep.get("chars_per_token") or 0) > 0
    }
    units = tuple(float(len(t)) for d in head for _, t in text_units(d))
    speed = {name: float(rep["calibration"]["speed"]) for name, rep in (report or {}).items() if rep.get("calibration")}
    extra: dict[str, Any] = {
        "doc_tokens_by": by_doc,
        "query_tokens_by": by_query,
        "doc_chars": mean_chars,
        "pool_chars_sample": units,
        "chars_per_token_by": cpt,
        "speed_by": speed,
    }
    if data.get("triplets"):
        rows = [json.loads(ln) for ln in Path(data["triplets"]).read_text(encoding="utf-8").splitlines() if ln.strip()]
        val = {
            json.loads(ln)["query_id"]
            for ln in Path(data["validation_triplets"]).read_text(encoding="utf-8").splitlines()
            if ln.strip()
        }
        qids = {r["query_id"] for r in rows}
        return Sizes(len(corpus), tokens, len(rows), len(qids), len(val), **extra)
    qrels = Path(data["beir"]) / "qrels" / "train.tsv"
    lines = (
        [ln.split("\t") for ln in qrels.read_text(encoding="utf-8").splitlines()[1:] if ln.strip()]
        if qrels.exists()
        else []
    )
    qids = {p[0] for p in lines}
    n_val = round(0.1 * len(qids))
    return Sizes(len(corpus), tokens, round(0.9 * len(lines)), len(qids) - n_val, n_val, **extra)


def model_shape(model: str, default: tuple[int, int] = (6, 384)) -> tuple[int, int]:
    """A model's (layers, hidden size) from its config (without loading weights); ``default`` when unreadable."""
    try:
        src = resolve_source(model)
        c = json.loads((Path(src.path) / "config.json").read_text())
        return int(c.get("num_hidden_layers") or c.get("n_layer") or default[0]), int(
            c.get("hidden_size") or c.get("n_embd") or default[1]
        )
    except Exception:  # noqa: BLE001 - a GGUF file or a saved tower: the estimate only
        return default


def model_layers(model: str, default: int = 6) -> int:
    return model_shape(model, (default, 384))[0]


def unit_cost(fam: Family) -> float:
    """The family's per-token, per-layer cost relative to the measured model (MiniLM 384 / SmolLM2
    576 wide): a layer's work grows with the square of its width (a tiny test model costs ~nothing)."""
    ref = 576 if fam.name == "llm" else 384
    return max(0.01, (model_shape(fam.model, (6, ref))[1] / ref) ** 2)


@dataclass
class Candidates:
    """Stage I candidates per family: {depth: [head learning rates]}, whether the width run is in, and
    whether the candidates train at the backbone's width (``wide``: the declared default width, when
    the budget has no room for a run at ``dim`` and a width run after it)."""

    depths: dict[str, dict[int | None, list[float]]]
    width: dict[str, bool]
    wide: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def every(cls, cfg: QuickstartConfig, fams: list[Family]) -> Candidates:
        return cls(
            {f.name: {d: list(cfg.head_lrs) for d in f.depths} for f in fams},
            {f.name: bool(cfg.full_dim) for f in fams},
        )

    def count(self) -> int:
        return sum(len(v) for d in self.depths.values() for v in d.values()) + sum(self.width.values())


def token_layer_s(s: Sizes, fam: Family) -> float:
    """Seconds per token and layer of ``fam`` on this machine: the model's (:data:`TOKEN_LAYER_S`,
    scaled by :func:`unit_cost`) times the family's measured speed (:attr:`Sizes.speed_by`)."""
    return TOKEN_LAYER_S[fam.name] * unit_cost(fam) * s.speed(fam.name)


def depth_layers(fam: Family, depth: int | None) -> int:
    """The layers of a depth candidate (None: every layer of the model)."""
    return depth if depth else model_layers(fam.model)


def wide_dim(cfg: QuickstartConfig, family: str) -> int:
    """The width the cost model prices a run at the backbone's width with (SmolLM2 576, MiniLM 384)."""
    return max(cfg.dim, 576 if family == "llm" else 384)


def wide_only_pays(cfg: QuickstartConfig, family: str, runs: int) -> bool:
    """Whether ``runs`` head runs at the backbone's width cost no more than ``runs`` at ``cfg.dim`` and
    the width run after them (per step; a run's fixed and validation costs only favour fewer runs)."""
    narrow, wide = _head_step_s(cfg.dim), _head_step_s(wide_dim(cfg, family))
    return runs * wide <= runs * narrow + wide


def _head_step_s(dim: int) -> float:
    """Seconds of one heads-only Stage I step on cached features, with heads ``dim`` wide."""
    return 0.015 + 7e-5 * dim


def _head_run_s(s: Sizes, train_examples: int, dim: int, batch: int, epochs: float) -> float:
    steps = min(epochs, EPOCHS_EST) * math.ceil(train_examples / batch)
    return 3.0 + steps * _head_step_s(dim) + min(epochs, EPOCHS_EST) * 0.002 * s.val_queries


def stage1_seconds(
    cfg: QuickstartConfig,
    fams: dict[str, Family],
    cands: Candidates,
    s: Sizes,
    docs: int,
    train_examples: int,
    queries: int,
    cached: int = 0,
) -> float:
    """Stage I over ``docs`` documents and ``train_examples`` examples: per family one pass of its
    deepest candidate over the documents and queries, a head run per (depth, lr), the width run,
    the zero-shot start. ``cached``: documents whose features the proxy's pass already wrote (the
    feature cache is keyed by text: the full pass encodes only the others)."""
    total = 0.0
    for name, depths in cands.depths.items():
        fam = fams[name]
        if not depths:
            continue
        deep = max(depth_layers(fam, d) for d in depths)
        c = token_layer_s(s, fam)
        total += (
            max(0, docs - cached) * s.doc_tok(name) * deep * c + queries * s.query_tok(name) * deep * c + 4.0
        )  # the pass (+ model load)
        runs = sum(len(v) for v in depths.values())
        dim = wide_dim(cfg, name) if cands.wide.get(name) else cfg.dim
        total += runs * _head_run_s(s, train_examples, dim, cfg.batch_size, cfg.max_epochs)
        if cands.width.get(name):
            total += _head_run_s(s, train_examples, wide_dim(cfg, name), cfg.batch_size, cfg.max_epochs)
        total += 3.0 + 0.05 * docs * s.doc_tok(name) * min(depth_layers(fam, d) for d in depths) * c  # zero-shot start
    return total


def mining_seconds(
    cfg: QuickstartConfig, fam: Family, depths: dict[int | None, list[float]], width: bool, s: Sizes
) -> float:
    """The mining round for the family expected to teach: its query tower encodes the
    training queries with every layer (the corpus side is the teacher run's stored embeddings,
    checked on :data:`~scalingnote.training.mining.STORED_SAMPLE` documents re-encoded), BM25 ranks
    the training queries (the guard's ``agree_top``, the fallback), then the teacher's Stage I run
    again with ``mining_num_negatives`` more documents per example through the heads."""
    layers = max((depth_layers(fam, d) for d in depths), default=model_layers(fam.model))
    c = token_layer_s(s, fam)
    sample = min(s.docs, STORED_SAMPLE)
    mine = (
        4.0
        + (sample * s.doc_tok(fam.name) + s.train_queries * s.query_tok(fam.name)) * layers * c
        + 2.0
        + 1e-3 * s.docs
        + 2e-3 * s.train_queries
    )
    dim = wide_dim(cfg, fam.name) if width else cfg.dim
    per_example = 1.0 + cfg.mining_num_negatives / 2  # (query, positive) + n negatives per example: head work per step
    return mine + _head_run_s(s, s.train_examples, dim, cfg.batch_size, cfg.max_epochs) * per_example


def qkd_pool(cfg: QuickstartConfig, s: Sizes, fam: str) -> tuple[int, float]:
    """QKD's query pool (logged queries, ICT pseudo-queries, corpus texts): its size and the mean
    tokens of a text through ``fam``'s tokenizer (pseudo-queries and corpus texts cut to
    ``query_max_length``: SciFact's abstracts fill 64 tokens, the default's 32)."""
    logged, other = _pool_parts(cfg, s)
    text = min(float(cfg.query_max_length), s.doc_tok(fam))
    cpt = s.chars_per_token_by.get(fam, 0.0)
    if s.pool_chars_sample and cpt > 0:  # the sampled titles and sentences through fam's tokenizer
        text = sum(_unit_tokens(cfg, c, cpt) for c in s.pool_chars_sample) / len(s.pool_chars_sample)
    n = logged + other
    return n, (logged * s.query_tok(fam) + other * text) / max(1, n)


def _pool_parts(cfg: QuickstartConfig, s: Sizes) -> tuple[int, int]:
    """QKD's pool: (logged queries, ICT pseudo-queries + corpus texts)."""
    return s.train_queries + s.val_queries, min(cfg.qkd_max_pseudo_queries, s.docs) + min(
        cfg.qkd_corpus_texts, 4 * s.docs
    )


def qkd_steps(cfg: QuickstartConfig, s: Sizes, cap: int | None) -> int:
    """QKD's steps: its epochs over the query pool (logged queries, ICT pseudo-queries, corpus
    text), at most ``cap``."""
    steps = math.ceil(cfg.qkd_epochs * sum(_pool_parts(cfg, s)) / cfg.qkd_batch_size)
    return steps if cap is None else min(cap, steps)


def index_seconds(s: Sizes) -> float:
    """The index phase at the model's time (:data:`INDEX_FIXED_S` + :data:`INDEX_DOC_S` per document)."""
    return INDEX_FIXED_S + INDEX_DOC_S * s.docs


def qkd_seconds(
    cfg: QuickstartConfig,
    s: Sizes,
    fam: Family,
    layers: int,
    steps: int,
    teacher_layers: int,
    candidates: int = 1,
) -> float:
    """One QKD run: the teacher's query tower encodes the pool once (the teacher cache: length-sorted
    batches, so its mean tokens), the student's start (:func:`student_start_seconds`), then ``steps``
    steps (:func:`qkd_step_seconds`)."""
    n, tok = qkd_pool(cfg, s, fam.name)
    cache = n * tok * teacher_layers * token_layer_s(s, fam)
    start = student_start_seconds(cfg, s, fam, layers, candidates)
    return 5.0 + cache + start + steps * qkd_step_seconds(cfg, s, fam, layers)


def student_start_seconds(cfg: QuickstartConfig, s: Sizes, fam: Family, layers: int, candidates: int) -> float:
    """The student's start before QKD's first step, forward passes of its ``layers`` over the pool's
    texts: its least-squares head on ``head_init_samples`` training queries and, with ``candidates``
    starts to choose among, each candidate's head on ``layer_choice_samples`` and its validation loss
    (:func:`scalingnote.distill.student.build_student`)."""
    d = DistillConfig  # the quick start's QKD runs keep these defaults
    n, tok = qkd_pool(cfg, s, fam.name)
    val = round(n * d.validation_fraction)
    train = n - val
    texts = min(train, d.head_init_samples)
    if candidates > 1:
        texts += candidates * (
            min(train, scoring_samples(model_shape(fam.model)[1], d.layer_choice_samples, d.head_init_samples)) + val
        )
    return texts * tok * layers * token_layer_s(s, fam)


def qkd_step_seconds(cfg: QuickstartConfig, s: Sizes, fam: Family, layers: int) -> float:
    """One QKD step of a ``layers``-layer student of ``fam``: a fixed part (the optimiser over the
    student's embedding matrix: MiniLM's 30k x 384, SmolLM2's 49k x 576), a part per layer and
    padded token (:func:`qkd_padded_tokens`) and the trainer's own (:data:`QKD_TRAINER_S`)."""
    u = unit_cost(fam)
    model = QKD_FIXED_S[fam.name] * u + QKD_LAYER_TOKEN_S[fam.name] * layers * u * qkd_padded_tokens(cfg, s, fam.name)
    return model * s.speed(fam.name) + QKD_TRAINER_S


def qkd_padded_tokens(cfg: QuickstartConfig, s: Sizes, fam: str, chunk: int | None = None) -> float:
    """The mean padded length of a QKD batch: a step's forward passes run length-sorted chunks of
    ``chunk`` texts (None = a CPU's ``step_chunk`` auto, the cheapest count; 0 = the whole batch), each
    padded to its own longest and each pass beyond the first priced in tokens, so a step costs its chunks' maxima,
    not the pool's mean (SciFact's sentences: mean 35 MiniLM tokens, 64 in nearly every whole batch
    of 128). With ``qkd_length_buckets`` a window of that many batches is sorted by length before it
    is cut (:mod:`scalingnote.distill.batches`). Simulated (seed 0) from the sampled titles and
    sentences through ``fam``'s measured characters per token, cut to ``query_max_length``, and the
    logged queries' mean; without a sample, the pool's mean."""
    cpt = s.chars_per_token_by.get(fam, 0.0)
    logged, other = _pool_parts(cfg, s)
    if not s.pool_chars_sample or cpt <= 0 or other == 0:
        return qkd_pool(cfg, s, fam)[1]
    rng = random.Random(0)
    q_len, share = min(float(cfg.query_max_length), s.query_tok(fam)), other / (logged + other)
    bs, window = cfg.qkd_batch_size, max(1, cfg.qkd_length_buckets)
    windows = max(1, QKD_PAD_BATCHES // window)
    total = 0.0
    for _ in range(windows):
        texts = [
            _unit_tokens(cfg, rng.choice(s.pool_chars_sample), cpt) if rng.random() < share else q_len
            for _ in range(window * bs)
        ]
        if window > 1:
            texts.sort()
        total += sum(_chunked_tokens(texts[i : i + bs], chunk) for i in range(0, len(texts), bs)) / window
    return total / windows


def _chunked_tokens(batch: list[float], chunk: int | None) -> float:
    """A batch's cost per text, in padded tokens, when its step runs in length-sorted chunks, each
    pass beyond the first priced at ``CHUNK_OVERHEAD_TOKENS`` (:func:`chunk_cost`): ``chunk``
    None = ``step_chunk`` auto (the count the trainer takes, :func:`cheapest_count`), ``k`` = chunks of
    at most ``k`` texts, 0 = one."""
    xs = sorted(batch)
    if not xs:
        return 0.0
    if chunk is None:
        return chunk_cost(xs, cheapest_count(xs))
    return chunk_cost(xs, -(-len(xs) // chunk) if chunk > 0 else 1)


def _unit_tokens(cfg: QuickstartConfig, chars: float, cpt: float) -> float:
    """Tokens of a title or sentence of ``chars`` characters through the student (cut to ``query_max_length``)."""
    return min(float(cfg.query_max_length), chars / cpt + 2)


__all__ = [
    "Candidates",
    "EPOCHS_EST",
    "INDEX_DOC_S",
    "INDEX_FIXED_S",
    "QKD_FIXED_S",
    "QKD_LAYER_TOKEN_S",
    "QKD_PAD_BATCHES",
    "QKD_TRAINER_S",
    "SMALL_EPOCHS_EST",
    "SMALL_STEP_S",
    "Sizes",
    "TOKEN_LAYER_S",
    "depth_layers",
    "family_tokens",
    "index_seconds",
    "measure_sizes",
    "mining_seconds",
    "model_layers",
    "model_shape",
    "qkd_padded_tokens",
    "qkd_pool",
    "qkd_seconds",
    "qkd_step_seconds",
    "qkd_steps",
    "stage1_seconds",
    "student_start_seconds",
    "token_layer_s",
    "unit_cost",
]
