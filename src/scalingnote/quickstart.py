"""The main job: ``scalingnote quickstart`` runs the whole ScalingNote pipeline end to end.

    data (synthetic note-search log -> triplets, or a BEIR directory)
      -> Stage I: ScalingDual (LLM query + LLM document towers)
      -> baselines: ScalingDoc (BERT query + LLM doc), TwinBERT (BERT + BERT)
      -> Stage II: QKD of the ScalingDual query tower into a BERT student (= ScalingNote)
      -> IVFPQ index over the frozen ScalingDual document embeddings, with semantic IDs
      -> evaluation table + the `scalingnote serve` command for the built artefacts.

Everything goes under one output directory; each step records completion, so a
re-run resumes instead of starting over (the training steps also resume from their
own checkpoints when interrupted). Sizes are reduced for a 2-core CPU: SmolLM2-135M
truncated to a few layers, short sequences, a few dozen optimiser steps.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from scalingnote.config import save_config
from scalingnote.utils import run_metadata, seed_everything, write_json

log = logging.getLogger(__name__)


@dataclass
class QuickstartConfig:
    out: str = "runs/quickstart"
    data: str | None = None  #: BEIR directory; None = generate the synthetic note-search log
    seed: int = 0
    llm: str = "smollm2-135m"
    llm_layers: int = 2
    #: SmolLM2 pooling: "mean" (not in the paper; a truncated, briefly trained decoder is at chance
    #: with the paper's placeholder pooling) or "placeholder" (§3.2)
    llm_pooling: str = "mean"
    bert: str = "minilm-l6"
    #: the ScalingNote query tower: MiniLM truncated to ``student_layers``; its embeddings are frozen
    #: and cached, its top ``student_trainable_layers`` layers train ("all": everything, the paper)
    student_layers: int = 2
    student_trainable_layers: int | Literal["all"] = 2
    dim: int = 128  #: embedding size (Matryoshka dims 16, 32, 64 ... up to it)
    synth_docs: int = 1500
    synth_queries: int = 800
    #: Stage I layers that train (every tower): 0 = heads over cached pooled states (the CPU recipe,
    #: see benchmarks/results/recipe_*.json), k = the top k layers over cached states, "all" = the
    #: paper's full fine-tuning (GPU)
    trainable_layers: int | Literal["all"] = 0
    #: Stage I runs up to ``max_epochs`` epochs (``steps``: an optional cap), validating every epoch
    #: on held-out training queries and stopping after ``patience`` epochs without improvement
    max_epochs: float = 40.0
    steps: int | None = None
    patience: int = 4
    batch_size: int = 64
    #: learning rates (backbone, projection) for methods with an LLM tower / for TwinBERT. Heads over
    #: cached features: 3e-3 won on SciFact validation queries (recipe benchmark). With full
    #: fine-tuning of a 2-layer SmolLM2 at batch 16, 3e-4 / 3e-3 collapsed the embeddings and
    #: 2e-5 / 1e-3 was stable but slow.
    llm_lr: float = 2e-5
    llm_head_lr: float = 3e-3
    bert_lr: float = 2e-5
    bert_head_lr: float = 3e-3
    micro_batch_size: int | None = None
    query_max_length: int = 32
    doc_max_length: int = 128
    #: QKD: up to ``qkd_epochs`` epochs, stopping after ``qkd_patience`` epochs without a better
    #: validation loss; "normalized" regresses the L2-normalised teacher embeddings ("raw": Eq. 15 as printed)
    qkd_epochs: float = 10.0
    qkd_patience: int = 3
    qkd_target: Literal["raw", "normalized"] = "normalized"
    qkd_batch_size: int = 128
    qkd_max_pseudo_queries: int = 3000
    index_factory: str | None = None  #: default: see :func:`default_factory`
    semantic_id_layers: int = 6
    rerank: int = 100
    nprobe: int = 16
    eval_split: str = "test"
    max_eval_queries: int | None = None
    #: also evaluate each Stage I method's starting point (pre-trained towers + centre + PCA head):
    #: the ``start_ndcg@10`` / ``start_r@100`` columns; costs one more corpus encoding per method
    evaluate_start: bool = False
    show_progress: bool = True


# ---------------------------------------------------------------------------- steps
def _done(path: Path) -> bool:
    return (path / "DONE").exists()


def _mark(path: Path, info: dict | None = None) -> None:
    write_json(path / "DONE", info or {})


def _step(title: str) -> None:
    from rich.console import Console

    Console(stderr=True).rule(f"[bold]{title}")


def prepare_data(cfg: QuickstartConfig, out: Path) -> dict[str, Any]:
    """Returns {"beir": dir, "triplets": path|None, "validation_triplets": path|None}."""
    if cfg.data:
        return {"beir": str(Path(cfg.data).resolve()), "triplets": None, "validation_triplets": None}
    d = out / "data"
    if not _done(d):
        _step("data: synthetic note-search log -> triplets (click/relevance, one-hop/multi-hop)")
        from scalingnote.data.build import load_build_config, run_build
        from scalingnote.data.synth import SynthConfig, synthesize

        synthesize(d, SynthConfig(seed=cfg.seed, num_docs=cfg.synth_docs, num_queries=cfg.synth_queries), progress=cfg.show_progress)
        res = run_build(load_build_config(d / "build.yaml"), progress=cfg.show_progress)
        _mark(d, {"triplets": res.stats if hasattr(res, "stats") else {}})
    return {"beir": str(d), "triplets": str(d / "triplets" / "train.jsonl"), "validation_triplets": str(d / "triplets" / "validation.jsonl")}


def stage1_config(cfg: QuickstartConfig, method: str, data: dict, out: Path):
    from scalingnote.config import load_config
    from scalingnote.training import TrainConfig

    if cfg.llm_pooling not in ("mean", "placeholder"):
        from scalingnote.errors import ConfigError

        raise ConfigError(None, None, "llm_pooling", f"must be 'mean' or 'placeholder', got {cfg.llm_pooling!r}")
    llm = {"model": cfg.llm, "num_layers": cfg.llm_layers, "pooling": "mean" if cfg.llm_pooling == "mean" else None}
    bert = {"model": cfg.bert}
    q, d = {"scaling_dual": (llm, llm), "scaling_doc": (bert, llm), "twinbert": (bert, bert)}[method]
    lr, head_lr = (cfg.bert_lr, cfg.bert_head_lr) if method == "twinbert" else (cfg.llm_lr, cfg.llm_head_lr)
    return load_config(
        TrainConfig,
        {
            "method": method,
            "output_dir": str(out / "stage1" / method),
            "dim": cfg.dim,
            "loss": {"dims": [m for m in (16, 32, 64) if m < cfg.dim] + [cfg.dim]},
            "query_tower": {**q, "max_length": cfg.query_max_length, "trainable_layers": cfg.trainable_layers},
            "doc_tower": {**d, "max_length": cfg.doc_max_length, "trainable_layers": cfg.trainable_layers},
            "data": {
                "data_dir": data["beir"],
                "triplets": data["triplets"],
                "validation_triplets": data["validation_triplets"],
                "eval_split": cfg.eval_split,
                "max_eval_queries": cfg.max_eval_queries,
                "eval_overlap": "drop",  # any BEIR set: never train on a test query (KUAKE-QTR reuses them)
            },
            "optim": {"batch_size": cfg.batch_size, "micro_batch_size": cfg.micro_batch_size, "max_steps": cfg.steps,
                      "epochs": cfg.max_epochs, "lr": lr, "head_lr": head_lr},
            "seed": cfg.seed,
            "feature_cache_dir": str(out / "features"),  # shared: ScalingDoc reuses ScalingDual's document features
            "center_samples": 100_000 if cfg.trainable_layers == 0 else 256,  # cached features make the head fit cheap
            "eval_every": "epoch",  # validation queries: held out from the training split / triplets
            "patience": cfg.patience,
            "save_every": 50,
            "evaluate_zero_shot": cfg.evaluate_start,
            "show_progress": cfg.show_progress,
        },
    )


def run_stage1(cfg: QuickstartConfig, method: str, data: dict, out: Path) -> dict[str, Any]:
    from scalingnote.training import train

    d = out / "stage1" / method
    if not _done(d):
        _step(f"Stage I: {method}")
        res = train(stage1_config(cfg, method, data, out), resume=True)
        _mark(d, res)
    return json.loads((d / "run.json").read_text())["metrics"]


def pseudo_queries(cfg: QuickstartConfig, data: dict, out: Path) -> str | None:
    """ICT pseudo-queries from the corpus: unlabelled queries for QKD."""
    d = out / "pseudo_ict"
    if not _done(d):
        _step("pseudo-queries (inverse cloze task) for QKD")
        from scalingnote.data.pseudo import ICTConfig, ict_queries

        ict_queries(Path(data["beir"]) / "corpus.jsonl", d, ICTConfig(seed=cfg.seed, max_docs=cfg.qkd_max_pseudo_queries), progress=cfg.show_progress)
        _mark(d)
    q = d / "queries.jsonl"
    return str(q) if q.exists() else None


def run_qkd(cfg: QuickstartConfig, data: dict, out: Path, pseudo: str | None) -> dict[str, Any]:
    from scalingnote.config import load_config
    from scalingnote.distill import DistillConfig, distill

    d = out / "qkd"
    if not _done(d):
        _step("Stage II: query-based knowledge distillation (QKD) -> ScalingNote")
        sources = [{"path": data["beir"]}]  # every logged/known query text (labels unused); eval queries are removed
        if pseudo:
            sources.append({"path": pseudo})
        dc = load_config(
            DistillConfig,
            {
                "teacher": str(out / "stage1" / "scaling_dual"),
                "output_dir": str(d),
                "student": {"model": cfg.bert, "num_layers": cfg.student_layers, "max_length": cfg.query_max_length,
                            "trainable_layers": cfg.student_trainable_layers if cfg.student_trainable_layers == "all"
                            else min(cfg.student_trainable_layers, cfg.student_layers)},
                "queries": sources,
                "optim": {"batch_size": cfg.qkd_batch_size, "epochs": cfg.qkd_epochs},
                "target": cfg.qkd_target,
                "patience": cfg.qkd_patience,
                "feature_cache_dir": str(out / "features"),  # the head-only teacher's cached query features
                "eval_data": data["beir"],
                "eval_split": cfg.eval_split,
                "seed": cfg.seed,
                "show_progress": cfg.show_progress,
            },
        )
        res = distill(dc, resume=True)
        _mark(d, res)
    return json.loads((d / "run.json").read_text())["metrics"]


def default_factory(n: int, dim: int) -> str:
    """IVF with ~4·sqrt(n) lists and 16 PQ sub-quantisers (32x compression of 128-d fp32 at 8 bits).

    Below 10k vectors the codes are 4-bit (64x): 8-bit PQ needs 256 centroids per sub-space,
    i.e. >= 9,984 training vectors for FAISS's 39-per-centroid rule."""
    nlist = max(4, min(4096, int(4 * math.sqrt(n))))
    m = 16 if dim % 16 == 0 else 8
    bits = 8 if n >= 10_000 else 4
    return f"IVF{nlist},PQ{m}x{bits}"


