"""The document-tower scaling curve with trained LLM layers (ScalingNote §4.4).

    python -m benchmarks.llm_layers --data scifact [--depths 2,4,8] [--k 0,1,2] [--side both]
    python -m benchmarks.llm_layers --data scifact --depths 2,4,8,12 --k 0,all --lr 3e-5,1e-4 --tag gpu  # on a GPU

ScalingDual (SmolLM2 query and document towers truncated to ``depth`` layers, mean pooling) with
the top ``k`` layers trained over the token-level prefix cache (``trainable_layers: k``; ``k = 0``
= heads only over cached pooled states, the rows beside them from the same run; ``k = all``: every
layer of both towers trains end to end, no cache: the paper's setting, for a GPU). ``--lr`` may
list several layer learning rates: each (depth, k) then trains once per rate and the row with
the best validation nDCG@10 is marked ``chosen`` (the plot and the p-values use chosen rows). Heads first,
then layers (``--warm-heads``, the default): a ``k > 0`` row starts from its depth's trained
heads-only row (``init_heads_from``) and spends its whole step budget on the layers, so a heads
step (milliseconds over pooled caches) never competes with a layer step (seconds) for the budget. One pass of
the deepest tower fills the caches of every (depth, k) pair (:func:`fill_depths`); the caches'
disk size is estimated before the fill. Every row of one ``k``: same data, the same step
budget (``--heads-epochs`` for ``k = 0``, ``--max-epochs`` for ``k > 0``, x steps per epoch), validation
nDCG@10 over the full corpus every epoch on
queries held out from training, early stopping with ``--patience``, best weights restored.
Rows are trained in the order given and the results file is rewritten after each, so an
interrupted run resumes (finished rows are read from their ``run.json``; a row in progress
resumes from its checkpoint; caches keep their finished parts).

Columns: ``depth``, ``trainable_layers``, ``tower`` (query / doc / both), ``ndcg@10``, ``r@100``,
``contrastive_ppl`` (test), ``start_ndcg@10`` (test nDCG@10 of the row's start: the initial heads
for ``k = 0``, the trained heads-only row for a warm ``k > 0`` row), ``val_curve`` ("step:val nDCG@10 ..."),
``lr``, ``chosen``, ``train_seconds``, ``cache_gb`` (estimated before the fill: query + document cache of the row),
``p_vs_shallower`` / ``delta_ndcg@10_vs_shallower``: paired t-test of the row's per-query test
nDCG@10 against the same ``k`` at the next shallower depth (``vs_shallower_depth``), and
``p_vs_heads`` / ``delta_ndcg@10_vs_heads``: against the heads-only row of the same depth.
``--twinbert-row`` adds TwinBERT (MiniLM-L6, every layer of both towers) trained under the same
rules as a last row (``method: twinbert``, with ``p_vs_scaling_dual`` against the best-validating
row), and the plot's reference line is that row instead of the recipe's (other document length).
Writes benchmarks/results/llm_layers_<data>[_<tag>].json and plots/llm_layers_<data>[_<tag>].png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks._common import REPO_ROOT, loadavg, report, shared_data_dir
from benchmarks._llm_layers_report import (
    add_significance,
    device_name,
    k_order,
    per_query_run,
    plot_depth_curve,
    twinbert_reference,
)

LLM = "smollm2-135m"
QUERY_MAX = 64


def work_dir(data: str, doc_max: int) -> Path:
    return REPO_ROOT / "runs" / "llm_layers" / f"{data}_doc{doc_max}"


def fill_caches(data: str, depths: list[int], ks: list[int], doc_max: int) -> dict[str, float]:
    """One pass of SmolLM2 at the deepest depth per tower fills every (depth, k) cache; returns
    the estimated GB (before filling) of the ``pooled`` and ``tokens`` caches per tower."""
    from scalingnote.data import load_corpus, load_queries
    from scalingnote.models import load_tower
    from scalingnote.models.prefix import estimate_cache_bytes, fill_depths

    root = work_dir(data, doc_max) / "features"
    d = shared_data_dir() / data
    corpus = list(load_corpus(d / "corpus.jsonl").values())
    queries = sorted({q.text for q in load_queries(d / "queries.jsonl").values()})
    pairs = [(n, k) for n in depths for k in ks if k != "all" and k <= n]  # k = all: no cache
    gb = {}
    for role, items, kw, bs in (
        ("query", queries, {"max_query_length": QUERY_MAX}, 64),
        ("document", corpus, {"max_doc_length": doc_max}, 16),
    ):
        t = load_tower(LLM, role, pooling="mean", num_layers=max(depths), **kw)
        for kind, k in (("pooled", 0), ("tokens", 1)):
            est = estimate_cache_bytes(t, k, items)
            gb[f"{role}_{kind}"] = est["gb"]
            print(
                f"[llm_layers] {role} {kind} cache per depth: {est['rows']} texts, {est['tokens']} tokens, "
                f"~{est['gb']:.3f} GB",
                flush=True,
            )
        t0 = time.perf_counter()
        fill_depths(root, t, pairs, items, batch_size=bs)
        gb[f"{role}_fill_seconds"] = round(time.perf_counter() - t0, 1)
        del t
    return gb


def parse_k(x: str) -> int | str:
    """A ``--k`` entry: an int >= 0 (top layers over the prefix cache) or ``all``."""
    return "all" if x.strip() == "all" else int(x)


def row_dir(data: str, depth: int, k: int | str, side: str, args, lr: float | None = None) -> Path:
    if k == 0:
        return work_dir(data, args.doc_max) / "stage1" / f"d{depth}_k0_heads_lr{args.head_lr:g}_e{args.heads_epochs:g}"
    warm = "_warm" if args.warm_heads else ""
    hlr = f"_hlr{args.layer_head_lr:g}" if args.layer_head_lr is not None else ""
    lr = args.lrs[0] if lr is None else lr
    return work_dir(data, args.doc_max) / "stage1" / f"d{depth}_k{k}_{side}{warm}_lr{lr:g}{hlr}_e{args.max_epochs:g}"


def stage1_config(data: str, depth: int, k: int | str, side: str, args, out: Path, lr: float, model: str = LLM):
    from scalingnote.config import load_config
    from scalingnote.training import TrainConfig

    qk = k if side in ("both", "query") else 0
    dk = k if side in ("both", "doc") else 0
    llm = {"model": model, "num_layers": depth, "pooling": "mean"}
    return load_config(
        TrainConfig,
        {
            "method": "scaling_dual" if model == LLM else "twinbert",  # both towers large LLM ones, or both BERT
            "output_dir": str(out),
            "query_tower": {**llm, "max_length": QUERY_MAX, "trainable_layers": qk},
            "doc_tower": {**llm, "max_length": args.doc_max, "trainable_layers": dk},
            "dim": 128,
            "data": {
                "data_dir": str(shared_data_dir() / data),
                "eval_split": "test",
                "eval_overlap": "drop",
                "validation_fraction": 0.1,
                "negatives": "bm25",
            },
            "optim": {
                "batch_size": 64,
                "epochs": args.max_epochs if k else args.heads_epochs,
                "lr": lr,
                "head_lr": args.layer_head_lr if k and args.layer_head_lr is not None else args.head_lr,
                "warmup_ratio": 0.1,
            },
            "init_heads_from": str(row_dir(data, depth, 0, "both", args))
            if k and args.warm_heads and model == LLM
            else None,
            "seed": args.seed,
            "center_samples": 100_000,  # every training pair: the pooled states come from the caches
            "feature_cache_dir": str(work_dir(data, args.doc_max) / "features"),
            "feature_cache_dtype": "float16",
            "eval_every": "epoch",
            "patience": args.patience,
            "save_every": 5,
            "evaluate_zero_shot": k == 0
            or model != LLM,  # k > 0 starts from the heads-only row's result (warm) or its start
            "show_progress": False,
            "precision": args.precision,
        },
    )


def metrics_columns(m: dict) -> dict:
    """The columns every row takes from its Stage I run's ``run.json`` metrics."""
    from scalingnote.quickstart.report import curve_text

    return {
        "ndcg@10": m["ndcg@10"],
        "r@100": m["r@100"],
        "contrastive_ppl": m["contrastive_ppl"],
        "start_ndcg@10": m.get("zero_shot_ndcg@10"),
        "val_ndcg@10": round(m["best_val_score"], 4),
        "val_curve": curve_text(m["val_curve"]),
        "best_step": m["best_step"],
        "steps_run": m["steps_run"],
        "stopped_early": m["stopped_early"],
    }


