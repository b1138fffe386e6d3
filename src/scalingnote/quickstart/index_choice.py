"""The quick start's served index chosen among the routed structures: the
cheapest method and setting reaching the recall target on validation queries within the memory
bound (:mod:`scalingnote.index.routing.method_tune`), built with :func:`scalingnote.index.build_index` as
``scalingnote index build --method`` builds it, and served by default (its search defaults)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from scalingnote.data.jsonl import iter_jsonl
from scalingnote.errors import ScalingNoteError
from scalingnote.index import DenseIndex, build_index, read_manifest, tower_identity
from scalingnote.index.embeddings import l2_normalize
from scalingnote.index.faiss.methods import default_routing, query_edge_variants, sq_graph_ratio
from scalingnote.index.layout import record_tower_path
from scalingnote.index.routing.head_to_head import ALPHA, MIN_GAIN
from scalingnote.index.routing.method_tune import (
    DEFAULT_METHODS,
    EF_SEARCHES,
    LATENCY_TIE,
    MEMORY_BOUND,
    MEMORY_BOUND_ABOVE,
    RERANKS,
    choose_method,
    fitting_queries,
    memory_bound_for,
)
from scalingnote.index.routing.routing import RoutingConfig
from scalingnote.index.searcher import encode_queries_quietly
from scalingnote.index.tune import save_search_defaults, tune_search
from scalingnote.models import load_tower
from scalingnote.quickstart import runs
from scalingnote.quickstart.config import QuickstartConfig
from scalingnote.quickstart.runs import banner, mark_done, step_digest, step_done
from scalingnote.quickstart.step_markers import out_relative
from scalingnote.utils.steps import input_digest


def _split_tuning(texts: Any) -> tuple[list[str], list[str], str]:
    """(validation texts for the choice, training texts for the routers, how they were split). No
    validation queries: every other training query is held out for the choice."""
    val = list(getattr(texts, "validation", texts))
    train = list(getattr(texts, "train", []))
    if val:
        return val, train, "validation"
    return train[1::2], train[0::2], "training queries held out from the routers (no validation queries)"


def _choice_digest(
    cfg: QuickstartConfig,
    student_dir: Path,
    teacher_dir: Path,
    digests: dict[str, Any],
    val: list[str],
    train: list[str],
    pseudo: list[str],
    sizes: dict[str, RoutingConfig | list[RoutingConfig]],
) -> str:
    """The digest of what the structure is chosen from: the target, the towers, the queries, the
    candidates' sizes and the swept grid (a change of any chooses again). Paths under the run's output
    are written from it (``$OUT``): a run moved or copied whole keeps its choice."""
    return input_digest(
        out_relative(
            student_dir,
            {
                "index_recall": cfg.index_recall,
                "student": str(student_dir),
                "teacher": str(teacher_dir),
                "digests": digests,
                "validation": val,
                "train": train,
                "semantic_id_layers": cfg.semantic_id_layers,
                "seed": cfg.seed,
                "pseudo": pseudo,
                "methods": {
                    m: ([dataclasses.asdict(v) for v in c] if isinstance(c, (list, tuple)) else dataclasses.asdict(c))
                    for m, c in sizes.items()
                },
                "grid": {"ef": EF_SEARCHES, "rerank": RERANKS},
                "memory_bound": {"bound": MEMORY_BOUND, "above": MEMORY_BOUND_ABOVE},
                # how close latencies are told apart (a changed rule chooses again)
                "latency_rule": {"band": LATENCY_TIE, "paired": "wilcoxon", "alpha": ALPHA, "min_gain": MIN_GAIN},
            },
        )
    )


def choose_and_build(
    cfg: QuickstartConfig,
    index_dir: Path,
    student_dir: Path,
    texts: Any,
    *,
    teacher_dir: Path,
    data: dict[str, Any],
    digests: dict[str, Any],
    say: Callable[[str], None],
) -> None:
    """Choose and build the served structure: :func:`scalingnote.index.routing.method_tune.choose_method`
    over the teacher's document vectors with the student's vectors of ``texts``' validation queries
    (the choice), training queries (``ivf_qmetric``'s query metric) and, where ``hnsw_sq_qg`` / ``hnsw_lean`` can
    fit the memory bound, QKD's pseudo-queries (their edges and hnsw_lean's projection, with the training queries);
    the chosen method is built
    into ``index_dir`` (kept when built from the same inputs) with its setting as the search
    defaults and the whole comparison as ``search_tuning``. The same target, teacher, student and
    queries again: nothing to do."""
    val, train, split = _split_tuning(texts)
    emb = np.load(teacher_dir / "doc_embeddings.npy", mmap_mode="r")
    n, dim = int(emb.shape[0]), int(emb.shape[1])
    # the candidates' sizes and the swept grid too: a change of either chooses again
    sizes: dict[str, RoutingConfig | list[RoutingConfig]] = {
        m: default_routing(m, n, dim, seed=cfg.seed) for m in DEFAULT_METHODS
    }
    guided = [default_routing(m, n, dim, seed=cfg.seed) for m in ("hnsw_sq_qg", "hnsw_lean")]
    fits = [g for g in guided if _graph_fits(g, n, dim)]
    pseudo = _edge_pseudo_queries(cfg, data, index_dir.parent.parent, fits, n, dim)
    for g in fits if pseudo else []:
        # hnsw_sq_qg: 16 and, where the graph has room (M=32: 576-d and up), 32 edges per document
        variants = query_edge_variants(g)
        sizes[g.method] = variants if len(variants) > 1 else g  # one variant: the same inputs digest as before
    key = _choice_digest(cfg, student_dir, teacher_dir, digests, val, train, pseudo, sizes)
    if (index_dir / "manifest.json").exists() and (read_manifest(index_dir).get("search_tuning") or {}).get(
        "inputs_digest"
    ) == key:
        record_tower_path(index_dir, teacher_dir / "doc_tower")
        return
    docs = l2_normalize(np.asarray(emb, dtype=np.float32))
    tower = load_tower(student_dir)
    vq, tq = (student_vectors(tower, t, dim) for t in (val, train))
    eq = np.concatenate([tq, student_vectors(tower, pseudo, dim)]) if pseudo else None
    say(f"index: the structure chosen on {len(vq)} validation queries")
    console = Console(stderr=True, soft_wrap=True)

    def echo(line: str) -> None:  # whole lines (a rule would cut them), no rich markup
        console.print(line, markup=False, highlight=False)

    edges = f"; the query-guided graphs' edges also fit on {len(pseudo)} pseudo-queries" if pseudo else ""
    echo(
        f"{', '.join(sizes)}: the cheapest setting with recall@10 vs exact >= {cfg.index_recall} "
        f"({split}; {len(tq)} training queries fit the routers{edges})"
    )
    assert cfg.index_recall is not None  # callers choose the structure only for a recall target
    report = choose_method(
        docs,
        vq,
        tq if len(tq) else None,
        methods=tuple(sizes),
        target=float(cfg.index_recall),
        seed=cfg.seed,
        routing=sizes,
        log=echo,
        edge_queries=eq,
    )
    method = report["chosen"]["method"]
    ids = json.loads((teacher_dir / "doc_ids.json").read_text())
    build_index(
        emb,
        index_dir,
        method=method,
        routing=report["routing"],
        train_queries=fitting_queries(method, tq, eq),
        doc_ids=ids,
        tower_info=tower_identity(load_tower(teacher_dir / "doc_tower")),
        seed=cfg.seed,
        semantic_ids_layers=cfg.semantic_id_layers,
        codebook_size=min(256, max(2, len(ids) // 40)),
        overwrite=True,
        reuse=True,
        progress=cfg.show_progress,
        documents=Path(data["beir"]),
    )
    record_tower_path(index_dir, teacher_dir / "doc_tower")
    save_search_defaults(index_dir, report, inputs_digest=key, split=split)
    echo(f"index: {report['reason']}")


def _edge_pseudo_queries(
    cfg: QuickstartConfig, data: dict[str, Any], out: Path, graphs: Any, n: int, dim: int
) -> list[str]:
    """The pseudo-queries the query-guided graphs (``graphs``: ``hnsw_sq_qg`` / ``hnsw_lean`` configs, or one)
    are fitted on besides the training queries: QKD's unlabelled pool (ICT pseudo-queries + corpus titles and
    sentences, :func:`runs.pseudo_queries`, already made for Stage II). Empty — no such graph is a candidate —
    when the corpus is held to the memory bound (above 100k documents) and none of the graphs can fit it at
    this width (128-d: M=8 is the floor and takes 0.28 of the floats with 4-bit codes) or when
    QKD's pool is off (``qkd_max_pseudo_queries`` 0 and ``qkd_corpus_texts`` 0)."""
    if not any(_graph_fits(g, n, dim) for g in (graphs if isinstance(graphs, (list, tuple)) else [graphs])):
        return []
    texts: list[str] = []
    for path in runs.pseudo_queries(cfg, data, out):
        texts += [str(rec.get("text") or "") for _, rec in iter_jsonl(path)]
    return [t for t in texts if t.strip()]