def build_ivfpq(cfg: QuickstartConfig, out: Path, data: dict[str, Any]) -> Path:
    from scalingnote.index import build_index, tower_identity
    from scalingnote.models import load_tower

    d = out / "index"
    if not _done(d):
        _step("index: IVFPQ over the ScalingDual document embeddings + residual-K-means semantic IDs")
        s1 = out / "stage1" / "scaling_dual"
        emb = np.load(s1 / "doc_embeddings.npy")
        ids = json.loads((s1 / "doc_ids.json").read_text())
        doc_tower = load_tower(s1 / "doc_tower")
        factory = cfg.index_factory or default_factory(len(ids), emb.shape[1])
        build_index(
            emb, d / "ivfpq", factory, doc_ids=ids, tower_info=tower_identity(doc_tower), seed=cfg.seed,
            semantic_ids_layers=cfg.semantic_id_layers, codebook_size=min(256, max(2, len(ids) // 40)),
            nprobe=cfg.nprobe, overwrite=True, progress=cfg.show_progress,
            documents=Path(data["beir"]),  # titles + snippets returned by search / serve
        )
        _mark(d, {"factory": factory})
    return d / "ivfpq"


# ---------------------------------------------------------------------------- evaluation
def query_qps(tower, texts: list[str], batch_size: int = 256, repeats: int = 1) -> float:
    """Queries/s of ``encode_queries`` (batch 256, the threads torch is set to)."""
    texts = (texts * math.ceil(512 / max(1, len(texts))))[:512]
    tower.encode_queries(texts[:batch_size], batch_size=batch_size, show_progress=False)  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        tower.encode_queries(texts, batch_size=batch_size, show_progress=False)
    return repeats * len(texts) / (time.perf_counter() - t0)


def _auc_labels(beir: Path, split: str) -> tuple[dict, int] | None:
    """Graded labels for AUC: qrels_graded/<split>.tsv (relevant = grade >= 2) or qrels with 0 grades."""
    from scalingnote.data import load_qrels

    g = beir / "qrels_graded" / f"{split}.tsv"
    if g.exists():
        return load_qrels(g), 2
    q = load_qrels(beir / "qrels" / f"{split}.tsv")
    grades = {v for docs in q.values() for v in docs.values()}
    return (q, 1) if any(v <= 0 for v in grades) and any(v > 0 for v in grades) else None


def _weighted_hybrid_row(out: Path, reported: set[str], st, d_emb: np.ndarray, ids: list[str], bm, dense_run, bm_run, qrels,
                         metrics: list[str]) -> dict[str, Any] | None:
    """Weighted fusion of the student's dense run and BM25, its norm and dense weight chosen on
    the queries Stage I held out (never the reported ones); None when Stage I held none out."""
    from scalingnote.evaluation import evaluate
    from scalingnote.evaluation.dense import exact_search, truncate_normalize
    from scalingnote.index.hybrid import choose_norm_and_weight, hybrid_search_run
    from scalingnote.training.driver import heldout_queries

    v_queries, v_qrels = heldout_queries(out / "stage1" / "scaling_dual", exclude=reported)
    if not v_queries:
        return None
    v_ids = sorted(v_queries)
    v_texts = [v_queries[q] for q in v_ids]
    dense_val = exact_search(truncate_normalize(st.encode_queries(v_texts, batch_size=256, show_progress=False)), v_ids, d_emb, ids, k=100)
    bm_val = bm.search(dict(zip(v_ids, v_texts)), k=100, show_progress=False)
    best, _ = choose_norm_and_weight(dense_val, bm_val, v_qrels)
    hyb, _ = hybrid_search_run(dense_run, bm_run, "weighted", k=100, weight=best.weight, norm=best.norm)
    return {"method": "scalingnote+bm25_weighted", "query_qps": None, **evaluate(hyb, qrels, metrics), "auc": None,
            "search": f"exact + bm25s, {best.norm} w_dense={best.weight} (chosen on {best.n_queries} held-out queries)"}


def evaluate_all(cfg: QuickstartConfig, data: dict, out: Path, index_dir: Path) -> list[dict[str, Any]]:
    """One row per method: query-tower params, query QPS, R@K, nDCG@10, AUC."""
    from scalingnote.data import load_beir
    from scalingnote.evaluation import evaluate, pair_auc
    from scalingnote.evaluation.dense import exact_search, truncate_normalize
    from scalingnote.index import DenseIndex
    from scalingnote.index.hybrid import hybrid_search_run
    from scalingnote.sparse.bm25 import BM25Retriever
    from scalingnote.models import load_tower

    beir = Path(data["beir"])
    ds = load_beir(beir, cfg.eval_split)
    qids = sorted(ds.queries)[: cfg.max_eval_queries] if cfg.max_eval_queries else sorted(ds.queries)
    qtexts = [ds.queries[q].text for q in qids]
    qrels = {q: ds.qrels[q] for q in qids}
    metrics = ["r@10", "r@100", "ndcg@10", "recall@100", "mrr@10"]
    auc_src = _auc_labels(beir, cfg.eval_split)
    rows: list[dict[str, Any]] = []

    def auc_of(q_emb: np.ndarray, d_emb: np.ndarray, doc_ids: list[str]) -> float | None:
        if auc_src is None:
            return None
        labels_q, thr = auc_src
        qi = {q: i for i, q in enumerate(qids)}
        di = {d: i for i, d in enumerate(doc_ids)}
        s, y = [], []
        for q, docs in labels_q.items():
            if q not in qi:
                continue
            for d, g in docs.items():
                if d in di:
                    s.append(float(q_emb[qi[q]] @ d_emb[di[d]]))
                    y.append(g)
        try:
            return pair_auc(s, y, threshold=thr)
        except Exception:
            return None

    # BM25 reference
    bm = BM25Retriever.fit(ds.corpus.values(), show_progress=False)
    t0 = time.perf_counter()
    run = bm_run = bm.search(dict(zip(qids, qtexts)), k=100, show_progress=False)
    rows.append({"method": "bm25", "query_tower": "-", "query_params": 0, "query_qps": round(len(qids) / (time.perf_counter() - t0), 1),
                 **evaluate(run, qrels, metrics), "auc": None, "search": "bm25s"})

    # zero-shot starting point of the BERT towers (native pooling, no projection)
    zq = load_tower(cfg.bert, "query", dim=None, max_query_length=cfg.query_max_length)
    zd = load_tower(cfg.bert, "document", dim=None, max_doc_length=cfg.doc_max_length)
    z_ids = list(ds.corpus)
    zd_emb = truncate_normalize(zd.encode_documents([ds.corpus[i] for i in z_ids], batch_size=64, show_progress=False))
    zq_emb = truncate_normalize(zq.encode_queries(qtexts, batch_size=256, show_progress=False))
    rows.append({"method": f"zero_shot_{cfg.bert}", "query_tower": f"{cfg.bert} ({zq.config.num_layers}L)", "query_params": zq.non_embedding_params,
                 "query_qps": round(query_qps(zq, qtexts), 1), **evaluate(exact_search(zq_emb, qids, zd_emb, z_ids, k=100), qrels, metrics),
                 "auc": auc_of(zq_emb, zd_emb, z_ids), "search": "exact"})
    del zd, zd_emb
    for method in ("twinbert", "scaling_doc", "scaling_dual"):
        s1 = out / "stage1" / method
        qt = load_tower(s1 / "query_tower")
        ids = json.loads((s1 / "doc_ids.json").read_text())
        d_emb = truncate_normalize(np.load(s1 / "doc_embeddings.npy"))
        q_emb = truncate_normalize(qt.encode_queries(qtexts, batch_size=256, show_progress=False))
        run = exact_search(q_emb, qids, d_emb, ids, k=100)
        m1 = json.loads((s1 / "run.json").read_text())["metrics"]
        start = {f"start_{k}": m1[f"zero_shot_{k}"] for k in ("ndcg@10", "r@100") if f"zero_shot_{k}" in m1}
        rows.append({"method": method, "query_tower": f"{qt.config.base_model} ({qt.config.num_layers}L)",
                     "query_params": qt.non_embedding_params, "query_qps": round(query_qps(qt, qtexts), 1),
                     **evaluate(run, qrels, metrics), "auc": auc_of(q_emb, d_emb, ids), "search": "exact", **start})
    # ScalingNote: the distilled student over the frozen ScalingDual document embeddings
    st = load_tower(out / "qkd" / "query_tower")
    s1 = out / "stage1" / "scaling_dual"
    ids = json.loads((s1 / "doc_ids.json").read_text())
    d_emb = truncate_normalize(np.load(s1 / "doc_embeddings.npy"))
    q_emb = truncate_normalize(st.encode_queries(qtexts, batch_size=256, show_progress=False))
    qps = round(query_qps(st, qtexts), 1)
    base = {"method": "scalingnote", "query_tower": f"{st.config.base_model} ({st.config.num_layers}L, QKD)", "query_params": st.non_embedding_params, "query_qps": qps}
    dense_run = exact_search(q_emb, qids, d_emb, ids, k=100)
    rows.append({**base, **evaluate(dense_run, qrels, metrics), "auc": auc_of(q_emb, d_emb, ids), "search": "exact"})
    # hybrid: reciprocal-rank fusion of the student's dense run and BM25 (needs no tuning);
    # query cost = dense encode + BM25, so its q/s is not reported as the student's alone
    hyb, info = hybrid_search_run(dense_run, bm_run, "rrf", k=100)
    rows.append({**base, "method": "scalingnote+bm25", "query_qps": None, **evaluate(hyb, qrels, metrics), "auc": None,
                 "search": f"exact + bm25s, rrf k={info['rrf_k']} depth={info['depth']}"})
    w_row = _weighted_hybrid_row(out, set(qids), st, d_emb, ids, bm, dense_run, bm_run, qrels, metrics)
    if w_row is not None:
        rows.append({**base, **w_row})
    idx = DenseIndex.open(index_dir, query_tower=st)
    res = idx.search(q_emb, k=100, nprobe=cfg.nprobe, rerank=cfg.rerank)
    rows.append({**base, "method": "scalingnote+ivfpq", **evaluate(res.to_run(qids), qrels, metrics), "auc": None,
                 "search": f"{idx.factory} nprobe={cfg.nprobe} rerank={cfg.rerank}"})
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    cols = ["method", "query_tower", "query_params", "query_qps", "r@10", "r@100", "ndcg@10", "auc", "search"]
    if any("start_ndcg@10" in r for r in rows):
        cols.insert(cols.index("auc"), "start_ndcg@10")
    t = Table(title="scalingnote quickstart: retrieval quality and query cost")
    for c in cols:
        t.add_column(c, justify="left" if c in ("method", "query_tower", "search") else "right")
    for r in rows:
        t.add_row(*[("-" if r.get(c) is None else f"{r[c]:.4f}" if isinstance(r[c], float) and c not in ("query_qps",) else
                     f"{r[c]/1e6:.1f}M" if c == "query_params" and r[c] else str(r[c])) for c in cols])
    Console(width=max(160, Console().width)).print(t)


def quickstart(cfg: QuickstartConfig) -> list[dict[str, Any]]:
    """Run (or resume) the whole pipeline; returns the results rows (also in ``results.json``)."""
    import torch

    out = Path(cfg.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "quickstart.yaml")
    seed_everything(cfg.seed)
    t0 = time.perf_counter()
    data = prepare_data(cfg, out)
    for method in ("scaling_dual", "scaling_doc", "twinbert"):
        run_stage1(cfg, method, data, out)
    pseudo = pseudo_queries(cfg, data, out)
    run_qkd(cfg, data, out, pseudo)
    index_dir = build_ivfpq(cfg, out, data)
    _step("evaluation")
    rows = evaluate_all(cfg, data, out, index_dir)
    elapsed = time.perf_counter() - t0
    write_json(out / "results.json", {"rows": rows, "elapsed_s": round(elapsed, 1), **run_metadata(cfg)})
    print_table(rows)
    print(f"\nall artefacts in {out} (this run: {elapsed / 60:.1f} min, torch threads {torch.get_num_threads()})")
    print("serve the distilled query tower over the compressed index:")
    print(f"  scalingnote serve --index {out / 'index' / 'ivfpq'} --query-tower {out / 'qkd' / 'query_tower'} --port 8080")
    return rows


__all__ = ["QuickstartConfig", "quickstart"]
