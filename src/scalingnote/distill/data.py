"""Stage II's training data: the queries collected from every source (minus evaluation and
the teacher's validation queries), their cached Stage I teacher embeddings (ScalingNote §3.3,
Eq. 15's targets) and the train / validation split."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from scalingnote.data import load_qrels, load_queries
from scalingnote.data.beir import qrels_path
from scalingnote.distill.cache import TeacherCache, build_teacher_cache, open_teacher_cache
from scalingnote.distill.config import DistillConfig, QuerySource
from scalingnote.distill.ranking import TeacherRanking, teacher_ranking
from scalingnote.errors import ScalingNoteError
from scalingnote.models import PrefixTower, load_tower
from scalingnote.training import distributed
from scalingnote.training.evaluate import heldout_queries

log = logging.getLogger(__name__)


def _norm_text(t: str) -> str:
    return " ".join(t.lower().split())


def collect_queries(
    sources: list[QuerySource], exclude: dict[str, tuple[set[str], set[str]]]
) -> tuple[list[str], list[str], dict[str, int]]:
    """Unique (id, text) from every source, minus each named set of ``exclude`` = {name: (ids,
    normalised texts)} (the evaluation queries, the teacher's validation queries), counted as
    ``dropped_<name>``. Ids are prefixed by the source index when two sources collide."""
    ids: list[str] = []
    texts: list[str] = []
    seen_text: set[str] = set()
    stats: dict[str, int] = {**{f"dropped_{name}": 0 for name in exclude}, "dropped_duplicate": 0}
    for si, src in enumerate(sources):
        p = Path(src.path)
        if p.is_dir():
            qs = load_queries(p / "queries.jsonl")
            if src.split:
                keep = load_qrels(qrels_path(p, src.split), qs.keys())
                items = [(q, qs[q].text) for q in qs if q in keep]
            else:
                items = [(q.id, q.text) for q in qs.values()]
        else:
            items = [(q.id, q.text) for q in load_queries(p).values()]
        if src.max_queries is not None:
            items = items[: src.max_queries]
        n_before = len(ids)
        for qid, text in items:
            nt = _norm_text(text)
            hit = next((name for name, (x_ids, x_texts) in exclude.items() if qid in x_ids or nt in x_texts), None)
            if hit is not None:
                stats[f"dropped_{hit}"] += 1
                continue
            if nt in seen_text:
                stats["dropped_duplicate"] += 1
                continue
            seen_text.add(nt)
            ids.append(f"s{si}:{qid}")
            texts.append(text)
        stats[f"source{si}:{p.name}"] = len(ids) - n_before
    if not ids:
        raise ScalingNoteError("distill: no training queries left after removing evaluation queries")
    return ids, texts, stats


def teacher_holdout(teacher_dir: str | Path) -> tuple[set[str], set[str]] | None:
    """(ids, normalised texts) of the teacher run's held-out validation queries, or None for a
    teacher directory without a Stage I config (nothing is known to be held out)."""

    if not (Path(teacher_dir) / "config.yaml").exists():
        log.info("%s: no config.yaml, so no validation queries of the teacher to hold out of QKD", teacher_dir)
        return None
    texts, _ = heldout_queries(teacher_dir)
    return set(texts), {_norm_text(t) for t in texts.values()}


def load_stage1(teacher_dir: str | Path):
    t = Path(teacher_dir)
    for need in ("query_tower", "doc_embeddings.npy", "doc_ids.json"):
        if not (t / need).exists():
            raise ScalingNoteError(
                f"{t}: not a Stage I output directory (missing {need}); run `scalingnote train` first"
            )
    return load_tower(t / "query_tower")


@dataclass
class QKDData:
    """What Stage II trains on: the cached teacher targets of the collected queries, the
    train / validation split, and where it came from."""

    texts: list[str]
    targets: np.ndarray  #: [n, dim] float32, Eq. 15's q_i (L2-normalised with ``target: normalized``)
    train_idx: np.ndarray
    val_idx: np.ndarray
    compat_id: str  #: the Stage I document tower's compat id (the student inherits it)
    query_stats: dict[str, int]
    eval_queries: dict[str, str]
    eval_qrels: dict | None
    ranking: TeacherRanking | None = None  #: the teacher's top-k documents per query (``rank_weight > 0``)
    #: [n] int32 token count of every text under the student's tokenizer (``length_buckets``; None =
    #: not measured): counted once per run by :func:`token_lengths`, never per step
    lengths: np.ndarray | None = None

    @property
    def dim(self) -> int:
        return int(self.targets.shape[1])


def prepare_data(cfg: DistillConfig) -> QKDData:
    """Collect the training queries (minus evaluation queries), encode them once with the frozen
    Stage I query tower into the teacher cache (rank 0 only under torchrun; the other ranks read
    it after a barrier and never load the LLM), and split off the validation queries."""
    out = Path(cfg.output_dir)
    eval_qrels, eval_queries = None, {}
    if cfg.eval_data:
        qs = load_queries(Path(cfg.eval_data) / "queries.jsonl")
        eval_qrels = load_qrels(qrels_path(cfg.eval_data, cfg.eval_split), qs.keys())
        eval_queries = {q: qs[q].text for q in eval_qrels}
    held = teacher_holdout(cfg.teacher) if cfg.exclude_teacher_validation else None
    ids, texts, qstats = collect_queries(
        cfg.queries,
        {
            "eval": (set(eval_queries), {_norm_text(t) for t in eval_queries.values()}),
            "teacher_validation": held or (set(), set()),
        },
    )
    root = Path(cfg.cache_dir) if cfg.cache_dir else out / "teacher_cache"
    cache = _build_cache(cfg, ids, texts, root) if distributed.rank() == 0 else None
    distributed.barrier()
    if cache is None:
        cache = open_teacher_cache(root)
    if cache.ids != ids:
        raise ScalingNoteError(
            f"{root}: the teacher cache holds another query set than this run collected; use a new cache_dir"
        )
    targets = np.asarray(cache.emb, dtype=np.float32)
    if cfg.target == "normalized":
        targets = targets / np.maximum(np.linalg.norm(targets, axis=1, keepdims=True), 1e-12)
    perm = np.random.default_rng(cfg.seed).permutation(len(cache))
    n_val = int(round(len(cache) * cfg.validation_fraction)) if len(cache) > 10 else 0
    ranking = teacher_ranking(cfg.teacher, targets, cfg.rank_k) if cfg.rank_weight > 0 else None
    return QKDData(
        list(cache.texts),
        targets,
        np.sort(perm[n_val:]),
        np.sort(perm[:n_val]),
        cache.meta["compat_id"],
        qstats,
        eval_queries,
        eval_qrels,
        ranking,
    )


def token_lengths(student, texts: list[str], chunk: int = 4096) -> np.ndarray:
    """[n] int32 token count of each text as the student's forward pass sees it (special tokens
    included, truncated to its query length): what a batch is padded to the longest of."""
    out = np.empty(len(texts), dtype=np.int32)
    for i in range(0, len(texts), chunk):
        out[i : i + chunk] = [len(ids) for ids in student.query_ids(texts[i : i + chunk])]
    return out


def forward_batch(cfg: DistillConfig) -> int:
    """The no-grad forward batch of the teacher cache and the head fits: ``teacher_batch_size``
    on a GPU, at most ``cpu_batch_size`` on a CPU (smaller length-sorted batches run faster there)."""
    return cfg.teacher_batch_size if torch.cuda.is_available() else min(cfg.teacher_batch_size, cfg.cpu_batch_size)


def _build_cache(cfg: DistillConfig, ids: list[str], texts: list[str], root: Path) -> TeacherCache:
    teacher = load_stage1(cfg.teacher)
    encode = None
    if cfg.feature_cache_dir:
        # a head-only (trainable_layers: 0) teacher: its pooled states may already be cached by Stage I
        t_prefix = PrefixTower(
            teacher, 0, cfg.feature_cache_dir, batch_size=forward_batch(cfg), show_progress=cfg.show_progress
        )

        def encode(xs: list[str]) -> np.ndarray:
            return t_prefix.encode(xs, normalize=False, batch_size=max(256, cfg.teacher_batch_size))

    cache = build_teacher_cache(
        teacher, ids, texts, root, batch_size=forward_batch(cfg), show_progress=cfg.show_progress, encode=encode
    )
    del teacher, encode  # the LLM is not needed any more: give its GPU memory back before the student trains
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return cache
