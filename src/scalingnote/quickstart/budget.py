"""The quick start's time budget (issue #51): what each phase is expected to cost on this machine,
what the budget cuts when it cannot hold every phase, and the plan printed before any training.

The cost model counts the work each phase does — transformer layers over the corpus's tokens
(the frozen-prefix feature passes; tokens counted per family from its tokenizer on the data and its
document prompt), optimiser steps of the heads, QKD's teacher cache and steps — at per-unit costs
measured on 2 idle cores (:data:`TOKEN_LAYER_S`: MiniLM ~15 us and SmolLM2 ~33 us per token and layer;
a head step over cached features 15 ms + 0.07 ms per embedding dimension; a QKD step priced by its
batch's padded length, :func:`qkd_step_seconds`). After the proxy, :meth:`Plan.speed` rescales the
rest by how long the proxy really took (a busier machine), and the plan is made again on the candidates that survived.
"""

from __future__ import annotations

import copy
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalingnote.data import load_corpus
from scalingnote.data.pseudo import text_units
from scalingnote.models.loading import resolve_source
from scalingnote.quickstart.config import Family, QuickstartConfig, family
from scalingnote.training.mining import STORED_SAMPLE

#: the phases in run order; ``mining_round``: issue #50's second Stage I round on hard negatives
#: mined by the teacher (:mod:`scalingnote.quickstart.mining_round`), planned by :func:`mining_seconds`
PHASES = ("data", "proxy", "stage1_large_towers", "mining_round", "stage2_students", "comparison_runs", "index", "evaluation")
#: seconds per token and layer of a frozen-prefix pass, per family (2 cores, fp32): the Stage I passes
#: of the budgeted runs in ``quickstart_budget.json`` (2026-11-27, idle): MiniLM 14.5 us on SciFact
#: (3.9k abstracts past the proxy's, 256 tokens, 6 layers) and on the embedded default; SmolLM2 32 us on
#: KUAKE-QTR (27k titles behind its document prompt, 94 tokens, 2 layers). Measured 20 / 50 us earlier,
#: before the passes ran length-sorted batches and the proxy's features were reused.
TOKEN_LAYER_S = {"bert": 15e-6, "llm": 33e-6}
#: a QKD step of batch ``qkd_batch_size`` (128) costs fixed + per student layer x the batch's
#: *padded* length (a batch is padded to its longest text: :func:`qkd_padded_tokens`) + the trainer's
#: own work (tokenising, the cached teacher's rows, the loss, periodic validation). Forward + backward
#: + AdamW at batch 128, 2 idle cores, fp32 (2026-11-28): MiniLM 2 layers 0.26 / 0.44 / 0.87 s at 16 /
#: 32 / 64 tokens; SmolLM2 1 layer 0.33 / 0.48 / 0.83 s, 2 layers 0.50 / 0.79 / 1.44 s (its fixed part:
#: the optimiser over the 28M-parameter embedding matrix). The trainer's own part from the budgeted
#: runs of ``quickstart_budget.json`` (SciFact's 2-layer MiniLM: 0.93 s a step at 64 tokens).
QKD_FIXED_S = {"bert": 0.05, "llm": 0.16}
QKD_LAYER_TOKEN_S = {"bert": 0.0064, "llm": 0.0098}
QKD_TRAINER_S = 0.06
QKD_PAD_BATCHES = 256  #: simulated batches behind :func:`qkd_padded_tokens`
SMALL_STEP_S = 0.09  #: per small-tower layer and step (twinbert_small / scaling_doc, batch 64)
INDEX_S = 30.0  #: the index phase (build + tuning; issue #52 keeps it a phase of its own)
EPOCHS_EST = 12  #: Stage I epochs until early stopping (the embedded default's runs stopped after 8-12)
SMALL_EPOCHS_EST = 6
QKD_FLOOR = 200  #: the budget never cuts QKD below this many steps
#: the share of the budget kept in reserve for the cost model's error: the plan fills the rest
#: (re-measured 2026-11-28: phases within 0.8-1.1x of their model on the three budgeted runs)
PLAN_RESERVE = 0.05


