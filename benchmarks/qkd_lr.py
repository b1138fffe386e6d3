"""QKD's peak learning rate at the step count a budget leaves, on a finished quick start's own teacher and data.

    python -m benchmarks.qkd_lr --run runs/quickstart [--lrs 3e-4,1e-3,2e-3] [--seeds 0,1] [--steps 200]
        [--work runs/bench/qkd_lr] [--name qkd_lr]

A budgeted quick start on a small machine cuts QKD to a few hundred steps (SciFact's 10-minute budget:
200, the floor), while its learning rate is the paper's (Table 7, stage II: 3e-4, 10% warm-up then
linear decay), set for 40,000-query batches and many more steps. The chosen student's QKD run of
``--run`` (its ``qkd/<student>/config.yaml``: teacher, query pool, student, loss, batch) is trained again
for ``--steps`` steps with everything equal but the peak learning rate and the seed. Every student is
scored against the teacher's document embeddings on the teacher's held-out validation queries (what the
quick start chooses with) and on the test split, beside the teacher (``retention_*`` = student /
teacher nDCG@10), with a paired t-test against the first learning rate of ``--lrs`` at the same seed.
The teacher cache of ``--run`` is copied into ``--work`` (the teacher is not run again); nothing is
written into ``--run``. Finished runs are reused; the results file is rewritten after every run.

Writes ``benchmarks/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._common import portable, write_results
from benchmarks.qkd_bucketing import Scorer, base_config, paired_ps, quality
from scalingnote.distill import DistillConfig, distill

NAME = "qkd_lr"


def train_one(base: DistillConfig, work: Path, lr: float, seed: int, steps: int) -> dict[str, Any]:
    """One QKD run of ``steps`` steps at peak ``lr`` (reused when it finished with the same settings)."""
    label = f"lr{lr:g}_s{seed}"
    out = work / label
    want = {"lr": lr, "seed": seed, "steps": steps}
    done = out / "bench.json"
    if done.exists() and json.loads(done.read_text())["settings"] == want:
        return dict(json.loads(done.read_text()))
    optim = replace(base.optim, lr=lr, max_steps=steps, max_seconds=None)
    cfg = replace(base, output_dir=str(out), seed=seed, optim=optim)
    load = os.getloadavg()
    t0 = time.perf_counter()
    print(f"[{NAME}] {label}: training {steps} steps", flush=True)
    distill(cfg, resume=False)
    rec = {
        "settings": want,
        "label": label,
        "run_dir": str(out),
        "wall_s": round(time.perf_counter() - t0, 1),
        "loadavg_before": round(load[0], 2),
        "loadavg_after": round(os.getloadavg()[0], 2),
    }
    done.write_text(json.dumps(rec, indent=1))
    return rec


def score_rows(records: list[dict], scorer: Scorer, ref_lr: float) -> list[dict[str, Any]]:
    """A row per trained student (and the teacher's): nDCG@10 on validation and test, retention, and
    paired tests against the ``ref_lr`` student of the same seed."""
    t_val, t_test = scorer.t_val, scorer.t_test
    rows: list[dict[str, Any]] = [
        {
            "setting": "teacher",
            "val_ndcg@10": round(t_val, 4),
            "ndcg@10": round(t_test, 4),
            "n_val": len(scorer.ev.val_qids),
        }
    ]
    per_q: dict[tuple[float, int], tuple[dict, dict]] = {}
    for rec in records:
        d, s = Path(rec["run_dir"]), rec["settings"]
        m = json.loads((d / "run.json").read_text())["metrics"]
        sc, per_q[(s["lr"], s["seed"])] = scorer.student(d)
        row: dict[str, Any] = {
            "setting": "student",
            "lr": s["lr"],
            "seed": s["seed"],
            "steps": m["steps_run"],
            "best_step": m["best_step"],
            "train_seconds": m["train_seconds"],
            **quality(sc, m, t_val, t_test),
            "loadavg_before": rec["loadavg_before"],
            "loadavg_after": rec["loadavg_after"],
        }
        ref = per_q.get((ref_lr, s["seed"]))
        if s["lr"] != ref_lr and ref is not None:
            row.update(paired_ps(per_q[(s["lr"], s["seed"])], ref, f"vs_lr{ref_lr:g}"))
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a finished quick-start run directory (read only)")
    ap.add_argument("--work", type=Path, default=Path("runs/bench/qkd_lr"))
    ap.add_argument("--lrs", default="3e-4,1e-3,2e-3", help="peak learning rates; the first is the reference")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--name", default=NAME, help="results file name (benchmarks/results/<name>.json)")
    args = ap.parse_args()
    run, work = args.run.resolve(), args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    base, teacher, data_dir = base_config(run, work)
    lrs = [float(x) for x in args.lrs.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    config = {
        "run": portable(run),
        "data": data_dir.name,
        "inputs": "the quick start's chosen student's QKD config, teacher and teacher cache (copied), re-run with "
        "only the peak learning rate, seed and step count changed",
        "teacher": portable(teacher),
        "student": base.student.model,
        "student_layers": base.student.num_layers,
        "batch_size": base.optim.batch_size,
        "query_max_length": base.student.max_length,
        "rank_weight": base.rank_weight,
        "target": base.target,
        "schedule": f"warm-up {base.optim.warmup_ratio:g} of the steps, then linear decay (Table 7)",
        "lrs": lrs,
        "seeds": seeds,
        "steps": args.steps,
        "val": "the teacher's held-out training queries (what the quick start chooses on)",
        "test": "test split (never chosen on)",
        "cpus": os.cpu_count(),
    }
    planned = [(lr, seed) for seed in seeds for lr in lrs]
    records: list[dict] = []
    scorer = Scorer(teacher, data_dir)
    for i, (lr, seed) in enumerate(planned):
        records.append(train_one(base, work, lr, seed, args.steps))
        rows = score_rows(records, scorer, lrs[0])
        config["complete"] = i == len(planned) - 1
        config["runs_done"] = f"{i + 1} of {len(planned)}"
        print(json.dumps(rows[-1]), flush=True)
        print(write_results(args.name, rows, config), flush=True)


if __name__ == "__main__":
    main()
