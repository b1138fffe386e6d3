"""Stage I benchmark: zero-shot starting points, TwinBERT, ScalingDoc and ScalingDual trained with
the same data and step budget on a BEIR set (train -> test).

    python -m benchmarks.stage1 --data scifact [--llm-layers 4] [--steps 60]

Writes benchmarks/results/stage1_<data>.json (one row per method) and keeps the trained
towers under .cache/bench/stage1_<data>/<method>/ (QKD reuses the ScalingDual towers).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks._common import REPO_ROOT, shared_data_dir, write_results


def zero_shot_row(
    name: str,
    model: str,
    data,
    num_layers: int | None,
    dim_eval: int | None,
    batch: int,
    tau: float,
    doc_len: int,
    q_len: int,
    llm_pooling: str | None = None,
) -> dict:
    from scalingnote.evaluation.dense import dense_metrics, truncate_normalize
    from scalingnote.models import load_tower, load_tower_pair

    t0 = time.perf_counter()
    if model.startswith("smollm2"):
        if llm_pooling == "mean":
            qt = load_tower(model, "query", num_layers=num_layers, dim=None, max_query_length=q_len, pooling="mean")
            dt = load_tower(model, "document", num_layers=num_layers, dim=None, max_doc_length=doc_len, pooling="mean")
        else:
            qt, dt = load_tower_pair(
                model, num_layers=num_layers, dim=None, max_query_length=q_len, max_doc_length=doc_len
            )
    else:
        qt = load_tower(model, "query", dim=None, max_query_length=q_len)
        dt = load_tower(model, "document", dim=None, max_doc_length=doc_len)
    doc_ids = list(data.corpus)
    d = truncate_normalize(dt.encode_documents([data.corpus[i] for i in doc_ids], batch_size=batch), dim_eval)
    qids = list(data.eval_queries)
    q = truncate_normalize(qt.encode_queries([data.eval_queries[x] for x in qids], batch_size=batch), dim_eval)
    m = dense_metrics(q, qids, d, doc_ids, data.eval_qrels, tau=tau)
    return {
        "method": name,
        "query_tower": model,
        "doc_tower": model,
        "query_layers": qt.config.num_layers,
        "doc_layers": dt.config.num_layers,
        "query_non_embedding_params": qt.non_embedding_params,
        "dim": qt.out_dim,
        "train_steps": 0,
        "train_seconds": 0.0,
        **{k: round(v, 4) for k, v in m.items()},
        "eval_seconds": round(time.perf_counter() - t0, 1),
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="scifact")
    ap.add_argument("--llm-layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--methods", default="zero_shot_minilm,zero_shot_smollm2,twinbert,scaling_doc,scaling_dual")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--doc-max-length", type=int, default=256)
    ap.add_argument("--query-max-length", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--head-lr", type=float, default=1e-3)
    ap.add_argument(
        "--llm-pooling",
        choices=["mean", "placeholder"],
        default="mean",
        help="SmolLM2 towers: mean pooling (default; not in the paper) or the paper's placeholder pooling (§3.2)",
    )
    ap.add_argument("--projection-init", choices=["pca", "orthogonal"], default="pca")
    ap.add_argument("--name", default=None, help="results name (default stage1_<data>)")
    return ap.parse_args()


def tower_choices(llm_layers: int) -> dict[str, tuple]:
    """method -> (query model, query layers, document model, document layers)."""
    return {
        "twinbert": ("minilm-l6", None, "minilm-l6", None),
        "scaling_doc": ("minilm-l6", None, "smollm2-135m", llm_layers),
        "scaling_dual": ("smollm2-135m", llm_layers, "smollm2-135m", llm_layers),
    }


def train_config(method: str, args, data_dir: Path, work: Path):
    """The Stage I training config of a trained method (same data and step budget for all)."""
    from scalingnote.config import load_config
    from scalingnote.training import TrainConfig

    qm, ql, dm, dl = tower_choices(args.llm_layers)[method]
    qp = "mean" if qm.startswith("smollm2") and args.llm_pooling == "mean" else None
    dp = "mean" if dm.startswith("smollm2") and args.llm_pooling == "mean" else None
    return load_config(
        TrainConfig,
        {
            "method": method,
            "output_dir": str(work / method),
            "query_tower": {"model": qm, "num_layers": ql, "pooling": qp, "max_length": args.query_max_length},
            "doc_tower": {"model": dm, "num_layers": dl, "pooling": dp, "max_length": args.doc_max_length},
            "data": {
                "data_dir": str(data_dir),
                "neg_skip_top": 10,
                "neg_max_rank": 100,
                "validation_fraction": 0.1,
            },
            "optim": {
                "batch_size": args.batch_size,
                "micro_batch_size": args.micro_batch_size,
                "max_steps": args.steps,
                "epochs": 100.0,
                "lr": args.lr,
                "head_lr": args.head_lr,
            },
            "seed": args.seed,
            "save_every": 20,
            "evaluate_zero_shot": True,  # init_* columns: the start of training (after the centre / W init)
            "projection_init": args.projection_init,
        },
    )


def trained_row(method: str, args, data_dir: Path, work: Path) -> dict:
    """Train ``method`` (resuming) and evaluate it on the test split."""
    from scalingnote.training import train

    towers = tower_choices(args.llm_layers)
    cfg = train_config(method, args, data_dir, work)
    res = train(cfg, resume=True)
    return {
        "method": method,
        "query_tower": towers[method][0],
        "doc_tower": towers[method][2],
        "query_layers": towers[method][1] or 6,
        "doc_layers": towers[method][3] or 6,
        "query_non_embedding_params": res["query_tower_non_embedding_params"],
        "dim": cfg.dim,
        "train_steps": res["total_steps"],
        "train_seconds": res["train_seconds"],
        **{f"init_{k}": round(res[f"zero_shot_{k}"], 4) for k in ("ndcg@10", "r@100")},
        **{
            k: round(res[k], 4)
            for k in ("ndcg@10", "r@100", "recall@100", "mrr@10", "contrastive_ppl", "val_contrastive_ppl")
        },
        "eval_seconds": res["eval_seconds"],
    }


def main() -> None:
    args = parse_args()

    from scalingnote.training.data import load_training_data

    data_dir = shared_data_dir() / args.data
    name = args.name or f"stage1_{args.data}"
    work = REPO_ROOT / ".cache" / "bench" / name
    methods = args.methods.split(",")

    rows = []
    base_cfg = train_config("twinbert", args, data_dir, work)
    data = load_training_data(base_cfg.data, base_cfg.seed)
    tau = base_cfg.loss.tau
    for method in methods:
        if method == "zero_shot_minilm":
            rows.append(zero_shot_row(method, "minilm-l6", data, None, None, 64, tau, 256, args.query_max_length))
        elif method == "zero_shot_smollm2":
            rows.append(
                zero_shot_row(
                    method,
                    "smollm2-135m",
                    data,
                    args.llm_layers,
                    None,
                    32,
                    tau,
                    args.doc_max_length,
                    args.query_max_length,
                    args.llm_pooling,
                )
            )
        else:
            rows.append(trained_row(method, args, data_dir, work))
        print(rows[-1], flush=True)
    write_results(
        name,
        rows,
        {
            "data": args.data,
            "split": "train -> test",
            "llm": f"smollm2-135m truncated to {args.llm_layers} layers",
            "bert": "minilm-l6 (6 layers, mean pooling)",
            "steps": args.steps,
            "batch_size": args.batch_size,
            "micro_batch_size": args.micro_batch_size,
            "hard_negatives": "BM25 ranks 11..100",
            "tau": tau,
            "contrastive_ppl": "test qrels, W=256 random non-relevant docs, seed 42, cosine/tau",
            "seed": args.seed,
            "doc_max_length": args.doc_max_length,
            "lr": args.lr,
            "head_lr": args.head_lr,
            "center": "mean pooled state subtracted before W (TrainConfig.center)",
            "projection_init": args.projection_init,
            "init_columns": "init_* = the trained methods' starting point (pre-trained backbones + centre + "
            "initial W), same eval",
            "llm_pooling": (
                "mean (not in the paper): query = mean over text+EOS; document views = means of the §3.2 prompt "
                "segments ending before each placeholder, [EMB] view = the whole prompt"
                if args.llm_pooling == "mean"
                else "placeholder (§3.2): last query token / state before each placeholder"
            ),
            "zero_shot": "no projection (hidden size), MiniLM mean pooling, SmolLM2 with the llm_pooling above",
        },
    )


if __name__ == "__main__":
    main()
