"""Converged head-only training points over cached frozen-prefix features.

A *point* of a scaling sweep / ablation is one Stage I run of the CPU recipe
(``trainable_layers: 0``: the projection heads train over cached pooled states, see
:mod:`scalingnote.models.prefix`) trained **to convergence**: epochs of the same
:class:`~scalingnote.training.trainer.Trainer` the ``scalingnote train`` command uses, with
early stopping on the contrastive perplexity of held-out *dev* queries and the best weights
restored, then scored once on a fixed *evaluation* set.

:class:`HeadSession` loads the two towers of one (method, model, depth, prompt) once and keeps
their initial heads, so a sweep over data sets reuses them: every point starts from the same
pre-trained prefix, re-initialises the heads from its own training pairs (``projection_init``)
and trains with a fresh optimizer. What is measured per point (:func:`score`):

- contrastive perplexity — Fang et al., *Scaling Laws for Dense Retrieval* §3.5, Eq. (6): the
  mean −log softmax of the positive among itself and W = 256 random non-relevant documents,
  s = cos/τ (τ = the training temperature). The paper's value is this NLL (not its
  exponential). The W negatives of every pair are drawn **once** (fixed seed, whole corpus),
  so every point is scored on the same tuples;
- nDCG@10 and R@100 by exact search over the whole corpus, with their per-query values (for
  paired t-tests between points).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.evaluation import contrastive_perplexity, evaluate
from scalingnote.evaluation.dense import exact_search, perplexity_negatives, truncate_normalize
from scalingnote.evaluation.metrics import per_query as per_query_metrics
from scalingnote.evaluation.perplexity import sample_contrastive_set
from scalingnote.models import PrefixTower
from scalingnote.training.config import TrainConfig
from scalingnote.training.heads import init_heads
from scalingnote.training.towers import build_towers
from scalingnote.training.trainer import Trainer
from scalingnote.utils import seed_everything, write_json

log = logging.getLogger(__name__)


@dataclass
class EvalSet:
    """Queries + qrels scored over a fixed corpus, with their fixed contrastive tuples."""

    query_ids: list[str]
    texts: list[str]
    qrels: dict[str, dict[str, int]]
    cset: Any  #: :class:`~scalingnote.evaluation.perplexity.ContrastiveSet` over ``doc_ids``
    name: str = "eval"
    #: the documents ``cset`` indexes (a fixed pool for cheap validations; None = the session's corpus)
    doc_ids: list[str] | None = None


def make_eval_set(
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    doc_ids: Sequence[str],
    *,
    num_negatives: int = 256,
    seed: int = 0,
    name: str = "eval",
    pool: bool = False,
) -> EvalSet:
    """An :class:`EvalSet` whose W negatives per (query, positive) pair are drawn once with ``seed``
    from ``doc_ids``. ``pool=True``: ``doc_ids`` is a fixed document pool (not the whole corpus),
    recorded in the set so a validation encodes only those documents."""
    qrels = {q: d for q, d in qrels.items() if any(g > 0 for g in d.values())}
    if not qrels:
        raise ScalingNoteError(f"{name}: no query with a relevant document")
    missing = sorted(set(qrels) - set(queries))
    if missing:
        raise ScalingNoteError(f"{name}: {len(missing)} qrels queries have no text, e.g. {missing[0]!r}")
    qids = sorted(qrels)
    w = min(num_negatives, perplexity_negatives(len(doc_ids), qrels, num_negatives))
    cset = sample_contrastive_set(qrels, list(doc_ids), num_negatives=w, seed=seed)
    return EvalSet(qids, [queries[q] for q in qids], qrels, cset, name, list(doc_ids) if pool else None)


class HeadSession:
    """The towers of one Stage I configuration with cached frozen prefixes (``trainable_layers: 0``).

    ``cfg.feature_cache_dir`` is where the pooled features live (shared between runs; missing
    rows are filled on demand). ``corpus`` is the document collection every point is scored on.
    """

    def __init__(self, cfg: TrainConfig, corpus: dict[str, Any], *, show_progress: bool = False):
        import torch

        for name, spec in (("query_tower", cfg.query_tower), ("doc_tower", cfg.doc_tower)):
            if spec.prefix_k != 0:
                raise ConfigError(
                    None, None, f"{name}.trainable_layers", "a HeadSession trains the heads only: it must be 0"
                )
        if not cfg.feature_cache_dir:
            raise ConfigError(None, None, "feature_cache_dir", "a HeadSession needs a shared feature cache directory")
        self.cfg = cfg
        self.device = torch.device("cpu")
        self.qt, self.dt = build_towers(cfg, self.device)
        root = Path(cfg.feature_cache_dir)
        self.q_enc = PrefixTower(self.qt, 0, root, batch_size=64, show_progress=show_progress)
        self.d_enc = PrefixTower(self.dt, 0, root, batch_size=16, show_progress=show_progress)
        self.doc_ids = list(corpus)
        self.docs = [corpus[i] for i in self.doc_ids]
        self._initial = {id(t): _head_state(t) for t in (self.qt, self.dt)}
        self._pooled: dict[tuple, Any] = {}  # frozen pooled states of the corpus / of evaluated query lists

    @property
    def non_embedding_params(self) -> dict[str, int]:
        return {"query": int(self.qt.non_embedding_params), "doc": int(self.dt.non_embedding_params)}

    def ensure_features(self, query_texts: Sequence[str], docs: Sequence[Any] = ()) -> int:
        """Fill the caches for texts not cached yet (the corpus is always included)."""
        n = self.q_enc.ensure(sorted(set(query_texts)))
        return n + self.d_enc.ensure(list(self.docs) + list(docs))

    @property
    def encoders(self) -> tuple[Any, Any]:
        """The (query, document) prefix encoders the trainer steps through."""
        return self.q_enc, self.d_enc

    def reset(self) -> None:
        """Back to the pre-trained heads the session started with."""
        for t in (self.qt, self.dt):
            _load_head_state(t, self._initial[id(t)])

    def encode(
        self, texts: Sequence[str] | None = None, *, docs: bool = False, doc_ids: Sequence[str] | None = None
    ) -> np.ndarray:
        """Normalised embeddings (``[EMB]`` view for documents) of ``texts`` or of the corpus
        (``doc_ids``: of those corpus documents only).

        With plain head-only encoders the frozen pooled states are read once and kept: a
        validation is then one projection (validations every few steps stay cheap)."""
        if docs and doc_ids is not None:
            pos = {d: i for i, d in enumerate(self.doc_ids)}
            return self.encode(docs=True)[[pos[d] for d in doc_ids]]
        enc, items = (self.d_enc, self.docs) if docs else (self.q_enc, list(texts or []))
        if type(enc) is not PrefixTower:  # e.g. a fusion encoder: its own path
            return truncate_normalize(enc.encode(items, batch_size=1024), self.cfg.dim)
        import torch

        key = ("docs",) if docs else tuple(items)
        pooled = self._pooled.get(key)
        if pooled is None:
            with torch.no_grad():
                pooled = enc.pooled(items)
            if len(self._pooled) > 8:
                self._pooled.clear()
            self._pooled[key] = pooled
        with torch.no_grad():
            p = enc.tower.project(pooled)
        if p.dim() == 3:  # LLM document views (title, content, emb)
            p = p[:, -1]
        return truncate_normalize(p.float().cpu().numpy(), self.cfg.dim)


def _head_state(tower) -> dict[str, Any]:
    p = tower.projection
    return {
        "w": None if p is None else p.weight.detach().clone(),
        "b": None if p is None or p.bias is None else p.bias.detach().clone(),
        "c": None if tower.center is None else tower.center.detach().clone(),
        "config": tower.config,
    }


def _load_head_state(tower, st: dict[str, Any]) -> None:
    import torch

    with torch.no_grad():
        if st["w"] is not None:
            tower.projection.weight.copy_(st["w"])
        if st["b"] is not None:
            tower.projection.bias.copy_(st["b"])
        if st["c"] is not None:
            tower.center.copy_(st["c"])
    tower.config = st["config"]
    tower._ids = None


def score(session: Any, ev: EvalSet, doc_emb: np.ndarray | None = None, *, per_query: bool = True) -> dict[str, Any]:
    """Contrastive perplexity (Eq. 6 of Fang et al., s = cos/τ) + nDCG@10 / R@100 of the current heads on ``ev``."""
    d = session.encode(docs=True) if doc_emb is None else doc_emb
    q = session.encode(ev.texts)
    pairs = contrastive_perplexity(
        q, ev.query_ids, d, session.doc_ids, ev.cset, temperature=session.cfg.loss.tau, return_per_pair=True
    )
    run = exact_search(q, ev.query_ids, d, session.doc_ids, k=min(1000, len(session.doc_ids)))
    m = evaluate(run, ev.qrels, ["ndcg@10", "r@100"])
    out: dict[str, Any] = {"contrastive_ppl": float(np.mean(pairs)), "ndcg@10": m["ndcg@10"], "r@100": m["r@100"]}
    if per_query:
        pq = per_query_metrics(run, ev.qrels, ["ndcg@10", "r@100"])
        out["per_query"] = {qid: [v["ndcg@10"], v["r@100"]] for qid, v in pq.items()}
        # per query: the mean perplexity of its pairs
        acc: dict[str, list[float]] = {}
        for qid, v in zip(ev.cset.query_ids, pairs.tolist(), strict=True):
            acc.setdefault(qid, []).append(v)
        for qid, vals in acc.items():
            out["per_query"].setdefault(qid, [0.0, 0.0]).append(float(np.mean(vals)))
    return out


@dataclass
class PointSettings:
    """How a point trains (the recipe's defaults, sized for small data sets)."""

    head_lr: float = 3e-3
    lr: float = 0.0  #: other trainable parameters (fusion modules attached to a tower); the frozen backbone has none
    batch_size: int = 64
    max_steps: int = 6000  #: cap; early stopping usually ends much sooner
    min_eval_every: int = 10  #: validate every epoch, but at most every this many steps...
    max_eval_every: int = 50  #: ...and at least every this many steps
    #: stop after this many optimizer steps without a better dev score (the same window for every data
    #: size, so a large D is not stopped after fewer epochs' worth of noise than a small one)
    patience_steps: int = 1000
    patience: int | None = None  #: or: validations without improvement (overrides patience_steps)
    warmup_ratio: float = 0.02
    seed: int = 0
    #: early-stopping metric on the dev set: "contrastive_ppl" (the scaling-law loss) or "ndcg@10" (the recipe's)
    validation_metric: str = "contrastive_ppl"
    #: learning-rate schedule after the warm-up ("linear" decay to 0, or "constant", see OptimSpec.schedule)
    schedule: str = "linear"
    warmup_steps: int | None = None  #: overrides ``warmup_ratio`` (the same warm-up at every data size)

    def __post_init__(self) -> None:
        if self.validation_metric not in ("contrastive_ppl", "ndcg@10"):
            raise ConfigError(
                None,
                None,
                "validation_metric",
                f"must be 'contrastive_ppl' or 'ndcg@10', got {self.validation_metric!r}",
            )


def train_point(
    session: Any, train: Sequence[Any], dev: EvalSet, out_dir: str | Path, settings: PointSettings | None = None
) -> dict[str, Any]:
    """Train ``session`` (a :class:`HeadSession`, or a :class:`~scalingnote.scaling.trained.TowerSession`
    whose every layer trains) on ``train`` (:class:`~scalingnote.training.data.Example`) until the dev
    contrastive perplexity stops improving; the best weights are restored. Returns the training
    record (steps, best step, dev curve, seconds). The towers keep the trained heads."""
    s = settings or PointSettings()
    train = list(train)
    if len(train) < 2:
        raise ScalingNoteError(f"a point needs at least 2 training pairs, got {len(train)}")
    bs = min(s.batch_size, len(train))
    spe = len(train) // bs
    every = int(min(max(spe, s.min_eval_every), s.max_eval_every))
    cfg = session.cfg
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    pcfg = dataclasses.replace(
        cfg,
        output_dir=str(out),
        seed=s.seed,
        optim=dataclasses.replace(
            cfg.optim,
            batch_size=bs,
            epochs=math.ceil(s.max_steps / spe) + 1,
            max_steps=s.max_steps,
            lr=s.lr,
            head_lr=s.head_lr,
            warmup_ratio=s.warmup_ratio,
            schedule=s.schedule,
            warmup_steps=s.warmup_steps,
        ),
        eval_every=every,
        patience=s.patience if s.patience is not None else max(3, math.ceil(s.patience_steps / every)),
        restore_best=True,
        save_every=10**9,
        show_progress=False,
    )
    session.reset()
    seed_everything(s.seed)
    order = np.random.default_rng(s.seed).permutation(len(train))
    sample = [train[i] for i in order[: cfg.center_samples]]
    init_heads(session.qt, session.dt, sample, cfg.projection_init, n=cfg.center_samples, encoders=session.encoders)
    dev_docs = dev.doc_ids or session.doc_ids

    def validate() -> float:
        d = session.encode(docs=True, doc_ids=dev.doc_ids)
        q = session.encode(dev.texts)
        if s.validation_metric == "ndcg@10":
            return evaluate(exact_search(q, dev.query_ids, d, dev_docs, k=10), dev.qrels, ["ndcg@10"])["ndcg@10"]
        return -contrastive_perplexity(q, dev.query_ids, d, dev_docs, dev.cset, temperature=cfg.loss.tau)

    trainer = Trainer(pcfg, session.qt, session.dt, train, session.device, encoders=session.encoders)
    seed_everything(s.seed)
    t0 = time.perf_counter()
    last = trainer.train(resume=False, validate=validate)
    return {
        "train_pairs": len(train),
        "batch_size": bs,
        "eval_every": every,
        "steps_run": int(last.get("steps_run", trainer.step)),
        "best_step": int(last.get("best_step", 0)),
        **_dev_scores(s.validation_metric, float(last["best_val_score"]), float(trainer.best["curve"][0][1])),
        "stopped_early": bool(last.get("stopped_early", 0.0)),
        "train_seconds": round(time.perf_counter() - t0, 2),
        "dev_curve": [
            [int(a), round(float(b) if s.validation_metric == "ndcg@10" else -float(b), 5)]
            for a, b in trainer.best["curve"]
        ],
    }


def _dev_scores(metric: str, best: float, start: float) -> dict[str, float]:
    if metric == "ndcg@10":
        return {"dev_ndcg@10": best, "start_dev_ndcg@10": start}
    return {"dev_contrastive_ppl": -best, "start_dev_contrastive_ppl": -start}


def run_point(
    session: Any,
    train: Sequence[Any],
    dev: EvalSet,
    test: EvalSet,
    out_dir: str | Path,
    settings: PointSettings | None = None,
    *,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """:func:`train_point` then :func:`score` on ``test``; the record (with per-query values) is
    written to ``out_dir/point.json`` — a rerun with the same ``key`` in ``extra`` is skipped
    (resumable sweeps)."""
    out = Path(out_dir)
    f = out / "point.json"
    extra = dict(extra or {})
    if f.exists():
        prev = json.loads(f.read_text(encoding="utf-8"))
        if prev.get("key") == extra.get("key"):
            return prev
    rec = train_point(session, train, dev, out, settings)
    sc = score(session, test)
    rec = {
        **extra,
        **rec,
        "test_" + "contrastive_ppl": sc["contrastive_ppl"],
        "ndcg@10": sc["ndcg@10"],
        "r@100": sc["r@100"],
        "per_query": sc["per_query"],
        "non_embedding_params": session.non_embedding_params,
    }
    write_json(f, rec, indent=None)
    return rec


__all__ = ["EvalSet", "HeadSession", "PointSettings", "make_eval_set", "run_point", "score", "train_point"]
