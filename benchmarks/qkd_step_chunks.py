"""QKD steps in length-sorted chunks against one forward over the whole batch, on a finished quick
start's own teacher and data.

    python -m benchmarks.qkd_step_chunks --run runs/quickstart [--seeds 0] [--steps 200] [--chunks 0,auto]
        [--work runs/bench/qkd_step_chunks] [--name qkd_step_chunks]

The chosen student's QKD run of ``--run`` (its ``qkd/<student>/config.yaml``: teacher, query pool,
student, loss and schedule) is trained again for ``--steps`` optimizer steps with everything equal but
``step_chunk`` (0 = one forward over the batch, padded to its longest text; ``k`` = length-sorted chunks
of at most ``k`` queries, each padded to its own longest, gradients summed: the same step; ``auto`` = the
count of chunks per step whose padding and passes cost least) and the seed.
Each run's seconds per step (the median interval between steps; validations and checkpoints excluded),
the padded tokens a step runs over, and the quality reached: the QKD validation loss, nDCG@10 of the
teacher's held-out validation queries (what the quick start chooses with) and of the test split, the
student's retention of its teacher, a paired t-test against the whole-batch student of the same seed, and
the quick start's cost model's price of a step at the measured padding (``model_s_per_step``). The
teacher cache of ``--run`` is copied into ``--work``; nothing is written into ``--run``. Finished runs
are reused when the benchmark is run again.

Writes ``benchmarks/results/<--name>.json`` (default ``qkd_step_chunks.json``).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import portable, write_results
from benchmarks.qkd_bucketing import Scorer, base_config, paired_ps, quality, timed_distill
from scalingnote.distill import DistillConfig
from scalingnote.distill.batches import cheapest_chunks, epoch_order, length_chunks
from scalingnote.distill.data import prepare_data, token_lengths
from scalingnote.models import load_tower

NAME = "qkd_step_chunks"


def train_one(base: DistillConfig, work: Path, seed: int, chunk: int | str, steps: int) -> dict[str, Any]:
    """One QKD run of ``steps`` steps (reused when it finished with the same settings); its timings."""
    label = f"c{chunk}_s{seed}"
    out = work / label
    want = {"seed": seed, "step_chunk": chunk, "steps": steps}
    done = out / "bench.json"
    if done.exists() and json.loads(done.read_text())["settings"] == want:
        return json.loads(done.read_text())
    cfg = replace(
        base,
        output_dir=str(out),
        seed=seed,
        step_chunk=None if chunk == "auto" else int(chunk),  # null: auto
        optim=replace(base.optim, max_steps=steps, max_seconds=None),
    )
    rec, _ = timed_distill(cfg, label, want, out, NAME)
    done.write_text(json.dumps(rec, indent=1))
    return rec


def padded_per_step(cfg: DistillConfig, student_dir: Path, seed: int, chunk: int | str, steps: int) -> dict[str, float]:
    """Mean tokens a step runs over (padded, in chunks of ``chunk``) and holds (real), over the first
    ``steps`` batches of ``seed``'s split and permutations (the student's tokenizer)."""
    data = prepare_data(replace(cfg, seed=seed, rank_weight=0.0))
    lengths = token_lengths(load_tower(student_dir), data.texts)
    tr, bs = data.train_idx, min(cfg.optim.batch_size, len(data.train_idx))
    spe = max(1, len(tr) // bs)
    batches = np.concatenate([epoch_order(tr, seed, e)[: spe * bs].reshape(spe, bs) for e in range(-(-steps // spe))])[
        :steps
    ]
    cut = (
        (lambda b: cheapest_chunks(b, lengths))
        if chunk == "auto"
        else (lambda b: length_chunks(b, lengths, int(chunk)))
    )
    parts = [cut(b) for b in batches]
    padded = sum(len(p) * int(lengths[p].max()) for ps in parts for p in ps)
    real = float(sum(lengths[b].sum() for b in batches))
    return {
        "chunks_per_step": round(sum(len(ps) for ps in parts) / len(parts), 2),
        "padded_tokens_per_step": round(padded / len(batches), 1),
        "real_tokens_per_step": round(real / len(batches), 1),
        "pad_share": round(1 - real / padded, 4),
    }


def model_price(fam: str, layers: int, padded_tokens: float) -> float:
    """The quick start's cost model's seconds for one step of a ``layers``-layer student of ``fam`` whose
    batch runs over ``padded_tokens`` padded tokens per text (2 idle cores, the machine it is priced at;
    :func:`scalingnote.quickstart.cost.qkd_step_seconds` with the measured padding)."""
    from scalingnote.quickstart.cost import QKD_FIXED_S, QKD_LAYER_TOKEN_S, QKD_TRAINER_S

    return round(QKD_FIXED_S[fam] + QKD_LAYER_TOKEN_S[fam] * layers * padded_tokens + QKD_TRAINER_S, 4)


def student_kind(run_dir: Path) -> str:
    """The saved student's tower kind ("bert" or "llm")."""
    return str(json.loads((run_dir / "query_tower" / "tower.json").read_text()).get("kind", "bert"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a finished quick-start run directory (read only)")
    ap.add_argument("--work", type=Path, default=Path("runs/bench/qkd_step_chunks"))
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument(
        "--chunks", default="0,auto", help="step_chunk values (an integer or auto); the first is the reference"
    )
    ap.add_argument("--name", default=NAME, help="results file name (benchmarks/results/<name>.json)")
    args = ap.parse_args()
    run, work = args.run.resolve(), args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    base, teacher, data_dir = base_config(run, work)
    seeds = [int(s) for s in args.seeds.split(",")]
    chunks: list[int | str] = [c if c == "auto" else int(c) for c in args.chunks.split(",")]
    config = {
        "run": portable(run),
        "inputs": "the quick start's chosen student's QKD config, teacher and teacher cache (copied), re-run with "
        "only step_chunk and seed changed, for the same steps",
        "teacher": portable(teacher),
        "student": base.student.model,
        "batch_size": base.optim.batch_size,
        "query_max_length": base.student.max_length,
        "rank_weight": base.rank_weight,
        "steps": args.steps,
        "chunks": chunks,
        "s_per_step": "median interval between consecutive optimizer steps (validations and checkpoints excluded)",
        "val": "the teacher's held-out training queries (what the quick start chooses on)",
        "test": "test split (never chosen on)",
        "cpus": os.cpu_count(),
    }
    scorer = Scorer(teacher, data_dir)
    rows: list[dict[str, Any]] = [
        {"setting": "teacher", "val_ndcg@10": round(scorer.t_val, 4), "ndcg@10": round(scorer.t_test, 4)}
    ]
    for seed in seeds:
        ref: tuple[dict, Any] | None = None
        for chunk in chunks:
            rec = train_one(base, work, seed, chunk, args.steps)
            d = Path(rec["run_dir"])
            m = json.loads((d / "run.json").read_text())["metrics"]
            sc, per_q = scorer.student(d)
            row: dict[str, Any] = {
                "setting": "student",
                "seed": seed,
                "step_chunk": chunk,
                "steps": m["steps_run"],
                "train_seconds": m["train_seconds"],
                "s_per_step": rec["s_per_step"],
                **(tok := padded_per_step(base, d / "query_tower", seed, chunk, args.steps)),
                "model_s_per_step": model_price(
                    "bert" if student_kind(d) == "bert" else "llm",
                    int(m["student_layers"]),
                    tok["padded_tokens_per_step"] / base.optim.batch_size,
                ),
                **quality(sc, m, scorer.t_val, scorer.t_test),
                "loadavg_before": rec["loadavg_before"],
                "loadavg_after": rec["loadavg_after"],
            }
            if ref is None:
                ref = (row, per_q)
            else:
                row.update(paired_ps(per_q, ref[1], "vs_whole"))
                row["step_speedup"] = round(ref[0]["s_per_step"] / rec["s_per_step"], 3)
                row["val_loss_delta"] = round(row["val_loss"] - ref[0]["val_loss"], 6)
            rows.append(row)
            write_results(args.name, rows, config)


if __name__ == "__main__":
    main()
