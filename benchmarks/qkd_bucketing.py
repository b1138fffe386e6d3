"""QKD with and without length-bucketed batches, on a finished quick start's own teacher and data.

    python -m benchmarks.qkd_bucketing --run runs/quickstart [--seeds 0,1] [--steps 200] [--seconds 120]
        [--window 8] [--work runs/bench/qkd_bucketing] [--name qkd_bucketing]

The chosen student's QKD run of ``--run`` (its ``qkd/<student>/config.yaml``: the teacher the run chose,
its query pool of logged queries, pseudo-queries and corpus texts, its student, loss and schedule) is
trained again with everything equal but ``length_buckets`` (0 = batches padded to the longest text of
a slice of the seeded permutation; ``--window`` = length-bucketed, :mod:`scalingnote.distill.batches`)
and the seed, in two settings:

- ``same_steps``: ``--steps`` optimizer steps, no time box: seconds per step (the median interval between
  steps; validations and checkpoints excluded) and the quality reached in the same steps;
- ``same_time``: the quick start's time box of ``--seconds`` (``optim.max_seconds``; the step count
  re-planned at the measured pace, up to the CPU cap of 600 steps): the steps reached and their quality.

Every student is scored against the teacher's document embeddings on the teacher's held-out validation
queries (what the quick start chooses with) and on the test split, beside the teacher itself
(``retention_*`` = student / teacher nDCG@10), with a paired t-test of the bucketed student against
the unbucketed one of the same seed and setting. The teacher cache of ``--run`` is copied into
``--work`` (the teacher is not run again); nothing is written into ``--run``. Training runs that
finished are reused when the benchmark is run again; the results file is rewritten after every run.

Writes ``benchmarks/results/<--name>.json`` (default ``qkd_bucketing.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import chosen_student, portable, write_results
from scalingnote.config import load_config
from scalingnote.distill import DistillConfig, distill
from scalingnote.distill.batches import bucketed_batches, epoch_order, padded_tokens
from scalingnote.distill.data import prepare_data, token_lengths
from scalingnote.models import load_tower
from scalingnote.quickstart.config import CPU_QKD_STEPS

NAME = "qkd_bucketing"


def base_config(run: Path, work: Path) -> tuple[DistillConfig, Path, Path]:
    """The chosen student's QKD config of ``run``, pointed at ``work`` (its own output, feature cache
    and a copy of the run's teacher cache); the teacher directory and the data directory."""
    res = json.loads((run / "results.json").read_text())
    student = chosen_student(res["choices"])
    qkd_dir = Path(student["dir"]).parent
    cfg = load_config(DistillConfig, qkd_dir / "config.yaml")
    cache = work / "teacher_cache"
    if not (cache / "meta.json").exists():
        shutil.copytree(qkd_dir / "teacher_cache", cache, dirs_exist_ok=True)
    cfg = replace(
        cfg,
        cache_dir=str(cache),
        feature_cache_dir=str(work / "features"),
        show_progress=False,
        optim=replace(cfg.optim, max_seconds=None),
    )
    teacher = Path(cfg.teacher)
    data_dir = Path(cfg.eval_data or json.loads((teacher / "run.json").read_text())["config"]["data"]["data_dir"])
    return cfg, teacher, data_dir


def train_one(base: DistillConfig, work: Path, setting: str, seed: int, window: int, steps: int, seconds: float):
    """One QKD run (reused when it finished with the same settings); its timings."""
    label = f"{setting}_b{window}_s{seed}"
    out = work / label
    want = {"setting": setting, "seed": seed, "length_buckets": window, "steps": steps, "seconds": seconds}
    done = out / "bench.json"
    if done.exists() and json.loads(done.read_text())["settings"] == want:
        return json.loads(done.read_text())
    o = base.optim
    optim = (
        replace(o, max_steps=steps, max_seconds=None)
        if setting == "same_steps"
        else replace(o, max_steps=CPU_QKD_STEPS, max_seconds=seconds)
    )
    cfg = replace(base, output_dir=str(out), seed=seed, length_buckets=window, optim=optim)
    rec, metrics = timed_distill(cfg, label, want, out, NAME)
    rec["s_per_step_mean"] = round(float(metrics["train_seconds"]) / max(1, metrics["steps_run"]), 4)
    done.write_text(json.dumps(rec, indent=1))
    return rec