def proxy_sizes(n_docs: int, n_train_queries: int, fraction: float, min_docs: int, min_train_queries: int) -> tuple[int, int]:
    """The proxy size rule: ``max(min_docs, fraction x corpus)`` documents and
    ``max(min_train_queries, fraction x training queries)`` training queries (each at most all)."""
    docs = min(n_docs, max(min_docs, math.ceil(fraction * n_docs)))
    queries = min(n_train_queries, max(min_train_queries, math.ceil(fraction * n_train_queries)))
    return docs, queries


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

    def doc_tok(self, fam: str) -> float:
        return self.doc_tokens_by.get(fam, self.doc_tokens)

    def query_tok(self, fam: str) -> float:
        return self.query_tokens_by.get(fam, self.query_tokens)


def family_tokens(cfg: QuickstartConfig, doc_chars: float, report: dict[str, Any] | None) -> tuple[dict[str, float], dict[str, float]]:
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
    cpt = {name: float(rep["chars_per_token"]) for name, rep in (report or {}).items() if float(rep.get("chars_per_token") or 0) > 0}
    units = tuple(float(len(t)) for d in head for _, t in text_units(d))
    extra = {"doc_tokens_by": by_doc, "query_tokens_by": by_query, "doc_chars": mean_chars, "pool_chars_sample": units, "chars_per_token_by": cpt}
    if data.get("triplets"):
        rows = [json.loads(ln) for ln in Path(data["triplets"]).read_text(encoding="utf-8").splitlines() if ln.strip()]
        val = {json.loads(ln)["query_id"] for ln in Path(data["validation_triplets"]).read_text(encoding="utf-8").splitlines() if ln.strip()}
        qids = {r["query_id"] for r in rows}
        return Sizes(len(corpus), tokens, len(rows), len(qids), len(val), **extra)
    qrels = Path(data["beir"]) / "qrels" / "train.tsv"
    lines = [ln.split("\t") for ln in qrels.read_text(encoding="utf-8").splitlines()[1:] if ln.strip()] if qrels.exists() else []
    qids = {p[0] for p in lines}
    n_val = round(0.1 * len(qids))
    return Sizes(len(corpus), tokens, round(0.9 * len(lines)), len(qids) - n_val, n_val, **extra)


def model_shape(model: str, default: tuple[int, int] = (6, 384)) -> tuple[int, int]:
    """A model's (layers, hidden size) from its config (without loading weights); ``default`` when unreadable."""
    try:
        src = resolve_source(model)
        c = json.loads((Path(src.path) / "config.json").read_text())
        return int(c.get("num_hidden_layers") or c.get("n_layer") or default[0]), int(c.get("hidden_size") or c.get("n_embd") or default[1])
    except Exception:  # a GGUF file or a saved tower: the estimate only
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
    """Stage I candidates per family: {depth: [head learning rates]} and whether the width run is in."""

    depths: dict[str, dict[int | None, list[float]]]
    width: dict[str, bool]

    @classmethod
    def every(cls, cfg: QuickstartConfig, fams: list[Family]) -> "Candidates":
        return cls({f.name: {d: list(cfg.head_lrs) for d in f.depths} for f in fams}, {f.name: bool(cfg.full_dim) for f in fams})

    def count(self) -> int:
        return sum(len(v) for d in self.depths.values() for v in d.values()) + sum(self.width.values())


def _layers(fam: Family, depth: int | None) -> int:
    return depth if depth else model_layers(fam.model)


def _head_run_s(s: Sizes, train_examples: int, dim: int, batch: int, epochs: float) -> float:
    steps = min(epochs, EPOCHS_EST) * math.ceil(train_examples / batch)
    return 3.0 + steps * (0.015 + 7e-5 * dim) + min(epochs, EPOCHS_EST) * 0.002 * s.val_queries


def stage1_seconds(cfg: QuickstartConfig, fams: dict[str, Family], cands: Candidates, s: Sizes, docs: int, train_examples: int,
                   queries: int, cached: int = 0) -> float:
    """Stage I over ``docs`` documents and ``train_examples`` examples: per family one pass of its
    deepest candidate over the documents and queries, a head run per (depth, lr), the width run,
    the zero-shot start. ``cached``: documents whose features the proxy's pass already wrote (the
    feature cache is keyed by text: the full pass encodes only the others)."""
    total = 0.0
    for name, depths in cands.depths.items():
        fam = fams[name]
        if not depths:
            continue
        deep = max(_layers(fam, d) for d in depths)
        c = TOKEN_LAYER_S[name] * unit_cost(fam)
        total += max(0, docs - cached) * s.doc_tok(name) * deep * c + queries * s.query_tok(name) * deep * c + 4.0  # the pass (+ model load)
        runs = sum(len(v) for v in depths.values())
        total += runs * _head_run_s(s, train_examples, cfg.dim, cfg.batch_size, cfg.max_epochs)
        if cands.width.get(name):
            total += _head_run_s(s, train_examples, 576 if name == "llm" else 384, cfg.batch_size, cfg.max_epochs)
        total += 3.0 + 0.05 * docs * s.doc_tok(name) * min(_layers(fam, d) for d in depths) * c  # zero-shot start
    return total


