"""The CPU training recipe, measured (issue: Stage I and II that actually learn on CPU).

    python -m benchmarks.recipe --data scifact [--phase features|all]
    python -m benchmarks.recipe --data kuake_qtr --depths 2,4,8

Recipe: cached frozen-prefix training (``trainable_layers: 0`` for Stage I: heads over cached
pooled states), heads initialised from the training pairs, epochs with early stopping on
validation nDCG@10 (validation queries carved from the training split), BM25 hard negatives,
the head learning rate chosen on validation; QKD students trained (all layers: queries are
short) until the validation loss plateaus, on normalised teacher embeddings.

Phase ``features`` only fills the feature caches (one pass of SmolLM2 at the deepest depth fills
every shallower depth). Rows: see ``METHODS``; columns ``ndcg@10``, ``r@100``, ``recall@100``,
``start_ndcg@10`` (the initialised heads before training), ``query_qps``, ``trainable_layers``,
``train_seconds``, ``teacher``. Full test split, full corpus.
Writes benchmarks/results/recipe_<data>.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks._common import REPO_ROOT, shared_data_dir

QUERY_MAX = 64
DOC_MAX = 256
LLM = "smollm2-135m"
BERT = "minilm-l6"


def work_dir(data: str) -> Path:
    return REPO_ROOT / "runs" / "recipe" / data


def pseudo_queries_path(data: str, seed: int) -> Path:
    """ICT pseudo-queries over the corpus (unlabelled queries for QKD), made once."""
    from scalingnote.data.pseudo import ICTConfig, ict_queries

    d = work_dir(data) / "pseudo_ict"
    q = d / "queries.jsonl"
    if not q.exists():
        ict_queries(shared_data_dir() / data / "corpus.jsonl", d, ICTConfig(seed=seed), progress=True)
    return q


def all_query_texts(data: str, seed: int) -> list[str]:
    from scalingnote.data import load_queries

    texts = [q.text for q in load_queries(shared_data_dir() / data / "queries.jsonl").values()]
    texts += [q.text for q in load_queries(pseudo_queries_path(data, seed)).values()]
    return sorted(set(texts))


def fill_features(data: str, depths: list[int], seed: int) -> None:
    """Fill every k = 0 cache the recipe reads: SmolLM2 at each depth (one pass), MiniLM."""
    from scalingnote.data import load_corpus
    from scalingnote.models import fill_pooled_depths, load_tower

    root = work_dir(data) / "features"
    corpus = list(load_corpus(shared_data_dir() / data / "corpus.jsonl").values())
    queries = all_query_texts(data, seed)
    mq = load_tower(BERT, "query", max_query_length=QUERY_MAX)
    fill_pooled_depths(root, mq, [mq.config.num_layers], queries, batch_size=128)
    md = load_tower(BERT, "document", max_doc_length=DOC_MAX)
    fill_pooled_depths(root, md, [md.config.num_layers], corpus, batch_size=32)
    del mq, md
    lq = load_tower(LLM, "query", pooling="mean", max_query_length=QUERY_MAX, num_layers=max(depths))
    fill_pooled_depths(root, lq, depths, queries, batch_size=64)
    del lq
    ld = load_tower(LLM, "document", pooling="mean", max_doc_length=DOC_MAX, num_layers=max(depths))
    fill_pooled_depths(root, ld, depths, corpus, batch_size=16, part_size=256)


# ----------------------------------------------------------------------------- Stage I
def stage1_config(data: str, method: str, depth: int, head_lr: float, seed: int, out: Path, *, max_epochs: float):
    from scalingnote.config import load_config
    from scalingnote.training import TrainConfig

    llm = {"model": LLM, "num_layers": depth, "pooling": "mean"}
    bert = {"model": BERT}
    q, d = {"scaling_dual": (llm, llm), "scaling_doc": (bert, llm), "twinbert": (bert, bert)}[method]
    return load_config(TrainConfig, {
        "method": method,
        "output_dir": str(out),
        "query_tower": {**q, "max_length": QUERY_MAX, "trainable_layers": 0},
        "doc_tower": {**d, "max_length": DOC_MAX, "trainable_layers": 0},
        "dim": 128,
        "data": {"data_dir": str(shared_data_dir() / data), "eval_split": "test", "eval_overlap": "drop",
                 "validation_fraction": 0.1, "negatives": "bm25"},
        "optim": {"batch_size": 64, "epochs": max_epochs, "lr": 0.0, "head_lr": head_lr, "warmup_ratio": 0.02},
        "seed": seed,
        "center_samples": 100_000,  # every training pair: features are cached, the fit is cheap
        "feature_cache_dir": str(work_dir(data) / "features"),
        "eval_every": "epoch",
        "patience": 4,
        "save_every": 10_000,
        "evaluate_zero_shot": True,
        "show_progress": False,
    })


def run_stage1(data: str, method: str, depth: int, seed: int, lrs: list[float], max_epochs: float) -> dict:
    """Train with each head learning rate; keep the one with the best validation nDCG@10."""
    import json

    from scalingnote.training import train

    best = None
    tried = []
    for lr in lrs:
        out = work_dir(data) / "stage1" / f"{method}_d{depth}_lr{lr:g}"
        if not (out / "run.json").exists() or not (out / "doc_tower").exists():
            train(stage1_config(data, method, depth, lr, seed, out, max_epochs=max_epochs), resume=True)
        m = json.loads((out / "run.json").read_text())["metrics"]
        tried.append(f"{lr:g}:{m['best_val_score']:.4f}")
        if best is None or m["best_val_score"] > best[1]["best_val_score"]:
            best = (out, m)
    out, m = best
    m = dict(m, run_dir=str(out), lr_grid=" ".join(tried))
    print(f"[recipe] {method} depth {depth}: val nDCG@10 by head lr {m['lr_grid']} -> test nDCG@10 {m['ndcg@10']:.4f} "
          f"(start {m.get('zero_shot_ndcg@10', float('nan')):.4f})", flush=True)
    return m


# ----------------------------------------------------------------------------- QKD
def run_student(data: str, teacher_dir: Path, name: str, model: str, layers: int, seed: int, tag: str, max_epochs: float) -> dict:
    import json

    from scalingnote.config import load_config
    from scalingnote.distill import DistillConfig, distill

    # Embeddings frozen (their Adam update dominates a 1-2 layer student's step) and, for the 6-layer
    # MiniLM, the bottom 3 layers too: their outputs are cached once (trainable_layers), the rest trains.
    k = layers if layers <= 2 else layers // 2
    out = work_dir(data) / "qkd" / f"{tag}_{teacher_dir.name}_{name}_k{k}"  # a new teacher run never reuses an old student
    if not (out / "run.json").exists():
        sources = [{"path": str(shared_data_dir() / data)}]  # every known query text; test queries are removed
        pq = pseudo_queries_path(data, seed)
        if pq.exists() and pq.stat().st_size:
            sources.append({"path": str(pq)})
        student = {"model": model, "num_layers": layers, "max_length": QUERY_MAX, "trainable_layers": k}
        if model == LLM:
            student["pooling"] = "mean"
        cfg = load_config(DistillConfig, {
            "teacher": str(teacher_dir),
            "output_dir": str(out),
            "student": student,
            "queries": sources,
            "target": "normalized",
            "patience": 3,
            "optim": {"batch_size": 128, "epochs": max_epochs, "lr": 3e-4 if model == BERT else 1e-4},
            "eval_data": str(shared_data_dir() / data),
            "eval_split": "test",
            "feature_cache_dir": str(work_dir(data) / "features"),
            "seed": seed,
            "save_every": 10_000,
            "show_progress": False,
        })
        distill(cfg, resume=True)
    m = json.loads((out / "run.json").read_text())["metrics"]
    print(f"[recipe] student {name} (teacher {tag}): nDCG@10 {m['ndcg@10']:.4f} R@100 {m['r@100']:.4f} "
          f"after {m['steps_run']} steps (best {m['best_step']})", flush=True)
    return dict(m, run_dir=str(out))


# ----------------------------------------------------------------------------- rows
def qps_of(tower_dir: str | Path, texts: list[str]) -> float:
    from scalingnote.models import load_tower
    from scalingnote.quickstart import query_qps

    return round(query_qps(load_tower(tower_dir), texts), 1)


def baseline_rows(data: str, seed: int) -> list[dict]:
    """BM25 and zero-shot MiniLM (mean pooling, no projection; its features come from the cache)."""
    import time

    from scalingnote.data import load_beir
    from scalingnote.evaluation import evaluate
    from scalingnote.evaluation.dense import dense_metrics
    from scalingnote.sparse.bm25 import BM25Retriever
    from scalingnote.models import PrefixTower, load_tower
    from scalingnote.quickstart import query_qps

    ds = load_beir(shared_data_dir() / data, "test")
    qids = sorted(ds.qrels)
    texts = [ds.queries[q].text for q in qids]
    bm = BM25Retriever.fit(ds.corpus.values(), show_progress=False)
    t0 = time.perf_counter()
    run = bm.search(dict(zip(qids, texts)), k=100, show_progress=False)
    rows = [{"method": "bm25", "query_tower": "-", "query_qps": round(len(qids) / (time.perf_counter() - t0), 1),
             **evaluate(run, ds.qrels, ["ndcg@10", "r@100", "recall@100"]), "trainable_layers": "-", "train_seconds": 0.0}]
    root = work_dir(data) / "features"
    zq = load_tower(BERT, "query", max_query_length=QUERY_MAX)
    zd = load_tower(BERT, "document", max_doc_length=DOC_MAX)
    doc_ids = list(ds.corpus)
    d = PrefixTower(zd, 0, root, show_progress=False).encode([ds.corpus[i] for i in doc_ids])
    q = PrefixTower(zq, 0, root, show_progress=False).encode(texts)
    m = dense_metrics(q, qids, d, doc_ids, ds.qrels, tau=None, metrics=("ndcg@10", "r@100", "recall@100"))
    rows.append({"method": "zero_shot_minilm", "query_tower": "MiniLM-L6 (6L)", "query_qps": round(query_qps(zq, texts), 1), **m,
                 "start_ndcg@10": m["ndcg@10"], "trainable_layers": "-", "train_seconds": 0.0})
    return rows


def stage1_row(method: str, m: dict, texts: list[str], **extra) -> dict:
    run = Path(m["run_dir"])
    return {"method": method, "query_tower": extra.pop("query_tower"), "query_qps": None, "_tower": str(run / "query_tower"),
            "ndcg@10": m["ndcg@10"], "r@100": m["r@100"], "recall@100": m["recall@100"],
            "start_ndcg@10": m.get("zero_shot_ndcg@10"), "start_r@100": m.get("zero_shot_r@100"),
            "val_ndcg@10": round(m["best_val_score"], 4), "best_step": m["best_step"], "steps_run": m["steps_run"],
            "trainable_layers": 0, "train_seconds": m["train_seconds"], "head_lr_grid": m["lr_grid"], **extra}


def student_row(method: str, m: dict, texts: list[str], teacher: str, teacher_row: dict) -> dict:
    return {"method": method, "query_tower": f"{m['student']} ({m['student_layers']}L, QKD)", "query_qps": None,
            "_tower": str(Path(m["run_dir"]) / "query_tower"), "_teacher_tower": teacher_row["_tower"],
            "ndcg@10": m["ndcg@10"], "r@100": m["r@100"], "recall@100": m["recall@100"],
            "trainable_layers": m["student_trainable_layers"], "train_seconds": m["train_seconds"], "teacher": teacher,
            "retention_ndcg@10": round(m["ndcg@10"] / teacher_row["ndcg@10"], 4),
            "retention_r@100": round(m["r@100"] / teacher_row["r@100"], 4),
            "qkd_val_loss": m["qkd_val_loss"], "best_step": m["best_step"], "steps_run": m["steps_run"]}


def measure_qps(rows: list[dict], texts: list[str]) -> None:
    """Query QPS of every trained query tower, measured back to back at the end (so the machine's
    load is as similar as possible across rows); students get their speed-up over their teacher."""
    qps: dict[str, float] = {}
    for r in rows:
        t = r.pop("_tower", None)
        if t is not None:
            qps[t] = qps.get(t) or qps_of(t, texts)
            r["query_qps"] = qps[t]
    for r in rows:
        t = r.pop("_teacher_tower", None)
        if t is not None:
            r["speedup_vs_teacher"] = round(r["query_qps"] / qps[t], 2)


STUDENTS = [("minilm_1l", BERT, 1), ("minilm_2l", BERT, 2), ("minilm_6l", BERT, 6), ("smollm2_1l", LLM, 1), ("smollm2_2l", LLM, 2)]


def run_all(data: str, depths: list[int], seed: int, lrs: list[float], max_epochs: float, qkd_epochs: float,
            deep_students: list[str], students: list[str]) -> None:
    from benchmarks._common import write_results
    from scalingnote.data import load_beir

    ds = load_beir(shared_data_dir() / data, "test")
    texts = [ds.queries[q].text for q in sorted(ds.qrels)]
    rows = baseline_rows(data, seed)
    rows.append(stage1_row("twinbert", run_stage1(data, "twinbert", 6, seed, lrs, max_epochs), texts, query_tower="MiniLM-L6 (6L)"))
    dual = {d: run_stage1(data, "scaling_dual", d, seed, lrs, max_epochs) for d in depths}
    best_depth = max(dual, key=lambda d: dual[d]["best_val_score"])  # chosen on validation, never test
    depth_rows = {d: stage1_row(f"scaling_dual_depth_{d}", dual[d], texts, query_tower=f"SmolLM2 ({d}L)", depth=d) for d in depths}
    rows.append(dict(depth_rows[best_depth], method="scaling_dual", note=f"best validation depth = {best_depth}"))
    doc = run_stage1(data, "scaling_doc", best_depth, seed, lrs, max_epochs)
    rows.append(stage1_row("scaling_doc", doc, texts, query_tower="MiniLM-L6 (6L)", depth=best_depth))
    for name, model, layers in STUDENTS:
        if name not in students:
            continue
        m = run_student(data, Path(dual[best_depth]["run_dir"]), name, model, layers, seed, f"d{best_depth}", qkd_epochs)
        rows.append(student_row(f"scalingnote_{name}", m, texts, f"scaling_dual_depth_{best_depth}", depth_rows[best_depth]))
    deepest = max(depths)
    if deepest != best_depth:
        for name, model, layers in STUDENTS:
            if name in deep_students:
                m = run_student(data, Path(dual[deepest]["run_dir"]), name, model, layers, seed, f"d{deepest}", qkd_epochs)
                rows.append(student_row(f"scalingnote_{name}_from_depth_{deepest}", m, texts, f"scaling_dual_depth_{deepest}", depth_rows[deepest]))
    rows.extend(depth_rows[d] for d in depths)
    measure_qps(rows, texts)
    config = {"data": data, "test_queries": len(texts), "corpus": len(ds.corpus), "depths": depths, "best_depth": best_depth,
              "seed": seed, "head_lr_grid": lrs, "students": students, "deep_students": deep_students, "max_epochs": max_epochs, "qkd_max_epochs": qkd_epochs,
              "query_max_length": QUERY_MAX, "doc_max_length": DOC_MAX, "llm_pooling": "mean",
              "stage1": "trainable_layers 0 (heads over cached pooled states), batch 64, in-batch + BM25 hard negatives, "
                        "early stopping on validation nDCG@10 (10% of training queries), patience 4 epochs",
              "qkd": "students: embeddings frozen + cached (1-2 layer students train every layer; MiniLM-6L trains its top 3), "
                     "Eq. 15 on normalised teacher embeddings, lam 1, batch 128, lr 3e-4 (MiniLM) / 1e-4 (SmolLM2), "
                     "validation loss every epoch, patience 3, best student kept",
              "query_qps": "encode_queries, batch 256, 512 queries, torch threads of the machine (shared by other jobs: noisy)"}
    write_results(f"recipe_{data}", rows, config)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="scifact", choices=["scifact", "kuake_qtr"])
    ap.add_argument("--phase", default="all", choices=["features", "all"])
    ap.add_argument("--depths", default="2,4,8,16,30")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--head-lrs", default="1e-3,3e-3,1e-2")
    ap.add_argument("--max-epochs", type=float, default=40.0)
    ap.add_argument("--qkd-epochs", type=float, default=30.0)
    ap.add_argument("--deep-students", default="minilm_6l", help="students also distilled from the deepest teacher")
    ap.add_argument("--students", default=",".join(s[0] for s in STUDENTS), help="students distilled from the best-validated teacher")
    args = ap.parse_args()
    depths = [int(x) for x in args.depths.split(",")]
    fill_features(args.data, depths, args.seed)
    if args.phase == "features":
        return
    run_all(args.data, depths, args.seed, [float(x) for x in args.head_lrs.split(",")], args.max_epochs, args.qkd_epochs,
            args.deep_students.split(","), args.students.split(","))


if __name__ == "__main__":
    main()