def _graph_fits(g: RoutingConfig, n: int, dim: int) -> bool:
    """Whether a query-guided graph's config fits the memory bound ``n`` documents are held to."""
    bound = memory_bound_for(n)
    return bound is None or sq_graph_ratio(g, dim) <= bound


def student_vectors(tower: Any, texts: list[str], dim: int) -> np.ndarray:
    """The student's unit query vectors of ``texts`` at the index's width (a Matryoshka prefix)."""
    if not texts:
        return np.zeros((0, dim), np.float32)
    q = np.asarray(encode_queries_quietly(tower, list(texts)), dtype=np.float32)
    if q.shape[1] < dim:
        raise ScalingNoteError(f"student query tower gives {q.shape[1]}-d vectors, the index is {dim}-d")
    return l2_normalize(np.ascontiguousarray(q[:, :dim]))


# ---------------------------------------------------------------------------- the index step (was in runs.py)
def default_factory(n: int, dim: int) -> str:
    """IVF with ~4·sqrt(n) lists, at most n/39 (FAISS's 39 training points per centroid), and one PQ
    sub-quantiser per 8 dimensions (32x compression of fp32 at 8 bits, whatever the width: 16 for
    128-d, 48 for MiniLM's 384-d, 72 for SmolLM2's 576-d). A fixed 16 left 36 dimensions to one
    byte at 576-d, and exact re-ranking of 1,600 candidates then missed the 0.99 recall target
    on KUAKE-QTR that 72 reaches at 400 (ScalingNote §3.5 serves from the compressed index).

    Below 10k vectors the codes are 4-bit (64x): 8-bit PQ needs 256 centroids per sub-space,
    i.e. >= 9,984 training vectors for the same rule."""
    nlist = max(4, min(4096, int(4 * math.sqrt(n)), n // 39))
    m = max(k for k in range(1, max(1, dim // 8) + 1) if dim % k == 0)  # FAISS: m must divide dim
    bits = 8 if n >= 10_000 else 4
    return f"IVF{nlist},PQ{m}x{bits}"


def build_ivfpq(
    cfg: QuickstartConfig,
    out: Path,
    data: dict[str, Any],
    teacher_dir: Path,
    student_dir: Path | None = None,
    tune_queries: Any = None,
) -> Path:
    """The served index over the teacher's document embeddings (+ residual-K-means semantic IDs).

    With ``cfg.index_recall``, a student and ``tune_queries`` (:class:`~scalingnote.quickstart.scoring.TuningTexts`:
    validation + training queries, never test) and no fixed ``cfg.index_factory``, the structure
    itself is chosen (:func:`tune_index`): the fastest method (ivf, ivf_qmetric, ivf_rabitq, hnsw_pq,
    hnsw_sq, ivf_pqfs, scann_soar, svs_vamana, hnsw_sq_qg and hnsw_lean where their graphs fit) and setting reaching the
    recall target on the validation queries (within 1/4 of the float vectors' memory above 100k
    documents), built and served by default. Otherwise the IVFPQ
    ``cfg.index_factory`` (default :func:`default_factory`), its nprobe / re-rank tuned on the queries
    when given.
    The directory stays ``<out>/index/ivfpq`` whatever the method (the printed serve commands)."""
    d = out / "index"
    if cfg.index_recall is not None and student_dir is not None and tune_queries and not cfg.index_factory:
        tune_index(cfg, d / "ivfpq", Path(student_dir), tune_queries, teacher_dir=teacher_dir, data=data)
        return d / "ivfpq"
    emb = np.load(teacher_dir / "doc_embeddings.npy", mmap_mode="r")
    factory = cfg.index_factory or default_factory(emb.shape[0], emb.shape[1])
    inputs = {
        "teacher": str(teacher_dir),
        "teacher_digest": step_digest(teacher_dir),
        "factory": factory,
        "semantic_id_layers": cfg.semantic_id_layers,
        "nprobe": cfg.nprobe,
        "seed": cfg.seed,
    }
    if not step_done(d, inputs):
        banner("index: IVFPQ over the teacher's document embeddings + residual-K-means semantic IDs")
        ids = json.loads((teacher_dir / "doc_ids.json").read_text())
        build_index(
            emb,
            d / "ivfpq",
            factory,
            doc_ids=ids,
            tower_info=tower_identity(load_tower(teacher_dir / "doc_tower")),
            seed=cfg.seed,
            semantic_ids_layers=cfg.semantic_id_layers,
            codebook_size=min(256, max(2, len(ids) // 40)),
            nprobe=cfg.nprobe,
            overwrite=True,
            progress=cfg.show_progress,
            documents=Path(data["beir"]),  # titles + snippets returned by search / serve
        )
        mark_done(d, inputs, {"factory": factory})
    else:  # a reused index whose manifest may not name its tower's directory: record it (a no-op when named)
        record_tower_path(d / "ivfpq", teacher_dir / "doc_tower")
    if cfg.index_recall is not None and student_dir is not None and tune_queries:
        _tune_settings(cfg, d / "ivfpq", Path(student_dir), list(tune_queries))
    return d / "ivfpq"


def _tune_settings(cfg: QuickstartConfig, index_dir: Path, student_dir: Path, texts: list[str]) -> None:
    """A fixed ``index_factory``: choose its nprobe / re-rank depth
    (:func:`scalingnote.index.tune.tune_search`) on ``texts``."""
    key = input_digest(
        out_relative(
            student_dir,
            {
                "index_recall": cfg.index_recall,
                "student": str(student_dir),
                "student_digest": step_digest(student_dir.parent),
                "queries": texts,
            },
        )
    )
    if (read_manifest(index_dir).get("search_tuning") or {}).get("inputs_digest") == key:
        return
    assert cfg.index_recall is not None  # callers tune only for a recall target
    idx = DenseIndex.open(index_dir, query_tower=load_tower(student_dir))
    report = tune_search(idx, idx.query_vectors(texts), k=10, target=float(cfg.index_recall))
    save_search_defaults(index_dir, report, inputs_digest=key)
    banner(f"index search settings: {report['reason']}")


def tune_index(
    cfg: QuickstartConfig, index_dir: Path, student_dir: Path, texts: Any, *, teacher_dir: Path, data: dict[str, Any]
) -> None:
    """Choose and build the served structure (:func:`~scalingnote.quickstart.index_choice.choose_and_build`):
    the cheapest method and setting reaching ``cfg.index_recall`` on ``texts``' validation queries, built
    into ``index_dir``."""
    choose_and_build(
        cfg,
        index_dir,
        student_dir,
        texts,
        teacher_dir=teacher_dir,
        data=data,
        digests={"student": step_digest(student_dir.parent), "teacher": step_digest(teacher_dir)},
        say=banner,
    )


__all__ = ["build_ivfpq", "choose_and_build", "default_factory", "student_vectors", "tune_index"]
