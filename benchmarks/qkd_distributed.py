"""QKD (Stage II) in one process vs two torchrun processes (DDP, FSDP2) on SciFact ->
benchmarks/results/qkd_distributed.json.

The same ``scalingnote distill`` config three times, through the CLI:

- ``1proc``: one process (2 torch threads);
- ``ddp2``: ``torchrun --nproc_per_node 2`` with ``distributed: ddp`` (replicated student, averaged gradients);
- ``fsdp2``: ``torchrun --nproc_per_node 2`` with ``distributed: fsdp`` (student, gradients and AdamW
  state sharded by FSDP2, activation checkpointing on);

plus ``start``: the student after its least-squares head fit and before any step (``optim.epochs: 0``).

Teacher: the recipe's depth-2 ScalingDual Stage I run (``python -m benchmarks.recipe`` writes it to
``runs/recipe/scifact/stage1/scaling_dual_d2_lr0.003``; its features are read from the recipe's
feature cache). Student: all-MiniLM-L6-v2 cut to 2 layers, every layer trained; queries: SciFact's
queries minus its test queries, plus the recipe's ICT pseudo-queries when present. The global batch
(128) and the data order are the same in every run, so the runs differ only by how the batch is split
over processes (and by dropout draws: each process has its own RNG stream) — their metrics should
agree to noise, which is what this measures on a real model and real data; the exact equality is
tested on float64 (``tests/distill/test_qkd_distributed.py``). The 2 cores are shared by the two
processes (1 thread each), so the times say little about GPU speed-ups.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from benchmarks._common import REPO_ROOT, shared_data_dir, torchrun_launch, write_results


def make_config(args, out: Path, distributed: str, epochs: float) -> dict:
    data = shared_data_dir() / "scifact"
    queries = [{"path": str(data)}]
    if args.pseudo.exists():
        queries.append({"path": str(args.pseudo)})
    return {
        "teacher": str(args.teacher),
        "output_dir": str(out),
        "student": {"model": "minilm-l6", "num_layers": args.layers, "max_length": 64, "trainable_layers": "all"},
        "queries": queries,
        "lam": 1.0,
        "validation_fraction": 0.05,
        "target": "normalized",
        "optim": {"lr": 3e-4, "batch_size": args.batch, "epochs": epochs},
        "eval_data": str(data),
        "eval_split": "test",
        "cache_dir": str(args.work / "teacher_cache"),
        "feature_cache_dir": str(args.features) if args.features.exists() else None,
        "head_init": "lstsq",
        "patience": 3,
        "seed": args.seed,
        "save_every": 10_000,
        "log_every": 10,
        "show_progress": False,
        "distributed": distributed,
        "fsdp": {"activation_checkpointing": True},
    }


def run(args, name: str, distributed: str, procs: int, epochs: float) -> dict:
    out = args.work / name
    cfg_path = args.work / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(make_config(args, out, distributed, epochs), sort_keys=False))
    cli = ["-m", "scalingnote.cli", "distill", "--config", str(cfg_path), "--no-resume"]
    if procs > 1:
        cmd, env = torchrun_launch(procs, *cli)
    else:
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")])
        cmd = [sys.executable, *cli]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO_ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-4000:]}")
    m = json.loads((out / "run.json").read_text())["metrics"]
    curve = m["val_curve"]
    best = min(curve, key=lambda c: c[1]) if curve else [None, None]
    row = {
        "run": name,
        "processes": procs,
        "distributed": m["distributed"],
        "threads_per_process": 1 if procs > 1 else args.threads,
        "global_batch": args.batch,
        "steps": m["steps"],
        "steps_run": m["steps_run"],
        "best_step": m["best_step"],
        "stopped_early": m["stopped_early"],
        "start_val_loss": curve[0][1] if curve else None,
        "best_val_loss": best[1],
        "qkd_val_loss": m["qkd_val_loss"],
        "ndcg@10": m["ndcg@10"],
        "r@100": m.get("recall@100"),
        "mrr@10": m.get("mrr@10"),
        "train_seconds": m["train_seconds"],
        "steps_per_s": round(m["steps_run"] / m["train_seconds"], 3) if m["train_seconds"] else None,
        "wall_s": round(wall, 1),
        "train_queries": m["train_queries"],
        "validation_queries": m["validation_queries"],
    }
    print(row, flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    recipe = REPO_ROOT / "runs" / "recipe" / "scifact"
    ap.add_argument("--teacher", type=Path, default=recipe / "stage1" / "scaling_dual_d2_lr0.003")
    ap.add_argument("--features", type=Path, default=recipe / "features")
    ap.add_argument("--pseudo", type=Path, default=recipe / "pseudo_ict" / "queries.jsonl")
    ap.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "qkd_distributed")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--epochs", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not (args.teacher / "query_tower").exists():
        raise SystemExit(
            f"{args.teacher}: no Stage I teacher; run `python -m benchmarks.recipe` (SciFact) first or pass --teacher"
        )
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows = [run(args, "start", "ddp", 1, 0.0)]
    rows += [
        run(args, "1proc", "ddp", 1, args.epochs),
        run(args, "ddp2", "ddp", 2, args.epochs),
        run(args, "fsdp2", "fsdp", 2, args.epochs),
    ]
    by = {r["run"]: r for r in rows}
    for name in ("ddp2", "fsdp2"):
        by[name]["ndcg@10_minus_1proc"] = round(by[name]["ndcg@10"] - by["1proc"]["ndcg@10"], 4)
        by[name]["val_loss_minus_1proc"] = round(by[name]["qkd_val_loss"] - by["1proc"]["qkd_val_loss"], 5)
    config = {
        "data": "scifact (test queries excluded from training by id and text)",
        "teacher": str(args.teacher.relative_to(REPO_ROOT) if args.teacher.is_relative_to(REPO_ROOT) else args.teacher),
        "teacher_made_by": "python -m benchmarks.recipe (SciFact): ScalingDual, SmolLM2-135M cut to 2 layers, "
        "heads over cached pooled states",
        "student": f"minilm-l6 (all-MiniLM-L6-v2) cut to {args.layers} layers, every layer trainable, head_init lstsq",
        "pseudo_queries": args.pseudo.exists(),
        "optim": {"lr": 3e-4, "global_batch": args.batch, "epochs": args.epochs, "patience": 3, "target": "normalized"},
        "launch": "scalingnote distill CLI; 2-process runs under torchrun, gloo, CPU, 1 thread per process",
        "seed": args.seed,
        "total_seconds": round(time.perf_counter() - t0, 1),
        "notes": "2 CPU cores; the 1-process run uses both cores as threads, the 2-process runs one core each.",
    }
    print(write_results("qkd_distributed", rows, config))


if __name__ == "__main__":
    main()
