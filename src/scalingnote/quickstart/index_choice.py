"""The quick start's served index chosen among the routed structures (issue 52, item 3): the
cheapest method and setting reaching the recall target on validation queries within the memory
bound (:mod:`scalingnote.index.method_tune`), built with :func:`scalingnote.index.build_index` as
``scalingnote index build --method`` builds it, and served by default (its search defaults)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from scalingnote.errors import ScalingNoteError
from scalingnote.index import build_index, read_manifest, tower_identity
from scalingnote.index.embeddings import l2_normalize
from scalingnote.index.layout import record_tower_path
from scalingnote.index.method_tune import DEFAULT_METHODS, choose_method
from scalingnote.index.searcher import encode_queries_quietly
from scalingnote.index.tune import save_search_defaults
from scalingnote.models import load_tower
from scalingnote.quickstart.config import QuickstartConfig
from scalingnote.utils.steps import input_digest

def _split_tuning(texts: Any) -> tuple[list[str], list[str], str]:
    """(validation texts for the choice, training texts for the routers, how they were split). No
    validation queries: every other training query is held out for the choice."""
    val = list(getattr(texts, "validation", texts))
    train = list(getattr(texts, "train", []))
    if val:
        return val, train, "validation"
    return train[1::2], train[0::2], "training queries held out from the routers (no validation queries)"


def choose_and_build(cfg: QuickstartConfig, index_dir: Path, student_dir: Path, texts: Any, *, teacher_dir: Path, data: dict[str, Any],
                     digests: dict[str, Any], say: Callable[[str], None]) -> None:
    """Choose and build the served structure (issue 52): :func:`scalingnote.index.method_tune.choose_method`
    over the teacher's document vectors with the student's vectors of ``texts``' validation queries
    (the choice) and training queries (``ivf_qmetric``'s query metric); the chosen method is built
    into ``index_dir`` (kept when built from the same inputs) with its setting as the search
    defaults and the whole comparison as ``search_tuning``. The same target, teacher, student and
    queries again: nothing to do."""
    val, train, split = _split_tuning(texts)
    key = input_digest({"index_recall": cfg.index_recall, "student": str(student_dir), "teacher": str(teacher_dir), "digests": digests,
                        "validation": val, "train": train, "semantic_id_layers": cfg.semantic_id_layers, "seed": cfg.seed, "methods": list(DEFAULT_METHODS)})
    if (index_dir / "manifest.json").exists() and (read_manifest(index_dir).get("search_tuning") or {}).get("inputs_digest") == key:
        record_tower_path(index_dir, teacher_dir / "doc_tower")
        return
    emb = np.load(teacher_dir / "doc_embeddings.npy", mmap_mode="r")
    dim = int(emb.shape[1])
    docs = l2_normalize(np.asarray(emb, dtype=np.float32))
    tower = load_tower(student_dir)
    vq, tq = (_student_vectors(tower, t, dim) for t in (val, train))
    say(f"index: the structure chosen on {len(vq)} validation queries")
    console = Console(stderr=True, soft_wrap=True)

    def echo(line: str) -> None:  # whole lines (a rule would cut them), no rich markup
        console.print(line, markup=False, highlight=False)

    echo(f"{', '.join(DEFAULT_METHODS)}: the cheapest setting with recall@10 vs exact >= {cfg.index_recall} ({split}; {len(tq)} training queries fit the routers)")
    report = choose_method(docs, vq, tq if len(tq) else None, target=float(cfg.index_recall), seed=cfg.seed, log=echo)
    method = report["chosen"]["method"]
    ids = json.loads((teacher_dir / "doc_ids.json").read_text())
    build_index(emb, index_dir, method=method, routing=report["routing"], train_queries=tq if method == "ivf_qmetric" else None,
                doc_ids=ids, tower_info=tower_identity(load_tower(teacher_dir / "doc_tower")), seed=cfg.seed,
                semantic_ids_layers=cfg.semantic_id_layers, codebook_size=min(256, max(2, len(ids) // 40)),
                overwrite=True, reuse=True, progress=cfg.show_progress, documents=Path(data["beir"]))
    record_tower_path(index_dir, teacher_dir / "doc_tower")
    save_search_defaults(index_dir, report, inputs_digest=key, split=split)
    echo(f"index: {report['reason']}")


def _student_vectors(tower: Any, texts: list[str], dim: int) -> np.ndarray:
    """The student's unit query vectors of ``texts`` at the index's width (a Matryoshka prefix)."""
    if not texts:
        return np.zeros((0, dim), np.float32)
    q = np.asarray(encode_queries_quietly(tower, list(texts)), dtype=np.float32)
    if q.shape[1] < dim:
        raise ScalingNoteError(f"student query tower gives {q.shape[1]}-d vectors, the index is {dim}-d")
    return l2_normalize(np.ascontiguousarray(q[:, :dim]))


__all__ = ["choose_and_build"]