def run_row(data: str, depth: int, k: int | str, side: str, args, gb: dict[str, float], lr: float) -> dict:
    from scalingnote.training import train

    out = row_dir(data, depth, k, side, args, lr)
    if k and args.warm_heads and not (row_dir(data, depth, 0, "both", args) / "run.json").is_file():
        raise SystemExit(
            f"[llm_layers] depth {depth} k {k} starts from the heads-only row of depth {depth}: put {depth}:0 "
            f"before {depth}:{k} in --order"
        )
    if not (out / "run.json").exists():
        train(stage1_config(data, depth, k, side, args, out, lr), resume=True)
    m = json.loads((out / "run.json").read_text())["metrics"]
    cache_gb = (
        0.0
        if k == "all"
        else sum(
            gb[f"{r}_{'tokens' if k and (side in ('both', s)) else 'pooled'}"]
            for r, s in (("query", "query"), ("document", "doc"))
        )
    )
    row = {
        "method": "scaling_dual",
        "depth": depth,
        "trainable_layers": k,
        "tower": side if k else "heads",
        **metrics_columns(m),
        "lr": lr if k else args.head_lr,
        "chosen": True,
        "train_seconds": m["train_seconds"],
        "cache_gb": round(cache_gb, 4),
        "_dir": str(out),
        "_warm": bool(k and args.warm_heads),
    }
    print(
        f"[llm_layers] depth {depth} k {k} ({row['tower']}): test nDCG@10 {row['ndcg@10']:.4f} R@100 "
        f"{row['r@100']:.4f} "
        f"ppl {row['contrastive_ppl']:.2f} | val {row['val_curve']} | {row['train_seconds']} s",
        flush=True,
    )
    return row