def mining_seconds(cfg: QuickstartConfig, fam: Family, depths: dict[int | None, list[float]], width: bool, s: Sizes) -> float:
    """The mining round (issue #50) for the family expected to teach: its query tower encodes the
    training queries with every layer (the corpus side is the teacher run's stored embeddings,
    checked on :data:`~scalingnote.training.mining.STORED_SAMPLE` documents re-encoded), BM25 ranks
    the training queries (the guard's ``agree_top``, the fallback), then the teacher's Stage I run
    again with ``mining_num_negatives`` more documents per example through the heads."""
    layers = max((_layers(fam, d) for d in depths), default=model_layers(fam.model))
    c = TOKEN_LAYER_S[fam.name] * unit_cost(fam)
    sample = min(s.docs, STORED_SAMPLE)
    mine = 4.0 + (sample * s.doc_tok(fam.name) + s.train_queries * s.query_tok(fam.name)) * layers * c + 2.0 + 1e-3 * s.docs + 2e-3 * s.train_queries
    dim = max(cfg.dim, 576 if fam.name == "llm" else 384) if width else cfg.dim
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
    return s.train_queries + s.val_queries, min(cfg.qkd_max_pseudo_queries, s.docs) + min(cfg.qkd_corpus_texts, 4 * s.docs)


def qkd_steps(cfg: QuickstartConfig, s: Sizes, cap: int | None) -> int:
    """QKD's steps: its epochs over the query pool (logged queries, ICT pseudo-queries, corpus
    text), at most ``cap``."""
    steps = math.ceil(cfg.qkd_epochs * sum(_pool_parts(cfg, s)) / cfg.qkd_batch_size)
    return steps if cap is None else min(cap, steps)


def qkd_seconds(cfg: QuickstartConfig, s: Sizes, fam: Family, layers: int, steps: int, teacher_layers: int) -> float:
    """One QKD run: the teacher's query tower encodes the pool once (the teacher cache: length-sorted
    batches, so its mean tokens), then ``steps`` steps (:func:`qkd_step_seconds`)."""
    n, tok = qkd_pool(cfg, s, fam.name)
    cache = n * tok * teacher_layers * TOKEN_LAYER_S[fam.name] * unit_cost(fam)
    return 5.0 + cache + steps * qkd_step_seconds(cfg, s, fam, layers)


def qkd_step_seconds(cfg: QuickstartConfig, s: Sizes, fam: Family, layers: int) -> float:
    """One QKD step of a ``layers``-layer student of ``fam``: a fixed part (the optimiser over the
    student's embedding matrix: MiniLM's 30k x 384, SmolLM2's 49k x 576), a part per layer and
    padded token (:func:`qkd_padded_tokens`) and the trainer's own (:data:`QKD_TRAINER_S`)."""
    u = unit_cost(fam)
    return QKD_FIXED_S[fam.name] * u + QKD_LAYER_TOKEN_S[fam.name] * layers * u * qkd_padded_tokens(cfg, s, fam.name) + QKD_TRAINER_S


def qkd_padded_tokens(cfg: QuickstartConfig, s: Sizes, fam: str) -> float:
    """The mean padded length of a QKD batch: a random batch of ``qkd_batch_size`` pool texts is
    padded to its longest, so a step costs the batch's maximum, not the pool's mean (SciFact's
    sentences: mean 35 MiniLM tokens, 64 in nearly every batch). Simulated (seed 0) from the sampled
    titles and sentences through ``fam``'s measured characters per token, cut to
    ``query_max_length``, and the logged queries' mean; without a sample, the pool's mean."""
    cpt = s.chars_per_token_by.get(fam, 0.0)
    logged, other = _pool_parts(cfg, s)
    if not s.pool_chars_sample or cpt <= 0 or other == 0:
        return qkd_pool(cfg, s, fam)[1]
    rng = random.Random(0)
    q_len, share = min(float(cfg.query_max_length), s.query_tok(fam)), other / (logged + other)
    total = 0.0
    for _ in range(QKD_PAD_BATCHES):
        n_other = sum(rng.random() < share for _ in range(cfg.qkd_batch_size))
        longest = max((_unit_tokens(cfg, c, cpt) for c in rng.choices(s.pool_chars_sample, k=n_other)), default=0.0)
        total += max(longest, q_len if n_other < cfg.qkd_batch_size else 0.0)
    return total / QKD_PAD_BATCHES


