"""The run-loop keys the torchrun worker configs share (tests/training/_fsdp_worker.py,
tests/distill/_qkd_worker.py): checkpoint every 2 steps, log every step, no progress bar, the
data-parallel mode and FSDP's activation checkpointing."""

from __future__ import annotations


def worker_loop_keys(spec: dict, distributed: str, seed: int) -> dict:
    return {
        "seed": seed,
        "save_every": 2,
        "log_every": 1,
        "show_progress": False,
        "distributed": distributed,
        "fsdp": {"activation_checkpointing": spec.get("ac", True)},
    }
