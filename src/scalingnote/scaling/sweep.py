"""Scaling sweep: a grid of Stage I runs over model size × data size, each scored by
contrastive perplexity on **one fixed validation set** (Fang et al. §3.5, Eq. 6).

Protocol (Fang et al. §3.4 / §4, ScalingNote §4.4):

- model size N = non-embedding parameters of the tower (a checkpoint truncated to
  ``layers[i]`` layers: SmolLM2 1..30, MiniLM 1..6);
- data size D = number of annotated (query, positive) training pairs. The training pool
  (qrels of ``train.data.train_split`` or a triplet file, with the configured hard
  negatives) is shuffled once with ``train.seed``; grid point D trains on the first D
  pairs, so the data sets are nested;
- every grid point is trained with the same Stage I configuration ``train`` (only the
  layer count, the training pairs and the output directory change) for ``steps`` optimizer
  steps (the paper fine-tunes every model for a fixed number of steps) or, with
  ``steps: null``, ``train.optim.epochs`` passes over its D pairs;
- validation: held-out training queries (``validation.split: null``, a seeded
  ``fraction`` of the queries, removed from the training pool) or another qrels split
  (e.g. SciFact ``test``; its queries are removed from the pool). For every (query,
  positive) pair, ``num_negatives`` (W = 256) non-relevant documents are drawn once, with
  ``validation.seed``, from a fixed document pool (``doc_pool`` random documents plus the
  positives, or the whole corpus). The set is saved (``validation/contrastive_set.npz``)
  and its hash is stored with every grid point; the loss is computed after training from
  the saved towers, L2-normalised embeddings, ``s = cos / τ`` (τ = ``train.loss.tau``).

Layout of ``output_dir``::

    sweep_config.yaml          resolved SweepConfig
    data/train_pool.jsonl      the shuffled training pool (triplets)
    data/train_D<D>.jsonl      the first D pairs
    validation/                contrastive_set.npz + validation.json (pairs, W, hash)
    points/L<l>_D<D>/          a Stage I run dir (train()'s outputs) + point.json
    results.csv                N,D,loss,layers,steps,... (rewritten after every point)
    run.json                   config + versions + machine + rows

Resumable: a grid point whose ``point.json`` matches the current training configuration
and validation set is skipped; an interrupted training run continues from its last
checkpoint; a finished run whose validation set changed is only re-scored. A grid point
trained with a different configuration is an error (use a new ``output_dir``).
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from scalingnote.config import config_to_dict, load_config, save_config
from scalingnote.data import load_corpus, load_qrels, load_queries
from scalingnote.data.beir import qrels_path
from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.evaluation.perplexity import contrastive_perplexity, sample_contrastive_set
from scalingnote.models import DocumentTower, QueryTower, load_tower
from scalingnote.scaling.provenance import _check_same_config, _check_same_data, config_hash
from scalingnote.scaling.table import write_table
from scalingnote.training import train
from scalingnote.training.config import DataSpec, TrainConfig
from scalingnote.training.data import _split_by_query, load_training_data
from scalingnote.utils import run_metadata, write_json
from scalingnote.utils.io import atomic_path, atomic_write

log = logging.getLogger(__name__)


@dataclass
class ValidationSpec:
    """The fixed validation set every grid point is scored on."""

    data_dir: str | None = None  #: BEIR dir of the validation queries/qrels/corpus (default: train.data.data_dir)
    split: str | None = None  #: qrels split (e.g. "test"); null: hold out ``fraction`` of the training queries
    fraction: float = 0.1
    max_queries: int | None = None  #: cap on validation queries (seeded sample)
    num_negatives: int = 256  #: W (Fang et al. §3.5)
    doc_pool: int | None = 2048  #: negatives come from this many random documents (+ positives); null: whole corpus
    seed: int = 0
    temperature: float | None = None  #: s = cos / temperature; null: train.loss.tau
    batch_size: int = 64

    def __post_init__(self) -> None:
        if not 0 < self.fraction < 1:
            raise ValueError(f"validation.fraction must be in (0, 1), got {self.fraction}")
        if self.num_negatives < 1:
            raise ValueError(f"validation.num_negatives must be >= 1, got {self.num_negatives}")
        if self.doc_pool is not None and self.doc_pool < 2:
            raise ValueError(f"validation.doc_pool must be >= 2 or null, got {self.doc_pool}")
        if self.temperature is not None and self.temperature <= 0:
            raise ValueError(f"validation.temperature must be > 0, got {self.temperature}")


@dataclass
class SweepConfig:
    """``scalingnote scaling sweep --config FILE``."""

    output_dir: str = "runs/scaling_sweep"
    train: TrainConfig = field(
        default_factory=TrainConfig
    )  #: base Stage I config (output_dir/num_layers/data subset set per point)
    layers: list[int] = field(default_factory=lambda: [1, 2, 4, 8])  #: model-size axis (num_layers)
    data_sizes: list[int] = field(default_factory=lambda: [100, 200, 400, 800])  #: data-size axis (training pairs)
    scale_towers: Literal["both", "query", "doc"] = "both"  #: which tower(s) get ``layers``; N is counted on it
    steps: int | None = None  #: optimizer steps per grid point (fixed, Fang §3.4); null: train.optim.epochs over D
    validation: ValidationSpec = field(default_factory=ValidationSpec)
    keep_towers: bool = True  #: keep each point's trained towers (allows re-scoring on a new validation set)
    keep_checkpoints: bool = False  #: keep the training checkpoints of finished points
    show_progress: bool = True

    def __post_init__(self) -> None:
        if not self.layers or any(n < 1 for n in self.layers):
            raise ValueError(f"layers must be a non-empty list of integers >= 1, got {self.layers}")
        if not self.data_sizes or any(d < 1 for d in self.data_sizes):
            raise ValueError(f"data_sizes must be a non-empty list of integers >= 1, got {self.data_sizes}")
        if len(set(self.layers)) != len(self.layers) or len(set(self.data_sizes)) != len(self.data_sizes):
            raise ValueError("layers and data_sizes must not repeat values")
        bs = self.train.optim.batch_size
        if min(self.data_sizes) < bs:
            raise ValueError(f"every data size must be >= train.optim.batch_size ({bs}), got {min(self.data_sizes)}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1 or null, got {self.steps}")
        if self.train.method == "scaling_dual" and self.scale_towers != "both":
            raise ValueError("scaling_dual starts both towers from one checkpoint: scale_towers must be 'both'")


@dataclass
class SweepResult:
    rows: list[dict[str, Any]]
    table: Path
    output_dir: Path
    validation: dict[str, Any]


def load_sweep_config(path: str | Path | dict | None, **overrides: Any) -> SweepConfig:
    return load_config(SweepConfig, path, **overrides)


# ----------------------------------------------------------------------------- data preparation
@dataclass
class _Validation:
    cset: Any  # ContrastiveSet
    queries: dict[str, str]
    corpus: dict[str, Any]
    temperature: float
    info: dict[str, Any]


def _hash_set(cset) -> str:
    h = hashlib.sha256()
    for part in (json.dumps(list(cset.query_ids)), json.dumps(list(cset.doc_ids))):
        h.update(part.encode("utf-8"))
    h.update(np.ascontiguousarray(cset.pos, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(cset.neg, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def _training_pool(cfg: SweepConfig):
    """All training examples of the configured source (qrels or triplets, hard negatives as
    configured), without any hold-out."""
    d = cfg.train.data
    spec = DataSpec(
        data_dir=d.data_dir,
        train_split=d.train_split,
        eval_split=None,
        triplets=d.triplets,
        validation_triplets=None,
        negatives=d.negatives,
        neg_skip_top=d.neg_skip_top,
        neg_max_rank=d.neg_max_rank,
        validation_fraction=0.0,
        max_train_examples=None,
    )
    return load_training_data(spec, cfg.train.seed, show_progress=cfg.show_progress)


def prepare(cfg: SweepConfig) -> tuple[list[Any], _Validation]:
    """Build (or rebuild, deterministically) the shuffled training pool and the fixed validation set."""
    pool_data = _training_pool(cfg)
    examples = list(pool_data.train)
    v = cfg.validation
    vdir = Path(v.data_dir or cfg.train.data.data_dir)
    same_dir = Path(v.data_dir or cfg.train.data.data_dir).resolve() == Path(cfg.train.data.data_dir).resolve()
    if same_dir:
        corpus, queries = pool_data.corpus, pool_data.queries
    else:
        corpus = load_corpus(vdir)  # any registered corpus format (scalingnote.data.corpus)
        queries = {q.id: q.text for q in load_queries(vdir / "queries.jsonl").values()}

    if v.split is None:
        held = _split_by_query([e.query_id for e in examples], v.fraction, v.seed)
        if not held:
            raise ConfigError("<sweep config>", None, "validation.fraction", "no validation query could be held out")
        val_qrels: dict[str, dict[str, int]] = {}
        for e in examples:
            if e.query_id in held:
                val_qrels.setdefault(e.query_id, {})[e.pos.id] = 1
        source = f"{v.fraction:g} of the {cfg.train.data.train_split!r} queries held out (seed {v.seed})"
    else:
        val_qrels = load_qrels(qrels_path(vdir, v.split), queries, corpus)
        source = f"qrels split {v.split!r} of {vdir}"
    if v.max_queries is not None and len(val_qrels) > v.max_queries:
        keep = np.random.default_rng(v.seed).choice(sorted(val_qrels), size=v.max_queries, replace=False)
        val_qrels = {q: val_qrels[q] for q in sorted(keep.tolist())}
    before = len(examples)
    if same_dir:  # a validation query must never be trained on
        examples = [e for e in examples if e.query_id not in val_qrels]
    dropped = before - len(examples)

    # the fixed candidate pool for negatives
    doc_ids = list(corpus)
    if v.doc_pool is not None and v.doc_pool < len(doc_ids):
        rng = np.random.default_rng(v.seed)
        chosen = set(rng.choice(len(doc_ids), size=v.doc_pool, replace=False).tolist())
        positives = {d for docs in val_qrels.values() for d, g in docs.items() if g > 0}
        doc_ids = [d for i, d in enumerate(doc_ids) if i in chosen or d in positives]
    in_pool = set(doc_ids)
    most_rel = max(sum(1 for d, g in docs.items() if g > 0 and d in in_pool) for docs in val_qrels.values())
    if len(doc_ids) - most_rel < v.num_negatives:
        raise ConfigError(
            "<sweep config>",
            None,
            "validation.num_negatives",
            f"{v.num_negatives} negatives requested but the document pool has only {len(doc_ids) - most_rel} "
            "non-relevant documents for some query (raise validation.doc_pool or lower num_negatives)",
        )
    cset = sample_contrastive_set(val_qrels, doc_ids, num_negatives=v.num_negatives, seed=v.seed)

    # the training pool, shuffled once; grid point D uses the first D pairs
    order = np.random.default_rng(cfg.train.seed).permutation(len(examples))
    pool = [examples[i] for i in order]
    if max(cfg.data_sizes) > len(pool):
        raise ConfigError(
            "<sweep config>",
            None,
            "data_sizes",
            f"largest data size {max(cfg.data_sizes)} exceeds the {len(pool)} training pairs available "
            f"(after removing {dropped} validation pairs)",
        )
    temperature = v.temperature if v.temperature is not None else cfg.train.loss.tau
    info = {
        "source": source,
        "queries": len({q for q in cset.query_ids}),
        "pairs": cset.num_pairs,
        "num_negatives": cset.num_negatives,
        "doc_pool": len(doc_ids),
        "seed": v.seed,
        "temperature": temperature,
        "hash": _hash_set(cset),
        "train_pool_pairs": len(pool),
        "removed_from_train_pool": dropped,
    }
    return pool, _Validation(cset, queries, corpus, temperature, info)


def _write_validation(out: Path, val: _Validation) -> None:
    vdir = out / "validation"
    vdir.mkdir(parents=True, exist_ok=True)
    with atomic_path(vdir / "contrastive_set.npz", suffix=".npz") as p:
        np.savez(
            p,
            query_ids=np.array(val.cset.query_ids),
            pos=val.cset.pos,
            neg=val.cset.neg,
            doc_ids=np.array(val.cset.doc_ids),
            seed=np.array(val.cset.seed),
        )
    write_json(vdir / "validation.json", val.info)


def _triplet_lines(examples) -> list[str]:
    return [
        json.dumps(
            {
                "query_id": e.query_id,
                "pos_id": e.pos.id,
                "neg_id": e.neg.id if e.neg is not None else None,
                "source": e.source,
            },
            ensure_ascii=False,
        )
        for e in examples
    ]


def _examples_hash(examples) -> str:
    return hashlib.sha256("\n".join(_triplet_lines(examples)).encode("utf-8")).hexdigest()[:16]


def _write_subset(path: Path, examples) -> None:
    """Write the triplets of ``examples`` (only when the file is missing or differs)."""
    text = "".join(line + "\n" for line in _triplet_lines(examples))
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    with atomic_write(path) as fh:
        fh.write(text)


# ----------------------------------------------------------------------------- one grid point
def point_name(layers: int, D: int) -> str:
    return f"L{layers}_D{D}"


def point_train_config(cfg: SweepConfig, layers: int, D: int, triplets: Path, out_dir: Path) -> TrainConfig:
    """The Stage I config of grid point (layers, D)."""
    d = config_to_dict(cfg.train)
    d["output_dir"] = str(out_dir)
    if cfg.scale_towers in ("both", "query"):
        d["query_tower"]["num_layers"] = layers
    if cfg.scale_towers in ("both", "doc"):
        d["doc_tower"]["num_layers"] = layers
    d["data"].update(
        triplets=str(triplets),
        validation_triplets=None,
        validation_fraction=0.0,
        eval_split=None,
        max_train_examples=None,
        max_eval_queries=None,
    )
    bs = cfg.train.optim.batch_size
    if cfg.steps is not None:
        d["optim"]["max_steps"] = cfg.steps
        d["optim"]["epochs"] = float(math.ceil(cfg.steps / (D // bs)))
    d["show_progress"] = cfg.show_progress
    d["evaluate_zero_shot"] = False
    return load_config(TrainConfig, d)


def score_point(run_dir: Path, val: _Validation, batch_size: int = 64, show_progress: bool = False) -> float:
    """Contrastive perplexity (Eq. 6) of the towers saved in ``run_dir`` on the fixed set."""
    import torch

    qt = load_tower(run_dir / "query_tower")
    dt = load_tower(run_dir / "doc_tower")
    assert isinstance(qt, QueryTower) and isinstance(dt, DocumentTower)  # a Stage I run saves them so
    qids = list(dict.fromkeys(val.cset.query_ids))
    with torch.no_grad():
        q = qt.encode_queries([val.queries[q] for q in qids], batch_size=batch_size, show_progress=False)
        d = dt.encode_documents(
            [val.corpus[x] for x in val.cset.doc_ids], batch_size=batch_size, show_progress=show_progress
        )
    loss = contrastive_perplexity(q, qids, d, list(val.cset.doc_ids), val.cset, temperature=val.temperature)
    del qt, dt
    gc.collect()
    return float(loss)


# ----------------------------------------------------------------------------- the sweep
def _reuse_point(
    cfg: SweepConfig, run_dir: Path, tc: TrainConfig, chash: str, dhash: str, val: _Validation
) -> dict[str, Any] | None:
    """A finished point's row when its data and configuration are this run's (re-scored when only the
    validation set changed and its towers were kept); None when it has to be trained."""
    point_file = run_dir / "point.json"
    if not point_file.exists():
        return None
    prev = json.loads(point_file.read_text(encoding="utf-8"))
    _check_same_data(run_dir, dhash, prev.get("data_hash", "missing"))
    if prev.get("config_hash") != chash:
        # the saved config.yaml decides (a path spelled differently is the same config)
        if not (run_dir / "config.yaml").exists():
            raise ScalingNoteError(f"{run_dir}: trained with a different configuration; use a new output_dir")
        _check_same_config(run_dir, tc)  # raises naming the changed keys
        prev["config_hash"] = chash
        write_json(point_file, prev)
    if prev.get("validation_hash") == val.info["hash"]:
        log.info("grid point %s: done, skipped", run_dir.name)
        return prev
    if (run_dir / "query_tower").exists() and (run_dir / "doc_tower").exists():
        log.info("grid point %s: validation set changed, re-scoring the saved towers", run_dir.name)
        te = time.perf_counter()
        prev["loss"] = score_point(run_dir, val, cfg.validation.batch_size)
        prev["eval_seconds"] = round(time.perf_counter() - te, 2)
        prev["validation_hash"] = val.info["hash"]
        write_json(point_file, prev)
        return prev
    return None


def _train_point(
    cfg: SweepConfig,
    L: int,
    D: int,
    run_dir: Path,
    tc: TrainConfig,
    chash: str,
    dhash: str,
    val: _Validation,
    t0: float,
) -> dict[str, Any]:
    """Train one grid point, score it on the validation set and write its ``point.json`` row;
    checkpoints and towers are removed unless the config keeps them."""
    _check_same_config(run_dir, tc)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train_data.sha").write_text(dhash + "\n", encoding="utf-8")
    res = train(tc, resume=True)
    te = time.perf_counter()
    loss = score_point(run_dir, val, cfg.validation.batch_size)
    eval_s = time.perf_counter() - te
    n_q = int(res["query_tower_non_embedding_params"])
    n_d = int(res["doc_tower_non_embedding_params"])
    row = {
        "N": n_d if cfg.scale_towers == "doc" else n_q,
        "D": D,
        "loss": loss,
        "layers": L,
        "steps": int(res["total_steps"]),
        "train_seconds": float(res["train_seconds"]),
        "eval_seconds": round(eval_s, 2),
        "seconds": round(time.perf_counter() - t0, 2),
        "n_query": n_q,
        "n_doc": n_d,
        "train_examples": int(res["train_examples"]),
        "final_train_loss": res.get("final_loss"),
        "method": cfg.train.method,
        "seed": cfg.train.seed,
        "config_hash": chash,
        "data_hash": dhash,
        "validation_hash": val.info["hash"],
        "run_dir": str(run_dir),
    }
    write_json(run_dir / "point.json", row)
    if not cfg.keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    if not cfg.keep_towers:
        for t in ("query_tower", "doc_tower"):
            shutil.rmtree(run_dir / t, ignore_errors=True)
    gc.collect()
    return row


def run_sweep(cfg: SweepConfig, *, on_point: Callable[[dict[str, Any]], None] | None = None) -> SweepResult:
    """Run (or resume) the grid ``cfg.layers × cfg.data_sizes``; returns the rows and the CSV path.

    ``on_point(row)`` is called after each grid point is finished (also for skipped ones).
    """
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "sweep_config.yaml")
    pool, val = prepare(cfg)
    _write_validation(out, val)
    data_dir = out / "data"
    data_dir.mkdir(exist_ok=True)
    _write_subset(data_dir / "train_pool.jsonl", pool)

    rows: list[dict[str, Any]] = []
    grid = [(L, D) for L in sorted(cfg.layers) for D in sorted(cfg.data_sizes)]
    bar = tqdm(grid, desc="scaling sweep", disable=not cfg.show_progress, dynamic_ncols=True)
    for L, D in bar:
        bar.set_postfix(point=point_name(L, D))
        subset = data_dir / f"train_D{D}.jsonl"
        _write_subset(subset, pool[:D])
        run_dir = out / "points" / point_name(L, D)
        tc = point_train_config(cfg, L, D, subset, run_dir)
        chash = config_hash(tc)
        dhash = _examples_hash(pool[:D])
        _check_same_data(run_dir, dhash)
        t0 = time.perf_counter()
        row = _reuse_point(cfg, run_dir, tc, chash, dhash, val)
        if row is None:
            row = _train_point(cfg, L, D, run_dir, tc, chash, dhash, val, t0)
        rows.append(row)
        write_table(out / "results.csv", rows)
        if on_point is not None:
            on_point(row)
    table = write_table(out / "results.csv", rows)
    meta = run_metadata(cfg)
    write_json(out / "run.json", {"metrics": {"rows": rows, "validation": val.info}, **meta})
    return SweepResult(rows=rows, table=table, output_dir=out, validation=val.info)


__all__ = [
    "SweepConfig",
    "SweepResult",
    "ValidationSpec",
    "config_hash",
    "load_sweep_config",
    "point_train_config",
    "prepare",
    "run_sweep",
    "score_point",
]
