"""Worker launched by torchrun in test_qkd_distributed.py (gloo, CPU).

``step SPEC OUT``: two optimizer steps of the real Stage II :class:`QKDLoop` with
``distributed`` = SPEC["distributed"] (``fsdp`` or ``ddp``) on a tiny BERT student in float64
(dropout off, so that one process and two draw the same function), writing per step the global
loss, the unsharded gradients and grad norm, the student's starting weights and its final
unsharded weights (rank 0, ``torch.save``). ``run_steps`` is also what the test runs in one
process on the whole batch.

``train SPEC OUT``: ``scalingnote.distill.distill`` end to end; with ``"kill_at": k`` in SPEC
rank 0 SIGKILLs itself right after optimizer step ``k`` (no cleanup, no checkpoint of that
step), so the next launch must resume from the last (sharded) checkpoint.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.training._worker_keys import worker_loop_keys


def make_cfg(spec: dict, out: str, distributed: str):
    from scalingnote.config import load_config
    from scalingnote.distill import DistillConfig

    base = {
        "teacher": spec["teacher"],
        "output_dir": out,
        "student": {"model": spec["bert"], "max_length": 16},
        "queries": [{"path": spec["queries"]}],
        "optim": {"batch_size": 8, "epochs": 1.0, "lr": 3e-3},
        "validation_fraction": 0.1,
        "cache_dir": spec.get("cache_dir"),
        "eval_every": 2,
        **worker_loop_keys(spec, distributed, seed=5),
    }
    if spec.get("max_steps"):
        base["optim"]["max_steps"] = spec["max_steps"]
    if spec.get("head_init"):
        base["head_init"] = spec["head_init"]
    return load_config(DistillConfig, base)


def _state(m) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def run_steps(spec: dict, out: str, distributed: str, n_steps: int = 2) -> dict:
    """``n_steps`` QKD steps; returns {"loss", "grad_norm", "grads", "start", "weights"} (all ranks
    take part; the tensors are complete on rank 0)."""
    from scalingnote.distill.trainer import QKDLoop, build_student, prepare_data
    from scalingnote.training import distributed as D
    from scalingnote.training.fsdp import full_grads, full_state_dict
    from scalingnote.utils import seed_everything

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same kernels as the torchrun workers
    try:
        cfg = make_cfg(spec, out, distributed)
        seed_everything(cfg.seed)
        data = prepare_data(cfg)
        student, prefix, _ = build_student(cfg, data, torch.device("cpu"))
        assert student.config.projection_init == "lstsq"  # the head fit on rank 0, broadcast to the others
        for m in student.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        student.double()
        start = _state(student)
        loop = QKDLoop(cfg, Path(out), student, prefix, data)
        assert loop.sharded == (distributed == "fsdp" and D.is_distributed())
        student.train()
        rec: dict = {"loss": [], "grad_norm": [], "grads": [], "start": start}
        for s in range(n_steps):
            comps = loop.train_step(s)
            rec["loss"].append(comps["loss"])
            # DDP: the averaged gradients (optimizer_step repeats it: averaging equal copies is exact)
            loop.reduce_gradients()
            rec["grads"].append(full_grads(student))
            rec["grad_norm"].append(loop.optimizer_step())
            loop.step += 1
        gather = (lambda: full_state_dict(student)) if loop.sharded else (lambda: _state(student))
        rec["weights"] = gather()
        # the best-weights snapshot (this rank's shards when sharded) restores in place after another step
        snap = loop.trainable_state()
        loop.train_step(n_steps)
        loop.optimizer_step()
        rec["moved_on"] = gather()
        loop.restore_trainable(snap)
        rec["restored"] = gather()
        return rec
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    from scalingnote.training import distributed as D
    from tests.helpers.torchrun import finish_worker, kill_hook

    mode, spec, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    D.init_from_env()
    if mode == "step":
        rec = run_steps(spec, str(Path(out).parent / "run"), spec["distributed"])
        if D.rank() == 0:
            torch.save(rec, out)
    elif mode == "train":
        from scalingnote.distill import distill

        res = distill(make_cfg(spec, out, spec["distributed"]), on_step=kill_hook(spec.get("kill_at")))
        if D.rank() == 0:
            Path(out, "result.json").write_text(
                json.dumps({k: v for k, v in res.items() if isinstance(v, (int, float, str))})
            )
    finish_worker()


if __name__ == "__main__":
    main()