def timed_distill(
    cfg: DistillConfig, label: str, want: dict[str, Any], out: Path, name: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train ``cfg`` from nothing, timing every optimizer step: the benchmark's record of the run
    (seconds per step = the median interval between steps, wall time, load before and after) and
    the run's metrics."""
    stamps: list[float] = []
    load = os.getloadavg()
    t0 = time.perf_counter()
    print(f"[{name}] {label}: training", flush=True)
    metrics = distill(cfg, resume=False, on_step=lambda _s: stamps.append(time.perf_counter()))
    gaps = np.diff(stamps)
    rec = {
        "settings": want,
        "label": label,
        "run_dir": str(out),
        "wall_s": round(time.perf_counter() - t0, 1),
        "s_per_step": round(float(np.median(gaps)), 4) if len(gaps) else float("nan"),
        "loadavg_before": round(load[0], 2),
        "loadavg_after": round(os.getloadavg()[0], 2),
    }
    return rec, metrics


def token_stats(cfg: DistillConfig, student_dir: Path, seed: int, window: int, steps: int) -> dict[str, dict]:
    """Mean tokens a step runs over (padded) and holds (real), unbucketed and bucketed, over the
    first ``steps`` batches of ``seed``'s split and permutations (the student's tokenizer)."""
    data = prepare_data(replace(cfg, seed=seed, rank_weight=0.0))
    lengths = token_lengths(load_tower(student_dir), data.texts)
    tr, bs = data.train_idx, min(cfg.optim.batch_size, len(data.train_idx))
    spe = max(1, len(tr) // bs)
    out: dict[str, dict] = {}
    for b in (0, window):
        batches = []
        for epoch in range(-(-steps // spe)):
            if b:
                batches.append(bucketed_batches(tr, lengths, bs, spe, seed, epoch, b))
            else:
                batches.append(epoch_order(tr, seed, epoch)[: spe * bs].reshape(spe, bs))
        first = np.concatenate(batches)[:steps]
        padded = padded_tokens(first, lengths) / len(first)
        real = float(lengths[first].sum()) / len(first)
        out[str(b)] = {
            "padded_tokens_per_step": round(padded, 1),
            "real_tokens_per_step": round(real, 1),
            "pad_share": round(1 - real / padded, 4),
        }
    return out


def quality(sc: Any, metrics: dict[str, Any], t_val: float, t_test: float) -> dict[str, Any]:
    """A scored student's QKD validation loss, nDCG@10 on validation and test, and its retention of the
    teacher (student / teacher nDCG@10 on each)."""
    return {
        "val_loss": round(float(metrics["qkd_val_loss"]), 5),
        "val_ndcg@10": round(sc.val_ndcg, 4),
        "ndcg@10": round(float(sc.metrics["ndcg@10"]), 4),
        "retention_val": round(sc.val_ndcg / t_val, 4),
        "retention_test": round(float(sc.metrics["ndcg@10"]) / t_test, 4),
    }


def paired_ps(a: tuple[dict, dict], b: tuple[dict, dict], suffix: str) -> dict[str, float]:
    """Paired t-tests of two students' per-query nDCG@10 (validation, test): ``val_p_<suffix>``, ``p_<suffix>``."""
    from scalingnote.evaluation.significance import paired_ttest

    out = {}
    for i, prefix in enumerate(("val_", "")):
        keys = sorted(a[i])
        out[f"{prefix}p_{suffix}"] = round(paired_ttest([a[i][k] for k in keys], [b[i][k] for k in keys]).pvalue, 4)
    return out


class Scorer:
    """Scores students against the teacher's document embeddings; the evaluation set, the teacher's
    scores and every student's are computed once per benchmark run."""

    def __init__(self, teacher: Path, data_dir: Path) -> None:
        from scalingnote.quickstart.scoring import TowerPool, load_eval_set, score

        self.teacher, self.ev, self.pool = teacher, load_eval_set(data_dir, "test", teacher, None), TowerPool()
        t = score(self.pool, teacher / "query_tower", teacher, self.ev)
        self.t_val, self.t_test = t.val_ndcg, float(t.metrics["ndcg@10"])
        self._students: dict[str, tuple[Any, tuple[dict, dict]]] = {}

    def student(self, run_dir: Path) -> tuple[Any, tuple[dict, dict]]:
        """The student's scores and its per-query nDCG@10 (validation, test)."""
        from scalingnote.quickstart.scoring import per_query_ndcg, score

        key = str(run_dir)
        if key not in self._students:
            sc = score(self.pool, run_dir / "query_tower", self.teacher, self.ev)
            self._students[key] = (sc, (per_query_ndcg(sc.val_run, self.ev.val_qrels), sc.per_query))
        return self._students[key]


def score_rows(records: list[dict], scorer: Scorer, tokens: dict) -> list[dict[str, Any]]:
    """A row per trained student (and the teacher's), with retention and paired tests against the
    unbucketed student of the same setting and seed."""
    t_val, t_test = scorer.t_val, scorer.t_test
    rows: list[dict[str, Any]] = [
        {
            "setting": "teacher",
            "val_ndcg@10": round(t_val, 4),
            "ndcg@10": round(t_test, 4),
            "n_val": len(scorer.ev.val_qids),
        }
    ]
    per_q: dict[str, tuple[dict, dict]] = {}
    for rec in records:
        d = Path(rec["run_dir"])
        m = json.loads((d / "run.json").read_text())["metrics"]
        sc, per_q[rec["label"]] = scorer.student(d)
        s = rec["settings"]
        row: dict[str, Any] = {
            "setting": s["setting"],
            "seed": s["seed"],
            "length_buckets": s["length_buckets"],
            "steps": m["steps_run"],
            "planned_steps": m["steps"],
            "best_step": m["best_step"],
            "train_seconds": m["train_seconds"],
            "s_per_step": rec["s_per_step"],
            "s_per_step_mean": rec["s_per_step_mean"],
            **tokens[str(s["seed"])][str(s["length_buckets"])],
            **quality(sc, m, t_val, t_test),
            "loadavg_before": rec["loadavg_before"],
            "loadavg_after": rec["loadavg_after"],
        }
        ref = f"{s['setting']}_b0_s{s['seed']}"
        if s["length_buckets"] and ref in per_q:
            row.update(paired_ps(per_q[rec["label"]], per_q[ref], "vs_unbucketed"))
            off = next(r for r in rows if r.get("label") == ref)
            row["step_speedup"] = round(off["s_per_step"] / rec["s_per_step"], 3)
        row["label"] = rec["label"]
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a finished quick-start run directory (read only)")
    ap.add_argument("--work", type=Path, default=Path("runs/bench/qkd_bucketing"))
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=200, help="steps of the same-steps setting")
    ap.add_argument("--seconds", type=float, default=120.0, help="time box of the same-time setting")
    ap.add_argument("--window", type=int, default=8, help="length_buckets of the bucketed runs")
    ap.add_argument("--settings", default="same_steps,same_time")
    ap.add_argument("--name", default=NAME, help="results file name (benchmarks/results/<name>.json)")
    args = ap.parse_args()
    run, work = args.run.resolve(), args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    base, teacher, data_dir = base_config(run, work)
    seeds = [int(s) for s in args.seeds.split(",")]
    settings = [s for s in args.settings.split(",") if s]
    config = {
        "run": portable(run),
        "inputs": "the quick start's chosen student's QKD config, teacher and teacher cache (copied), re-run with "
        "only length_buckets, seed and steps / time box changed",
        "teacher": portable(teacher),
        "student": base.student.model,
        "batch_size": base.optim.batch_size,
        "lr": base.optim.lr,
        "query_max_length": base.student.max_length,
        "rank_weight": base.rank_weight,
        "target": base.target,
        "seeds": seeds,
        "settings": settings,
        "same_steps": args.steps,
        "same_time_seconds": args.seconds,
        "same_time_step_cap": CPU_QKD_STEPS,
        "window": args.window,
        "s_per_step": "median interval between consecutive optimizer steps (validations and checkpoints excluded)",
        "val": "the teacher's held-out training queries (what the quick start chooses on)",
        "test": "test split (never chosen on)",
        "cpus": os.cpu_count(),
    }
    records: list[dict] = []
    scorer = Scorer(teacher, data_dir)
    tokens: dict[str, dict] = {}
    planned = [(st, seed, w) for seed in seeds for st in settings for w in (0, args.window)]
    for i, (setting, seed, window) in enumerate(planned):
        records.append(train_one(base, work, setting, seed, window, args.steps, args.seconds))
        if str(seed) not in tokens:
            tokens[str(seed)] = token_stats(
                base, Path(records[-1]["run_dir"]) / "query_tower", seed, args.window, args.steps
            )
        rows = score_rows(records, scorer, tokens)
        config["complete"] = i == len(planned) - 1
        config["runs_done"] = f"{i + 1} of {len(planned)}"
        print(json.dumps(rows[-1]), flush=True)
        print(write_results(args.name, rows, config), flush=True)


if __name__ == "__main__":
    main()
