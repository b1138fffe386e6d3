"""The quick start's Stage II steps: the unlabelled query sources (pseudo-queries, corpus text) and
the QKD of a teacher into a small query tower, each a step (:mod:`scalingnote.quickstart.step_markers`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scalingnote.config import load_config
from scalingnote.data.pseudo import ICTConfig, corpus_texts, ict_queries
from scalingnote.distill import DistillConfig, distill
from scalingnote.models.layers import start_candidates
from scalingnote.models.loading import resolve_source
from scalingnote.quickstart.config import Family, QuickstartConfig
from scalingnote.quickstart.run_data import corpus_file, data_fingerprint
from scalingnote.quickstart.step_markers import banner, mark_done, on_gpu, step_digest, step_done, step_inputs
from scalingnote.training import TrainConfig


def tower_config(tower_dir: str | Path) -> dict[str, Any]:
    """A saved tower's config (its ``tower.json``), read without loading the tower."""
    return json.loads((Path(tower_dir) / "tower.json").read_text(encoding="utf-8"))["config"]


def pseudo_queries(cfg: QuickstartConfig, data: dict, out: Path) -> list[str]:
    """QKD's unlabelled query sources from the corpus: ICT pseudo-queries and (``qkd_corpus_texts``)
    a sample of its titles and sentences. Returns the ``queries.jsonl`` paths."""
    corpus = corpus_file(data)
    d = out / "pseudo_ict"
    inputs = {"max_docs": cfg.qkd_max_pseudo_queries, "seed": cfg.seed, "data": data_fingerprint(data)}
    if not step_done(d, inputs):
        banner("pseudo-queries (inverse cloze task) for QKD")
        ict_queries(
            corpus, d, ICTConfig(seed=cfg.seed, max_docs=cfg.qkd_max_pseudo_queries), progress=cfg.show_progress
        )
        mark_done(d, inputs)
    sources = [d / "queries.jsonl"]
    if cfg.qkd_corpus_texts:
        t = out / "corpus_texts"
        inputs = {"max_texts": cfg.qkd_corpus_texts, "seed": cfg.seed, "data": data_fingerprint(data)}
        if not step_done(t, inputs):
            banner(f"corpus text for QKD (titles and sentences, up to {cfg.qkd_corpus_texts})")
            corpus_texts(corpus, t, cfg.qkd_corpus_texts, seed=cfg.seed)
            mark_done(t, inputs)
        sources.append(t / "queries.jsonl")
    return [str(q) for q in sources if q.exists()]


def student_base(fam: Family, teacher_dir: Path, layers: list[int]) -> str:
    """Where a student of the teacher's family starts: the teacher's own backbone when training
    changed any of the ``layers`` it keeps, else the pre-trained model (identical there)."""
    cfg_file = teacher_dir / "config.yaml"
    if not (teacher_dir / "run.json").exists() or "zero_shot" in teacher_dir.name or not cfg_file.exists():
        return fam.model
    tc = tower_config(teacher_dir / "query_tower")
    if tc.get("base_model") != resolve_source(fam.model).name:  # another family's teacher
        return fam.model
    k, n = load_config(TrainConfig, cfg_file).query_tower.trainable_layers, int(tc["num_layers"])
    trained = set(range(n)) if k == "all" else set(range(n - int(k), n))
    return str(teacher_dir / "query_tower" / "backbone") if trained & set(layers) else fam.model


def layer_pool(large_dir: str | Path) -> int:
    """How many layers a family's large tower (a Stage I run directory) has: what its students'
    layers are chosen from."""
    return int(tower_config(Path(large_dir) / "query_tower")["num_layers"])


def qkd_name(student_family: str, layers: int, teacher: str, rank_weight: float) -> str:
    """``bert2_from_bert_rw1``: the QKD step of a student (family, size) of a teacher family at one
    listwise weight."""
    return f"{student_family}{layers}_from_{teacher}_rw{rank_weight:g}"


def run_qkd(
    cfg: QuickstartConfig,
    name: str,
    teacher_dir: Path,
    fam: Family,
    layers: int,
    data: dict,
    out: Path,
    pseudo: list[str],
    *,
    rank_weight: float,
    pool: int | None = None,
    deadline: float | None = None,
    min_steps: int = 0,
) -> dict[str, Any]:
    """QKD of ``teacher_dir`` into a ``layers``-layer student of ``fam``, starting from the layers of
    its ``pool``-layer large tower that validate best (``cfg.student_layers``). ``deadline``: its
    time box (a ``time.monotonic()`` instant; the steps re-planned to it, never below ``min_steps``)."""
    d = out / "qkd" / name
    sources = [{"path": data["beir"]}]  # every logged/known query text (labels unused); eval queries are removed
    sources += [{"path": p} for p in pseudo]
    cands = start_candidates(layers, pool) if cfg.student_layers == "choose" and pool else [list(range(layers))]
    student = {
        "model": student_base(fam, teacher_dir, sorted({i for c in cands for i in c})),
        "num_layers": layers,
        "max_length": cfg.query_max_length,
        "trainable_layers": layers,
    }  # embeddings frozen (run live, not cached), every layer trains
    if fam.pooling:
        student["pooling"] = fam.pooling
    dc = load_config(
        DistillConfig,
        {
            "teacher": str(teacher_dir),
            "output_dir": str(d),
            "student": student,
            "queries": sources,
            "optim": {
                "batch_size": cfg.qkd_batch_size,
                "epochs": cfg.qkd_epochs,
                "max_steps": cfg.qkd_step_cap(on_gpu()),
                "lr": cfg.qkd_lr_for(fam.name),
            },
            "target": cfg.qkd_target,
            "patience": cfg.qkd_patience,
            "rank_weight": rank_weight,
            "length_buckets": cfg.qkd_length_buckets,
            "feature_cache_dir": str(
                Path(cfg.out).resolve() / "features"
            ),  # the head-only teacher's cached query features
            "eval_data": data["beir"],
            "eval_split": cfg.eval_split,
            "seed": cfg.seed,
            "show_progress": cfg.show_progress,
            "precision": cfg.precision,
            "student_dropout": cfg.qkd_dropout,
            "student_layer_candidates": cands if len(cands) > 1 else None,
        },
    )
    inputs = step_inputs(dc, data=data_fingerprint(data), teacher=step_digest(teacher_dir))
    if not step_done(d, inputs):
        banner(f"Stage II: QKD {name}")
        distill(dc, resume=True, on_change="redo", deadline=deadline, min_steps=min_steps)
        mark_done(d, inputs)
    return dict(json.loads((d / "run.json").read_text())["metrics"], run_dir=str(d))


__all__ = ["layer_pool", "pseudo_queries", "qkd_name", "run_qkd", "student_base", "tower_config"]
