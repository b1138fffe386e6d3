"""Memory per process of FSDP2 vs DDP on a full-depth SmolLM2-135M tower -> benchmarks/results/fsdp_memory.json.

Stage I ``scaling_doc`` (query tower all-MiniLM-L6-v2, document tower SmolLM2-135M at full
depth, 30 layers; ~157M parameters in all), the real :class:`~scalingnote.training.trainer.Trainer`,
2 processes under torchrun, gloo, CPU, fp32, global batch 4 (2 per process), two optimizer
steps. ``distributed: ddp`` keeps a full replica of the towers, their gradients and AdamW
state in every process; ``distributed: fsdp`` shards all three (FSDP2, one unit per
transformer block + the tower root).

Per process (rank), measured on the live tensors (not estimated):

- ``param_mb``: bytes of the parameters the process holds (a DTensor counts its local shard);
- ``grad_mb``: bytes of the gradients after step 2's backward (before the optimizer step);
- ``optim_mb``: bytes of the AdamW state (exp_avg, exp_avg_sq, step) after step 2;
- ``states_mb`` = param + optimizer (the acceptance quantity) and ``states_grads_mb`` with grads;
- ``rss_peak_mb`` (``ru_maxrss``) and ``rss_end_mb`` (resident set at the end): the whole
  process, i.e. including Python, libraries, tokenizers, activations, and — for FSDP — the
  full model as loaded before it was sharded (every rank loads it; a GPU run would build it
  on the meta device), so RSS ratios are much closer to 1 than the state ratios.

Target: FSDP's params + optimizer state <= 60% of DDP's.
The 2 CPU cores are shared with other jobs; this measures memory, not speed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB = 1024**2


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB


def _local_nbytes(t) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def worker(mode: str, out: Path, doc_len: int) -> None:
    import torch

    from scalingnote.config import load_config
    from scalingnote.data import Document
    from scalingnote.training import TrainConfig, build_towers, distributed
    from scalingnote.training.data import Example
    from scalingnote.training.trainer import Trainer

    torch.set_num_threads(1)
    distributed.init_from_env()
    cfg = load_config(
        TrainConfig,
        {
            "method": "scaling_doc",
            "output_dir": str(out / f"run-{mode}"),
            "query_tower": {"model": "minilm-l6", "max_length": 32},
            "doc_tower": {"model": "smollm2-135m", "max_length": doc_len},  # num_layers unset: full depth
            "dim": 128,
            "precision": "fp32",
            "distributed": mode,
            "center": False,
            "projection_init": "orthogonal",
            "fsdp": {"activation_checkpointing": True},
            "optim": {"batch_size": 4, "max_steps": 2},
            "show_progress": False,
        },
    )
    rss0 = _rss_mb()
    q, d = build_towers(cfg, torch.device("cpu"))
    n_params = sum(p.numel() for t in (q, d) for p in t.parameters())
    rss_loaded = _rss_mb()
    words = "dense retrieval with large language model towers scales the document encoder".split()
    exs = [
        Example(
            f"q{i}",
            " ".join(words[i % 5 : i % 5 + 4]),
            Document(f"p{i}", "title", "topic", " ".join(words * 6)),
            Document(f"n{i}", "other", "topic", " ".join(reversed(words * 6))),
        )
        for i in range(8)
    ]
    tr = Trainer(cfg, q, d, exs, torch.device("cpu"))
    q.train(), d.train()
    towers = (q, d)
    t0 = time.perf_counter()
    tr.compute_gradients(tr._batch_for_step(0))
    tr.optimizer_step()
    tr.step = 1
    comps = tr.compute_gradients(tr._batch_for_step(1))
    param_b = sum(_local_nbytes(p) for t in towers for p in t.parameters())
    grad_b = sum(_local_nbytes(p.grad) for t in towers for p in t.parameters() if p.grad is not None)
    tr.optimizer_step()
    optim_b = sum(_local_nbytes(v) for st in tr.optimizer.state.values() for v in st.values() if torch.is_tensor(v))
    step_s = time.perf_counter() - t0
    rec = {
        "mode": mode,
        "rank": distributed.rank(),
        "world_size": distributed.world_size(),
        "sharded": tr.sharded,
        "params_total": n_params,
        "param_mb": round(param_b / MB, 2),
        "grad_mb": round(grad_b / MB, 2),
        "optim_mb": round(optim_b / MB, 2),
        "states_mb": round((param_b + optim_b) / MB, 2),
        "states_grads_mb": round((param_b + grad_b + optim_b) / MB, 2),
        "rss_start_mb": round(rss0, 1),
        "rss_loaded_mb": round(rss_loaded, 1),
        "rss_end_mb": round(_rss_mb(), 1),
        "rss_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "loss_step2": round(float(comps["loss"]), 6),
        "two_steps_s": round(step_s, 1),
    }
    (out / f"{mode}-rank{distributed.rank()}.json").write_text(json.dumps(rec))
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=["ddp", "fsdp"])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--doc-len", type=int, default=128)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.out, args.doc_len)
        return

    from benchmarks._common import report, torchrun_launch

    work = Path(tempfile.mkdtemp(prefix="fsdp-mem-"))
    rows = []
    t_start = time.perf_counter()
    for mode in ("ddp", "fsdp"):
        cmd, env = torchrun_launch(2, __file__, "--worker", mode, "--out", str(work), "--doc-len", str(args.doc_len))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{mode} run failed:\n{proc.stderr[-4000:]}")
        for r in range(2):
            rec = json.loads((work / f"{mode}-rank{r}.json").read_text())
            rec["wall_s"] = round(time.perf_counter() - t0, 1)
            rows.append(rec)
            print(rec, flush=True)
    by = {(r["mode"], r["rank"]): r for r in rows}
    for r in range(2):
        d, f = by[("ddp", r)], by[("fsdp", r)]
        rows.append(
            {
                "mode": "fsdp/ddp",
                "rank": r,
                "states_ratio": round(f["states_mb"] / d["states_mb"], 4),
                "states_grads_ratio": round(f["states_grads_mb"] / d["states_grads_mb"], 4),
                "rss_peak_ratio": round(f["rss_peak_mb"] / d["rss_peak_mb"], 4),
                "rss_end_ratio": round(f["rss_end_mb"] / d["rss_end_mb"], 4),
                "target_states_ratio_max": 0.6,
                "target_met": f["states_mb"] <= 0.6 * d["states_mb"],
                "loss_step2_abs_diff": abs(f["loss_step2"] - d["loss_step2"]),
            }
        )
        print(rows[-1], flush=True)
    config = {
        "model": "scaling_doc: query minilm-l6 (all-MiniLM-L6-v2) + document smollm2-135m (SmolLM2-135M, full "
        "depth, 30 layers)",
        "processes": 2,
        "backend": "gloo",
        "device": "cpu",
        "precision": "fp32",
        "global_batch": 4,
        "steps": 2,
        "doc_max_length": args.doc_len,
        "fsdp": "FSDP2 fully_shard per transformer block + tower root, activation checkpointing on",
        "total_seconds": round(time.perf_counter() - t_start, 1),
        "notes": (
            "2 CPU cores shared with other sessions' jobs; memory only (times are indicative). states = "
            "parameters + AdamW "
            "state held by the process, counted on the live tensors (DTensor: local shard). RSS includes the "
            "full model "
            "as loaded before sharding (every rank builds it on CPU), libraries and activations."
        ),
    }
    report("fsdp_memory", rows, config)


if __name__ == "__main__":
    main()
