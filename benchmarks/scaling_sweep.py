"""Real scaling fits on SciFact: every point trained to convergence, then L(D), L(N), L(N, D).

    python -m benchmarks.scaling_sweep [--phase all|points|fit] [--features DIR] [--ict DIR] [--families smollm2,minilm]

Protocol (Fang et al., *Scaling Laws for Dense Retrieval* §3.5, §4; ScalingNote §4.4):

- data size D = training (query, positive) pairs (64 ... 4096 and the whole pool for the primary model
  SmolLM2 depth 2; 64, 256, 1024, 4096 and the whole pool for the other models), from a pool of the SciFact
  human training pairs
  plus ICT pseudo-queries over the corpus (``scalingnote.data.pseudo``), shuffled once (seed 0);
  point D trains on the first D pairs (nested sets, same human:ICT mix at every size);
- model size N = non-embedding parameters of a tower (backbone + head): SmolLM2-135M truncated to
  2/4/8/16/30 layers (ScalingDual) and MiniLM-L6 truncated to 1/2/3/4/6 layers (TwinBERT);
- every point: the CPU recipe (``trainable_layers: 0``: heads over cached pooled states, heads
  initialised from the point's own pairs, in-batch negatives, batch 64, head lr 3e-3) trained until
  the contrastive perplexity of held-out *dev* queries (10% of the human training queries, never
  trained on) has not improved for 1000 steps (validated every clamp(epoch, 10, 50) steps; best weights
  restored): early stopping per point, with the same patience window at every data size;
- the loss L = contrastive perplexity (Fang et al. Eq. 6, W = 256 random negatives per pair drawn
  once with seed 0 from the whole corpus, s = cos/0.05) on the 300 SciFact **test** queries;
  nDCG@10 and R@100 on the same queries;
- fits (``scalingnote.scaling.fit``): L(D) per model, L(N) per family at the largest D, L(N, D) per
  family; each law is also fitted without its largest point(s) (largest D for L(D) and L(N, D),
  largest N for L(N)) and its prediction there is compared with the measured loss.

Writes benchmarks/results/scaling_sweep.json (one row per point), benchmarks/results/scaling_fit.json
(one row per fitted law) and benchmarks/results/plots/scaling_*.png. Points are resumable
(``runs/scaling_sweep/<family>_d<depth>/D<D>/point.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from pathlib import Path

from benchmarks._common import REPO_ROOT, RESULTS_DIR, shared_data_dir, write_results

QUERY_MAX, DOC_MAX = 64, 256  # the paper's lengths (the heads-only points read cached pooled states)
LLM, BERT = "smollm2-135m", "minilm-l6"
FAMILIES = {"smollm2": ("scaling_dual", [2, 4, 8, 16, 30]), "minilm": ("twinbert", [1, 2, 3, 4, 6])}
PRIMARY = ("smollm2", 2)  # the recipe's best-validated ScalingDual depth: the model of the headline L(D)
D_GRID = [64, 128, 256, 512, 1024, 2048, 4096]  # + the whole pool (the held-out largest D)
JOINT_D = [64, 256, 1024, 4096]  # the sizes of the other models (+ the whole pool): the joint grid


def session_config(data: str, family: str, depth: int, features: Path, seed: int, out: Path):
    """The heads-only Stage I configuration of one (family, depth): frozen towers, cached pooled states."""
    from scalingnote.config import load_config
    from scalingnote.training import TrainConfig

    method = FAMILIES[family][0]
    tower = (
        {"model": LLM, "num_layers": depth, "pooling": "mean"}
        if family == "smollm2"
        else {"model": BERT, "num_layers": depth}
    )
    return load_config(
        TrainConfig,
        {
            "method": method,
            "output_dir": str(out),
            "dim": 128,
            "query_tower": {**tower, "max_length": QUERY_MAX, "trainable_layers": 0},
            "doc_tower": {**tower, "max_length": DOC_MAX, "trainable_layers": 0},
            "data": {
                "data_dir": str(shared_data_dir() / data),
                "eval_split": "test",
                "eval_overlap": "drop",
                "validation_fraction": 0.1,
                "negatives": "none",
            },
            "optim": {"batch_size": 64, "epochs": 40, "lr": 0.0, "head_lr": 3e-3, "warmup_ratio": 0.02},
            "seed": seed,
            "center_samples": 100_000,
            "feature_cache_dir": str(features),
            "show_progress": False,
        },
    )


def load_pool(data: str, ict_dir: Path, seed: int):
    """(pool, dev, test, corpus, queries): the shuffled human + ICT training pool, the dev and the
    test evaluation sets (their contrastive tuples drawn once)."""
    import numpy as np

    from scalingnote.data import load_corpus, load_qrels, load_queries
    from scalingnote.data.beir import qrels_path
    from scalingnote.scaling.points import make_eval_set
    from scalingnote.training.data import Example, _split_by_query

    root = shared_data_dir() / data
    corpus = load_corpus(root / "corpus.jsonl")
    queries = {q.id: q.text for q in load_queries(root / "queries.jsonl").values()}
    train_qrels = load_qrels(qrels_path(root, "train"), queries, corpus)
    test_qrels = load_qrels(qrels_path(root, "test"), queries, corpus)
    dev_q = _split_by_query(sorted(train_qrels), 0.1, seed)
    human = [
        Example(q, queries[q], corpus[d], None, "human")
        for q in sorted(train_qrels)
        if q not in dev_q
        for d in sorted(train_qrels[q])
        if train_qrels[q][d] > 0
    ]
    ict_q = {q.id: q.text for q in load_queries(ict_dir / "queries.jsonl").values()}
    ict = []
    with open(ict_dir / "triplets.jsonl", encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                t = json.loads(line)
                ict.append(Example(t["query_id"], ict_q[t["query_id"]], corpus[t["pos_id"]], None, "ict"))
            except (KeyError, json.JSONDecodeError) as e:
                raise SystemExit(f"{ict_dir / 'triplets.jsonl'}:{i}: bad ICT triplet ({e!r})") from None
    pool = human + ict
    order = np.random.default_rng(seed).permutation(len(pool))
    pool = [pool[i] for i in order]
    doc_ids = list(corpus)
    dev = make_eval_set(queries, {q: train_qrels[q] for q in dev_q}, doc_ids, seed=seed + 1, name="dev")
    test = make_eval_set(queries, test_qrels, doc_ids, seed=seed, name="test")
    return pool, dev, test, corpus, queries


def pool_digest(pool, dev, test) -> str:
    h = hashlib.sha256()
    for e in pool:
        h.update(f"{e.query_id}\t{e.pos.id}\n".encode())
    h.update(json.dumps([dev.query_ids, test.query_ids]).encode())
    h.update(dev.cset.neg.tobytes())
    h.update(test.cset.neg.tobytes())
    return h.hexdigest()[:16]


def fill_minilm_depths(data: str, features: Path, depths: list[int], query_texts: list[str], corpus) -> None:
    """Pooled MiniLM caches at every truncation depth in one pass per role (recipe: query 64, doc 256 tokens)."""
    from scalingnote.models import fill_pooled_depths, load_tower

    mq = load_tower(BERT, "query", max_query_length=QUERY_MAX)
    fill_pooled_depths(features, mq, depths, query_texts, batch_size=128)
    md = load_tower(BERT, "document", max_doc_length=DOC_MAX)
    fill_pooled_depths(features, md, depths, list(corpus.values()), batch_size=32)


def grid_order(families: list[str], d_grid: list[int]) -> list[tuple[str, int, int]]:
    """Most valuable first: L(D) of the primary model, then L(N) at the largest D, then the rest of the grid."""
    out: list[tuple[str, int, int]] = [(PRIMARY[0], PRIMARY[1], d) for d in d_grid] if PRIMARY[0] in families else []
    top = d_grid[-1]
    for fam in families:
        out += [(fam, depth, top) for depth in FAMILIES[fam][1]]
    joint = [d for d in d_grid if d in JOINT_D] + [top]  # the rest of the grid: every other size (CPU time)
    for fam in families:
        for depth in FAMILIES[fam][1]:
            out += [(fam, depth, d) for d in joint]
    seen, uniq = set(), []
    for p in out:
        if p not in seen:
            seen.add(p)
            uniq.append(p)
    return uniq


def run_points(args) -> None:
    import torch

    from scalingnote.scaling.points import HeadSession, PointSettings, run_point

    torch.set_num_threads(args.threads)
    pool, dev, test, corpus, queries = load_pool(args.data, args.ict, args.seed)
    digest = pool_digest(pool, dev, test)
    d_grid = [d for d in D_GRID if d < len(pool)] + [len(pool)]
    families = args.families.split(",")
    filled = False
    settings = PointSettings(seed=args.seed)
    work = args.work
    sessions: dict[tuple[str, int], HeadSession] = {}
    t_start = time.perf_counter()
    grid = grid_order(families, d_grid)
    if args.only:
        grid = [p for p in grid if f"{p[0]}:{p[1]}:{p[2]}" in args.only.split(",")]
    for fam, depth, D in grid:
        if args.max_minutes and time.perf_counter() - t_start > 60 * args.max_minutes:
            print(
                f"[scaling] time budget of {args.max_minutes} min used: stopping before {fam} d{depth} D{D}", flush=True
            )
            break
        key = f"{fam}|{depth}|{D}|{digest}|{settings}"
        out = work / f"{fam}_d{depth}" / f"D{D}"
        f = out / "point.json"
        if f.exists() and json.loads(f.read_text(encoding="utf-8")).get("key") == key:
            continue
        if fam == "minilm" and depth < 6 and not filled:
            texts = sorted(set(queries.values()) | {e.query for e in pool})
            fill_minilm_depths(
                args.data, args.features, [d for d in FAMILIES["minilm"][1] if d < 6], texts, corpus
            )  # 6: recipe cache
            filled = True
        if (fam, depth) not in sessions:
            sessions.clear()  # one model in memory at a time
            cfg = session_config(args.data, fam, depth, args.features, args.seed, work / f"{fam}_d{depth}")
            sessions[(fam, depth)] = HeadSession(cfg, corpus, show_progress=True)
        s = sessions[(fam, depth)]
        rec = run_point(
            s,
            pool[:D],
            dev,
            test,
            out,
            settings,
            extra={
                "key": key,
                "family": fam,
                "method": FAMILIES[fam][0],
                "depth": depth,
                "D": D,
                "human_pairs": sum(e.source == "human" for e in pool[:D]),
            },
        )
        print(
            f"[scaling] {fam} d{depth} D={D}: test ppl {rec['test_contrastive_ppl']:.4f} nDCG@10 {rec['ndcg@10']:.4f} "
            f"dev ppl {rec['dev_contrastive_ppl']:.4f} steps {rec['steps_run']} (best {rec['best_step']}) "
            f"{rec['train_seconds']}s",
            flush=True,
        )


def collect_rows(work: Path, seed: int = 0) -> list[dict]:
    """Finished points trained with the current settings (points of other settings are ignored)."""
    from scalingnote.scaling.points import PointSettings

    current = str(PointSettings(seed=seed))
    rows = []
    for f in sorted(work.glob("*_d*/D*/point.json")):
        r = json.loads(f.read_text(encoding="utf-8"))
        if not r.get("key", "").endswith(current):
            continue
        rows.append(
            {
                "family": r["family"],
                "method": r["method"],
                "depth": r["depth"],
                "N": r["non_embedding_params"]["query"],
                "D": r["D"],
                "loss": r["test_contrastive_ppl"],
                "ndcg@10": r["ndcg@10"],
                "r@100": r["r@100"],
                "dev_contrastive_ppl": r["dev_contrastive_ppl"],
                "start_dev_contrastive_ppl": r["start_dev_contrastive_ppl"],
                "human_pairs": r["human_pairs"],
                "steps_run": r["steps_run"],
                "best_step": r["best_step"],
                "stopped_early": r["stopped_early"],
                "train_seconds": r["train_seconds"],
            }
        )
    rows.sort(key=lambda r: (r["family"], r["depth"], r["D"]))
    return rows


def _fit_record(name: str, law: str, rows: list[dict], holdout_by: str, plots: Path, plot_var: str | None) -> dict:
    from scalingnote.errors import ScalingNoteError
    from scalingnote.scaling.fit import fit_table
    from scalingnote.scaling.plots import plot_joint, plot_loss_vs

    rec: dict = {"fit": name, "law": law, "points": len(rows)}
    try:
        full = fit_table(rows, law)
    except ScalingNoteError as e:
        rec["error"] = str(e)
        return rec
    for k in ("A", "alpha", "B", "beta", "delta"):
        if k in full.params:
            rec[k] = full.params[k]
    rec["r2"] = round(full.r2, 6)
    rec["rmse"] = full.rmse
    rec["at_bound"] = ",".join(full.at_bound) or None
    for k, v in full.stderr.items():
        rec[f"stderr_{k}"] = v if math.isfinite(v) else None
    ho = None
    try:
        ho = fit_table(rows, law, holdout_largest=1, holdout_by=holdout_by)
        rec["holdout"] = f"largest {holdout_by}"
        rec["holdout_points"] = ho.holdout["n"]
        rec["holdout_fit_r2"] = round(ho.r2, 6)
        rec["holdout_predicted"] = ",".join(f"{v:.4f}" for v in ho.holdout["predicted"])
        rec["holdout_measured"] = ",".join(f"{v:.4f}" for v in ho.holdout["observed"])
        rec["holdout_mape"] = ho.holdout["mape"]
        rec["holdout_max_rel_err"] = max(
            abs(p - o) / o for p, o in zip(ho.holdout["predicted"], ho.holdout["observed"], strict=True)
        )
    except ScalingNoteError as e:
        rec["holdout"] = f"not possible: {e}"
    p = plots / f"scaling_{name}.png"
    if law == "joint":
        plot_joint(rows, ho or full, p)
    else:
        plot_loss_vs(rows, plot_var, p, fit=ho or full)
    rec["plot"] = str(p.relative_to(REPO_ROOT))
    return rec


def fit_all(args) -> None:
    rows = collect_rows(args.work, getattr(args, "seed", 0))
    if not rows:
        raise SystemExit(f"no finished points under {args.work}")
    plots = RESULTS_DIR / "plots"
    fits = []
    top_d = max(r["D"] for r in rows)
    for fam in sorted({r["family"] for r in rows}):
        fr = [r for r in rows if r["family"] == fam]
        for depth in sorted({r["depth"] for r in fr}):
            dr = [r for r in fr if r["depth"] == depth]
            if len(dr) >= 4:
                fits.append(_fit_record(f"data_{fam}_d{depth}", "data", dr, "D", plots, "D"))
        nr = [r for r in fr if r["D"] == top_d]
        if len(nr) >= 4:
            fits.append(_fit_record(f"model_{fam}", "model", nr, "N", plots, "N"))
        if len({r["N"] for r in fr}) >= 2 and len({r["D"] for r in fr}) >= 3 and len(fr) >= 6:
            fits.append(_fit_record(f"joint_{fam}", "joint", fr, "D", plots, None))
    for f in fits:
        f["primary"] = f["fit"] == f"data_{PRIMARY[0]}_d{PRIMARY[1]}"
    keep = (
        "family",
        "method",
        "depth",
        "N",
        "D",
        "loss",
        "ndcg@10",
        "r@100",
        "dev_contrastive_ppl",
        "start_dev_contrastive_ppl",
        "human_pairs",
        "steps_run",
        "best_step",
        "stopped_early",
        "train_seconds",
    )
    cfg = {
        "data": args.data,
        "loss": "contrastive perplexity (Fang et al. Eq. 6: mean NLL of the positive among itself + W=256 "
        "random non-relevant "
        "documents, drawn once with seed 0 from the whole corpus; s = cos/0.05) on the SciFact test queries",
        "training": "heads only over cached pooled states (trainable_layers 0), heads initialised from the "
        "point's pairs (PCA), "
        "in-batch negatives, batch min(64, D), head lr 3e-3, AdamW (warm-up 2%, linear decay over 6000 steps), "
        "<= 6000 steps, "
        "validation every clamp(epoch, 10, 50) steps on dev contrastive perplexity, stop after 1000 steps without "
        "improvement, best weights restored",
        "dev": "10% of the SciFact training queries (seed 0), removed from the pool; their W negatives drawn "
        "with seed 1",
        "pool": "SciFact human training pairs (minus dev) + one ICT pseudo-query per corpus document, shuffled "
        "once (seed 0); "
        "point D = the first D pairs",
        "families": {k: {"method": v[0], "depths": v[1]} for k, v in FAMILIES.items()},
        "primary_data_law": f"{PRIMARY[0]} depth {PRIMARY[1]}",
        "machine_note": "2 shared CPU cores; train_seconds are noisy",
        "points": len(rows),
    }
    write_results("scaling_sweep", [{k: r.get(k) for k in keep} for r in rows], cfg)
    write_results(
        "scaling_fit",
        fits,
        {
            **cfg,
            "input": "benchmarks/results/scaling_sweep.json",
            "method": "scipy least_squares, soft_l1 loss (f_scale = 1.4826 MAD of the residuals, iterated), "
            "log-parameters, multi-start",
            "model_law": "L(N) = (A/N)^alpha + delta, per family at the largest D",
            "data_law": "L(D) = (B/D)^beta + delta, per model",
            "joint_law": "L(N,D) = [(A/N)^(alpha/beta) + B/D]^beta + delta, per family",
            "holdout": "the law refitted without its largest D (data, joint) / largest N (model); prediction "
            "error there",
            "targets": "R^2 >= 0.9 for L(D) on real data; held-out largest-D prediction within 5% of the measured loss",
        },
    )
    for f in fits:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in f.items() if not k.startswith("stderr")})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="scifact")
    ap.add_argument("--phase", default="all", choices=["all", "points", "fit"])
    ap.add_argument("--features", type=Path, default=None, help="feature cache dir (default <work>/features)")
    ap.add_argument(
        "--ict", type=Path, default=None, help="ICT pseudo-query dir (default <work>/pseudo_ict, made if missing)"
    )
    ap.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "scaling_sweep")
    ap.add_argument("--families", default="smollm2,minilm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="", help="run only these points, e.g. smollm2:2:64,minilm:6:64 (smoke tests)")
    ap.add_argument(
        "--max-minutes", type=float, default=0.0, help="stop starting new points after this long (0 = no limit)"
    )
    args = ap.parse_args()
    args.features = args.features or args.work / "features"
    if args.ict is None:
        from benchmarks._heads_recipe import ict_dir

        args.ict = ict_dir(args.work / "pseudo_ict", args.data, args.seed)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.phase in ("all", "points"):
        run_points(args)
    if args.phase in ("all", "fit"):
        fit_all(args)


if __name__ == "__main__":
    main()