def run_twinbert(data: str, args, rows: list[dict], runs: dict) -> dict:
    """TwinBERT under the grid's own rules (``--twinbert-row``): MiniLM-L6, every layer of both
    towers trained end to end from the zero-shot model, the same data, document length, step
    budget, validation and early stopping as the layer rows, so the bar the LLM rows are read
    against differs from them in the model alone; with a paired t-test against the chosen
    best-validating ScalingDual row."""
    from scalingnote.data import load_beir
    from scalingnote.evaluation.significance import compare_runs
    from scalingnote.training import train

    lr = args.twinbert_lr
    out = work_dir(data, args.doc_max) / "stage1" / f"twinbert_minilm-l6_lr{lr:g}_e{args.max_epochs:g}"
    if not (out / "run.json").exists():
        train(stage1_config(data, 6, "all", "both", args, out, lr, model="minilm-l6"), resume=True)
    m = json.loads((out / "run.json").read_text())["metrics"]
    row = {
        "method": "twinbert",
        "model": "minilm-l6",
        "depth": 6,
        "trainable_layers": "all",
        "tower": "both",
        **metrics_columns(m),
        "lr": lr,
        "chosen": True,
        "train_seconds": m["train_seconds"],
        "cache_gb": 0.0,
    }
    duals = [r for r in rows if r["chosen"] and r["trainable_layers"] != 0] or [r for r in rows if r["chosen"]]
    if duals:
        best = max(duals, key=lambda r: r["val_ndcg@10"])
        c = compare_runs(
            per_query_run(out, data), runs[best["_dir"]], load_beir(shared_data_dir() / data, "test").qrels
        )
        row.update(
            {
                "vs_scaling_dual": f"depth {best['depth']} k {best['trainable_layers']}",
                "delta_ndcg@10_vs_scaling_dual": round(c.mean_a - c.mean_b, 4),
                "p_vs_scaling_dual": round(c.ttest.pvalue, 6),
            }
        )
    print(
        f"[llm_layers] TwinBERT (minilm-l6): test nDCG@10 {row['ndcg@10']:.4f} | val {row['val_curve']} | "
        f"{row['train_seconds']} s",
        flush=True,
    )
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="scifact", choices=["scifact", "kuake_qtr"])
    ap.add_argument("--depths", default="2,4")
    ap.add_argument(
        "--k", default="0,1,2", help="trainable top layers per row (0 = heads only, all = every layer, no cache)"
    )
    ap.add_argument("--side", default="both", choices=["both", "query", "doc"], help="towers whose top k layers train")
    ap.add_argument(
        "--order",
        default="",
        help="rows to train, in order, as depth:k[:lr],... (default: k = 0 rows, then every lr x k x depth)",
    )
    ap.add_argument("--doc-max", type=int, default=128, help="document max tokens (the paper: 256)")
    ap.add_argument(
        "--max-epochs", type=float, default=3.0, help="step budget of a k > 0 row: epochs x steps per epoch"
    )
    ap.add_argument(
        "--heads-epochs", type=float, default=40.0, help="step budget of a heads-only (k = 0) row (the recipe's 40)"
    )
    ap.add_argument(
        "--warm-heads",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="k > 0 rows start from their depth's trained heads-only row (heads first, then layers)",
    )
    ap.add_argument("--patience", type=int, default=1)
    ap.add_argument(
        "--lr", default="1e-4", help="learning rate(s) of the trained LLM layers, comma-separated: chosen on validation"
    )
    ap.add_argument(
        "--head-lr", type=float, default=3e-3, help="learning rate of the heads (recipe's best for depths 2-8)"
    )
    ap.add_argument(
        "--layer-head-lr",
        type=float,
        default=None,
        help="head learning rate of k > 0 rows (default: --head-lr; warm heads restart their schedule at it)",
    )
    ap.add_argument(
        "--twinbert-row",
        action="store_true",
        help="also train TwinBERT (MiniLM-L6, every layer) under the same rules: the reference line from this run",
    )
    ap.add_argument("--twinbert-lr", type=float, default=1e-4, help="its learning rate (the quick start's bert_lr)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--precision", default="auto", choices=["auto", "fp32", "bf16"], help="auto: fp32 on CPU, bf16 autocast on GPU"
    )
    ap.add_argument(
        "--tag", default="", help="results file llm_layers_<data>_<tag>.json (a side experiment beside the main grid)"
    )
    ap.add_argument("--note", default="", help="free text kept in the results config (e.g. rows not run and why)")
    args = ap.parse_args(argv)
    args.depths = [int(x) for x in args.depths.split(",")]
    args.ks = [parse_k(x) for x in args.k.split(",")]
    args.lrs = [float(x) for x in args.lr.split(",")]
    return args


