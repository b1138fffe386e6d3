"""Stage II benchmark (ScalingNote Table 6 style): distil the ScalingDual query tower of
`benchmarks/stage1.py` into MiniLM students of several depths and compare every query tower.

    python -m benchmarks.stage1 --data scifact ...      # first: trains scaling_dual / scaling_doc
    python -m benchmarks.qkd --data scifact [--layers 1,2,4,6]

Rows: student_<L>l (QKD students + frozen ScalingDual document embeddings = ScalingNote),
scaling_dual (the teacher) and scaling_doc, each with non-embedding parameters, query
QPS (batch 256, 2 threads), nDCG@10, R@100, and the QKD train / validation loss.
Writes benchmarks/results/qkd_<data>.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks._common import REPO_ROOT, shared_data_dir, write_results


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="scifact")
    ap.add_argument("--layers", default="1,2,4,6")
    ap.add_argument("--epochs", type=float, default=5.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--max-pseudo", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument(
        "--stage1",
        default=None,
        help="directory with the Stage I runs scaling_dual/ and scaling_doc/ (default .cache/bench/stage1_<data>; "
        "a quick-start run's <out>/stage1 works too)",
    )
    return ap.parse_args()


def student_rows(args, s1: Path, work: Path, data_dir: Path, pseudo: Path, test_texts: list[str]) -> list[dict]:
    """Distil the ScalingDual query tower into a MiniLM student per ``--layers`` depth -> one row each."""
    from scalingnote.config import load_config
    from scalingnote.distill import DistillConfig, distill
    from scalingnote.models import load_tower
    from scalingnote.quickstart import query_qps

    rows = []
    for L in [int(x) for x in args.layers.split(",")]:
        cfg = load_config(
            DistillConfig,
            {
                "teacher": str(s1 / "scaling_dual"),
                "output_dir": str(work / f"student_{L}l"),
                "cache_dir": str(work / "teacher_cache"),
                "student": {"model": "minilm-l6", "num_layers": L, "max_length": 64},
                "queries": [{"path": str(data_dir), "split": "train"}, {"path": str(pseudo / "queries.jsonl")}],
                "optim": {"batch_size": args.batch_size, "epochs": args.epochs},
                "eval_data": str(data_dir),
                "seed": args.seed,
            },
        )
        res = distill(cfg)
        st = load_tower(work / f"student_{L}l" / "query_tower")
        rows.append(
            {
                "method": f"student_{L}l",
                "query_tower": f"minilm-l6 truncated to {L} layers (QKD)",
                "non_embedding_params": st.non_embedding_params,
                "query_qps": round(query_qps(st, test_texts), 1),
                "ndcg@10": round(res["ndcg@10"], 4),
                "r@100": round(res["r@100"], 4),
                "qkd_train_loss": round(res["qkd_train_loss"], 4),
                "qkd_val_loss": round(res["qkd_val_loss"], 4) if res["qkd_val_loss"] is not None else None,
                "train_queries": res["train_queries"],
                "train_seconds": res["train_seconds"],
            }
        )
        print(rows[-1], flush=True)
    return rows


def reference_rows(s1: Path, stage1_metrics: dict, test_texts: list[str]) -> list[dict]:
    """The Stage I query towers (scaling_dual, scaling_doc) and the untrained full-depth LLM query
    tower (query cost only)."""
    from scalingnote.models import load_tower
    from scalingnote.quickstart import query_qps

    rows = []
    for m in ("scaling_dual", "scaling_doc"):
        qt = load_tower(s1 / m / "query_tower")
        r = stage1_metrics[m]
        rows.append(
            {
                "method": m,
                "query_tower": f"{qt.config.base_model} ({qt.config.num_layers} layers, {qt.config.pooling} pooling)",
                "non_embedding_params": qt.non_embedding_params,
                "query_qps": round(query_qps(qt, test_texts), 1),
                "ndcg@10": round(r["ndcg@10"], 4),
                "r@100": round(r["r@100"], 4),
                "qkd_train_loss": None,
                "qkd_val_loss": None,
                "train_queries": None,
                "train_seconds": r["train_seconds"],
            }
        )
    # reference: the LLM query tower at the pre-trained depth (30 layers; QPS only, not trained)
    full = load_tower(
        "smollm2-135m", "query", dim=128, pooling=load_tower(s1 / "scaling_dual" / "query_tower").config.pooling
    )
    rows.append(
        {
            "method": "smollm2_full_depth_reference",
            "query_tower": f"smollm2-135m ({full.config.num_layers} layers, untrained; query cost only)",
            "non_embedding_params": full.non_embedding_params,
            "query_qps": round(query_qps(full, test_texts), 1),
            "ndcg@10": None,
            "r@100": None,
            "qkd_train_loss": None,
            "qkd_val_loss": None,
            "train_queries": None,
            "train_seconds": None,
        }
    )
    return rows


def main() -> None:
    args = parse_args()

    import torch

    from scalingnote.data import load_beir
    from scalingnote.data.pseudo import ICTConfig, ict_queries

    torch.set_num_threads(2)
    data_dir = shared_data_dir() / args.data
    s1 = Path(args.stage1).resolve() if args.stage1 else REPO_ROOT / ".cache" / "bench" / f"stage1_{args.data}"
    work = REPO_ROOT / ".cache" / "bench" / f"qkd_{args.data}"
    stage1_metrics = {
        m: json.loads((s1 / m / "run.json").read_text())["metrics"] for m in ("scaling_dual", "scaling_doc")
    }
    pseudo = work / "pseudo_ict"
    if not (pseudo / "queries.jsonl").exists():
        ict_queries(data_dir / "corpus.jsonl", pseudo, ICTConfig(seed=args.seed, max_docs=args.max_pseudo))
    ds = load_beir(data_dir, "test")
    test_texts = [q.text for q in ds.queries.values()]

    rows = student_rows(args, s1, work, data_dir, pseudo, test_texts)
    rows += reference_rows(s1, stage1_metrics, test_texts)
    write_results(
        f"qkd_{args.data}",
        rows,
        {
            "teacher": f"scaling_dual of {s1.relative_to(REPO_ROOT) if s1.is_relative_to(REPO_ROOT) else s1}",
            "students": "minilm-l6 truncated",
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "lr": 3e-4,
            "lambda": 1.0,
            "queries": "train split queries + ICT pseudo-queries (test queries removed)",
            "qps": "encode_queries, batch 256, torch threads 2",
            "seed": args.seed,
        },
    )


if __name__ == "__main__":
    main()