def _unit_tokens(cfg: QuickstartConfig, chars: float, cpt: float) -> float:
    """Tokens of a title or sentence of ``chars`` characters through the student (cut to ``query_max_length``)."""
    return min(float(cfg.query_max_length), chars / cpt + 2)


@dataclass
class Plan:
    """Planned seconds per phase, what the budget cut, and the settings it cut them with."""

    budget_s: float | None
    phases: dict[str, float]
    cands: Candidates
    skipped: list[str] = field(default_factory=list)
    compare: str = "teacher"
    qkd_steps: int | None = None
    proxy: dict[str, Any] | None = None
    speed: float = 1.0
    mining: bool = False  #: the mining round is in the plan (issue #50)
    mining_note: str = ""  #: why it is in or out
    #: the table's zero-shot MiniLM row is made (a budget cuts it only where MiniLM cannot read the data)
    zero_shot_row: bool = True
    unreadable_bert: bool = False  #: MiniLM's family is configured but its tokenizer cannot read the data

    @property
    def total(self) -> float:
        return sum(self.phases.values())

    @property
    def limit_s(self) -> float | None:
        """The seconds the plan may fill: the budget less :data:`PLAN_RESERVE`."""
        return None if self.budget_s is None else self.budget_s * (1 - PLAN_RESERVE)

    def to_json(self) -> dict[str, Any]:
        return {"budget_minutes": None if self.budget_s is None else round(self.budget_s / 60, 2),
                "planned_minutes": round(self.total / 60, 2), "planned_s": {k: round(v, 1) for k, v in self.phases.items()},
                "skipped": list(self.skipped), "compare": self.compare, "qkd_steps": self.qkd_steps, "speed": round(self.speed, 2),
                "candidates": {f: {str(d): lrs for d, lrs in v.items()} for f, v in self.cands.depths.items()}, "width": self.cands.width,
                "mining_round": {"planned": self.mining, "note": self.mining_note}}

    def text(self) -> str:
        """The plan in words (printed before any training)."""
        lines = [f"plan: {self.total / 60:.1f} min" + (f" of a {self.budget_s / 60:g}-minute budget ({PLAN_RESERVE:.0%} kept in reserve)" if self.budget_s else " (no budget)")
                 + (f" (this machine at {self.speed:.2f}x the model's time)" if self.speed != 1.0 else "")]
        for f, v in self.cands.depths.items():
            lines.append(f"  candidates {f}: " + ", ".join(f"depth {d or 'all'} lr {'/'.join(f'{x:g}' for x in lrs)}" for d, lrs in v.items())
                         + (", width run" if self.cands.width.get(f) else ""))
        if self.proxy:
            p = self.proxy
            lines.append(f"  proxy: {p['docs']} of {p['corpus_docs']} documents, {p['train_queries']} of {p['all_train_queries']} "
                         f"training queries, every validation query ({p.get('validation_queries', '?')}) with its judged documents")
        lines.append("  expected minutes: " + ", ".join(f"{k} {v / 60:.1f}" for k, v in self.phases.items() if k != "mining_round" or self.mining)
                     + ("" if self.mining else f"; mining_round off: {self.mining_note}"))
        lines += [f"  skipped (budget): {s}" for s in self.skipped]
        return "\n".join(lines)