def row_order(args: argparse.Namespace) -> list[tuple[int, int | str, float]]:
    """(depth, k, lr) of every row in training order: ``--order``, else the heads-only rows
    first (every later row starts from one), then per layer learning rate every k x depth."""
    if args.order:
        return [
            (int(v[0]), parse_k(v[1]), float(v[2]) if len(v) > 2 else args.lrs[0])
            for v in (x.split(":") for x in args.order.split(","))
        ]
    return [(n, 0, args.head_lr) for n in args.depths if 0 in args.ks] + [
        (n, k, lr) for lr in args.lrs for k in sorted(args.ks, key=k_order) if k != 0 for n in args.depths
    ]


def main() -> None:
    args = parse_args()
    depths, ks, order = args.depths, args.ks, row_order(args)
    before = __import__("os").getloadavg()
    gb = fill_caches(args.data, depths, ks, args.doc_max)
    twin, twin_src = twinbert_reference(args.data)
    config = {
        "data": args.data,
        "depths": depths,
        "k": ks,
        "order": " ".join(f"{n}:{k}:{lr:g}" for n, k, lr in order),
        "side": args.side,
        "device": device_name(),
        "model": LLM,
        "pooling": "mean",
        "query_max_length": QUERY_MAX,
        "doc_max_length": args.doc_max,
        "max_epochs": args.max_epochs,
        "heads_epochs": args.heads_epochs,
        "warm_heads": args.warm_heads,
        "patience": args.patience,
        "lr": args.lrs,
        "head_lr": args.head_lr,
        "layer_head_lr": args.layer_head_lr,
        "seed": args.seed,
        "precision": args.precision,
        "batch_size": 64,
        "negatives": "in-batch + BM25 hard negatives",
        "feature_cache_dtype": "float16",
        "validation": "nDCG@10 over the full corpus every epoch, 10% of training queries held out; best weights "
        "restored",
        "cache_gb_estimates": " ".join(f"{k}={v}" for k, v in gb.items()),
        "note": args.note,
        "twinbert_reference_ndcg@10": twin,
        "twinbert_reference": twin_src,
    }
    rows: list[dict] = []
    runs: dict = {}
    name = f"llm_layers_{args.data}" + (f"_{args.tag}" if args.tag else "")
    for n, k, lr in order:
        rows.append(run_row(args.data, n, k, args.side if k else "both", args, gb, lr))
        add_significance(rows, args.data, runs)
        config["plot"] = (
            plot_depth_curve(rows, name, config["twinbert_reference_ndcg@10"]).relative_to(REPO_ROOT).as_posix()
        )
        report(
            name,
            [{kk: v for kk, v in r.items() if not kk.startswith("_")} for r in rows],
            {**config, **loadavg(before)},
        )
    if args.twinbert_row:
        ref = run_twinbert(args.data, args, rows, runs)
        config.update(
            {
                "twinbert_reference_ndcg@10": ref["ndcg@10"],
                "twinbert_lr": args.twinbert_lr,
                "twinbert_reference": f"this run: minilm-l6, every layer, {args.doc_max} document tokens",
            }
        )
        config["plot"] = plot_depth_curve(rows, name, ref["ndcg@10"]).relative_to(REPO_ROOT).as_posix()
        report(
            name,
            [{kk: v for kk, v in r.items() if not kk.startswith("_")} for r in rows + [ref]],
            {**config, **loadavg(before)},
        )


if __name__ == "__main__":
    main()