def make_plan(cfg: QuickstartConfig, fams: dict[str, Family], s: Sizes, student: tuple[str, int], *, cands: Candidates | None = None,
              proxy_done: bool = False, spent: dict[str, float] | None = None, speed: float = 1.0) -> Plan:
    """The plan: ``cands`` = the Stage I candidates still in (None: every one, before the proxy);
    ``spent``: phases already run (their measured seconds); ``speed``: measured / modelled time.
    When the budget cannot hold every phase, cuts in this order until it does: the mining round
    (``mining_round: auto``: an extra, tried only with time to spare), the comparison runs
    (not needed to serve), head learning rates beyond the proxy's best, depths beyond the shallowest
    survivor, families beyond the proxy's best, the width run, QKD steps (down to :data:`QKD_FLOOR`)."""
    cands = copy.deepcopy(cands) if cands is not None else Candidates.every(cfg, list(fams.values()))
    spent = dict(spent or {})
    pdocs, pq = proxy_sizes(s.docs, s.train_queries, cfg.proxy_fraction, cfg.proxy_min_docs, cfg.proxy_min_train_queries)
    use_proxy = not cfg.full and pdocs <= 0.6 * s.docs and pq <= 0.6 * max(1, s.train_queries)
    qkd_cap = qkd_steps(cfg, s, cfg.qkd_step_cap(False))
    n_students = len(cfg.students or [student]) * len(cfg.qkd_rank_weights)
    plan = Plan(None if cfg.full else (cfg.budget_minutes * 60 if cfg.budget_minutes else None), {}, cands, compare=str(cfg.compare),
                qkd_steps=qkd_cap, speed=speed, mining=cfg.mining_round != "off")
    plan.mining_note = {"off": "mining_round: off in the config", "on": "mining_round: on in the config (never cut by the budget)",
                        "auto": "--full: always tried" if cfg.full else "held by the budget"}[cfg.mining_round]

    def fill() -> None:
        ph = {"data": 2.0 + 2e-4 * s.docs, "proxy": 0.0}
        if use_proxy and not proxy_done:
            ex = round(s.train_examples * pq / max(1, s.train_queries))
            ph["proxy"] = 5 + 3e-4 * s.docs + stage1_seconds(cfg, fams, Candidates.every(cfg, list(fams.values())), s, pdocs, ex,
                                                             ex + s.val_queries)
        ph["stage1_large_towers"] = stage1_seconds(cfg, fams, plan.cands, s, s.docs, s.train_examples, s.train_examples + s.val_queries,
                                                   cached=pdocs if use_proxy else 0)
        lead = student[0] if student[0] in plan.cands.depths else next(iter(plan.cands.depths), student[0])
        ph["mining_round"] = mining_seconds(cfg, fams[lead], plan.cands.depths.get(lead, {}), bool(plan.cands.width.get(lead)), s) if plan.mining else 0.0
        tfam = fams[student[0]]
        t_layers = max((_layers(tfam, d) for d in plan.cands.depths.get(student[0], {})), default=model_layers(tfam.model))
        ph["stage2_students"] = 25.0 + n_students * qkd_seconds(cfg, s, tfam, student[1], plan.qkd_steps or 0, t_layers)
        n_cmp = {"teacher": 1, "all": len(plan.cands.depths), "none": 0}[plan.compare]
        u = unit_cost(fams[student[0]])
        small = 2 * (5 + SMALL_EPOCHS_EST * math.ceil(s.train_examples / cfg.batch_size) * SMALL_STEP_S * student[1] * u
                     + s.docs * s.doc_tok(student[0]) * student[1] * TOKEN_LAYER_S[student[0]] * u)
        ph["comparison_runs"] = n_cmp * small
        ph["index"] = INDEX_S
        ph["evaluation"] = 15.0 + 1e-3 * s.docs + (_zero_shot_row_s(cfg, s, plan.cands) if plan.zero_shot_row else 0.0)
        for k in ph:
            ph[k] = spent[k] if k in spent else ph[k] * speed
        plan.phases = {k: ph[k] for k in PHASES}

    fill()
    if plan.budget_s is None:
        return plan
    # without a proxy there is no ranking to keep "the best" by: only work that is no choice is cut
    plan.unreadable_bert = "bert" in cfg.families and "bert" not in fams
    for cut in (_CUTS if use_proxy else (_cut_unreadable_zero_shot, _cut_mining, _cut_compare, _cut_width)):
        if plan.total <= plan.limit_s:
            break
        what = cut(plan, cfg)
        if what:
            plan.skipped.append(what)
            fill()
    if plan.total > plan.limit_s and plan.qkd_steps and "stage2_students" not in spent:
        over = plan.total - plan.limit_s
        per_step = n_students * qkd_step_seconds(cfg, s, fams[student[0]], student[1]) * speed
        new = max(QKD_FLOOR, int(plan.qkd_steps - over / max(per_step, 1e-9)))
        if new < plan.qkd_steps:
            plan.skipped.append(f"QKD steps {plan.qkd_steps} -> {new}")
            plan.qkd_steps = new
            fill()
    return plan


def _zero_shot_row_s(cfg: QuickstartConfig, s: Sizes, cands: Candidates) -> float:
    """The table's zero-shot MiniLM row when Stage I did not encode the corpus with MiniLM (its family
    unreadable, as on KUAKE-QTR's Chinese, or dropped by the proxy): every layer over the corpus."""
    if "bert" not in cfg.families or "bert" in cands.depths:
        return 0.0
    fam = family(cfg, "bert")
    return 4.0 + s.docs * s.doc_tok("bert") * model_layers(fam.model) * TOKEN_LAYER_S["bert"] * unit_cost(fam)


def _cut_compare(plan: Plan, cfg: QuickstartConfig) -> str | None:
    if plan.compare == "none":
        return None
    plan.compare = "none"
    return "comparison runs (the paper's matched-cost rows: twinbert_small, scaling_doc); `--full` or a larger --budget-minutes runs them"


def _cut_mining(plan: Plan, cfg: QuickstartConfig) -> str | None:
    """The mining round goes first: an extra tried with time to spare. Where it was measured it lifted
    the teacher by little (validation +0.002, test +0.003) and not its student (-0.003, p 0.45:
    benchmarks/results/mined_negatives_synthetic.json), less than anything cut after it is worth."""
    if not plan.mining or cfg.mining_round != "auto":
        return None
    plan.mining = False
    what = (f"the mining round (planned {plan.phases.get('mining_round', 0.0) / 60:.1f} min: issue #50's second Stage I round on "
            "negatives the teacher mines); `--full`, a larger --budget-minutes or mining_round: on runs it")
    plan.mining_note = "cut to hold the budget"
    return what


def _cut_lrs(plan: Plan, cfg: QuickstartConfig) -> str | None:
    cut = [(f, d) for f, v in plan.cands.depths.items() for d, lrs in v.items() if len(lrs) > 1]
    for f, d in cut:
        plan.cands.depths[f][d] = plan.cands.depths[f][d][:1]
    return f"head learning rates beyond the proxy's best ({len(cut)} depth(s))" if cut else None


def _cut_depths(plan: Plan, cfg: QuickstartConfig) -> str | None:
    """One depth per family: the shallowest that survived the proxy. Every survivor validated within
    the proxy's margin of the best, so the proxy cannot tell them apart; when the budget cannot hold
    them all, the cheapest pass over the corpus wins (KUAKE-QTR: SmolLM2 depth 2 at 0.837 vs depth 4 at
    0.855 on the proxy, half the feature pass of a 32k-title corpus)."""
    cut = [f for f, v in plan.cands.depths.items() if len(v) > 1]
    for f in cut:
        keep = min(plan.cands.depths[f], key=lambda d: d if d else 10**6)  # None = every layer: the deepest
        plan.cands.depths[f] = {keep: plan.cands.depths[f][keep]}
    return f"depths beyond the shallowest within the proxy's margin ({', '.join(cut)})" if cut else None


def _cut_families(plan: Plan, cfg: QuickstartConfig) -> str | None:
    names = list(plan.cands.depths)
    keep = [n for n in names if n == names[0] or n == cfg.teacher]  # a pinned teacher stays
    if len(keep) == len(names):
        return None
    plan.cands.depths = {n: plan.cands.depths[n] for n in keep}
    plan.cands.width = {n: plan.cands.width.get(n, False) for n in keep}
    return f"families beyond the proxy's best ({', '.join(n for n in names if n not in keep)})"


def _cut_width(plan: Plan, cfg: QuickstartConfig) -> str | None:
    cut = [f for f, w in plan.cands.width.items() if w]
    for f in cut:
        plan.cands.width[f] = False
    return f"the width run ({', '.join(cut)})" if cut else None


def _cut_unreadable_zero_shot(plan: Plan, cfg: QuickstartConfig) -> str | None:
    """The zero-shot MiniLM row where MiniLM cannot read the data (KUAKE-QTR's Chinese: 78% of its tokens
    unknown): a baseline that reads almost nothing, and a pass over the whole corpus (2 of 15 minutes)."""
    if not plan.unreadable_bert or not plan.zero_shot_row:
        return None
    plan.zero_shot_row = False
    return "the zero-shot MiniLM row (its tokenizer cannot read this data); `--full` or a larger --budget-minutes makes it"


_CUTS = (_cut_unreadable_zero_shot, _cut_mining, _cut_compare, _cut_lrs, _cut_depths, _cut_families, _cut_width)

__all__ = ["Candidates", "PHASES", "Plan", "Sizes", "family_tokens", "make_plan", "measure_sizes", "mining_seconds", "model_layers", "model_shape",
           "proxy_sizes", "qkd_pool", "qkd_seconds", "qkd_step_seconds", "stage1_seconds"]
