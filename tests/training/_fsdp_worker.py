"""Worker launched by torchrun in test_fsdp.py (gloo, CPU).

``step SPEC OUT``: two optimizer steps of the real Stage I :class:`Trainer` with
``distributed: fsdp`` on tiny Llama towers in float64 (gradient caching and activation
checkpointing on), writing per step the mean loss, the unsharded gradients and grad norm,
and the final unsharded weights (rank 0, ``torch.save``). ``run_steps`` is also what the
test runs in one process on the concatenated batch.

``train SPEC OUT``: ``scalingnote.training.train`` end to end; with ``"kill_at": k`` in SPEC
rank 0 SIGKILLs itself right after optimizer step ``k`` (a real kill: no cleanup, no
checkpoint of that step), so the next launch must resume from the last sharded checkpoint.
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
    from scalingnote.training import TrainConfig

    base = {
        "method": "scaling_dual",
        "output_dir": out,
        "query_tower": {"model": spec["llm"], "max_length": 16},
        "doc_tower": {"model": spec["llm"], "max_length": 64},
        "dim": 32,
        "data": {"data_dir": spec["data"], "neg_skip_top": 1, "neg_max_rank": 8, "validation_fraction": 0.15},
        "loss": {"dims": [8, 16, 32]},
        "optim": {
            "batch_size": 8,
            "epochs": 2.0,
            "lr": 1e-3,
            "head_lr": 1e-2,
            "micro_batch_size": spec.get("micro", 2),
        },
        **worker_loop_keys(spec, distributed, seed=3),
    }
    if spec.get("lora"):
        base["lora"] = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    if spec.get("max_steps"):
        base["optim"]["max_steps"] = spec["max_steps"]
    if spec.get("eval_every"):  # validation nDCG@10 on every rank, best weights kept in the sharded checkpoints
        base["eval_every"] = spec["eval_every"]
    return load_config(TrainConfig, base)


def run_steps(spec: dict, out: str, distributed: str, n_steps: int = 2) -> dict:
    """``n_steps`` trainer steps; returns {"loss", "grad_norm", "grads", "weights"} (all ranks
    take part; the tensors are complete on rank 0)."""
    import torch.distributed as dist

    from scalingnote.training import build_towers
    from scalingnote.training import distributed as D
    from scalingnote.training.data import load_training_data
    from scalingnote.training.fsdp import full_grads, full_state_dict
    from scalingnote.training.towers import setup_lora
    from scalingnote.training.trainer import Trainer

    cfg = make_cfg(spec, out, distributed)
    data = load_training_data(cfg.data, cfg.seed, show_progress=False)
    torch.manual_seed(0)
    q, d = build_towers(cfg, torch.device("cpu"))
    q.double(), d.double()
    setup_lora(cfg, (q, d))
    tr = Trainer(cfg, q, d, data.train, torch.device("cpu"))
    assert tr.sharded == (distributed == "fsdp")
    q.train(), d.train()
    rec: dict = {"loss": [], "grad_norm": [], "grads": []}
    for s in range(n_steps):
        comps = tr.compute_gradients(tr._batch_for_step(s))
        loss = torch.tensor(comps["loss"], dtype=torch.float64)
        if D.is_distributed():  # the global loss is the mean of the equal-sized ranks' local means
            dist.all_reduce(loss)
            loss /= D.world_size()
        rec["loss"].append(float(loss))
        rec["grads"].append({f"{t}.{k}": v for t, m in (("q", q), ("d", d)) for k, v in full_grads(m).items()})
        rec["grad_norm"].append(tr.optimizer_step())
        tr.step += 1
    if tr.sharded:
        rec["weights"] = {f"{t}.{k}": v for t, m in (("q", q), ("d", d)) for k, v in full_state_dict(m).items()}
    else:
        rec["weights"] = {
            f"{t}.{k}": v.detach().clone() for t, m in (("q", q), ("d", d)) for k, v in m.state_dict().items()
        }
    return rec


def main() -> None:
    from scalingnote.training import distributed as D
    from tests.helpers.torchrun import finish_worker, kill_hook

    mode, spec, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    D.init_from_env()
    if mode == "step":
        rec = run_steps(spec, str(Path(out).parent / "run"), "fsdp")
        if D.rank() == 0:
            torch.save(rec, out)
    elif mode == "train":
        from scalingnote.training import train

        res = train(make_cfg(spec, out, "fsdp"), on_step=kill_hook(spec.get("kill_at")))
        if D.rank() == 0:
            Path(out, "result.json").write_text(
                json.dumps({k: v for k, v in res.items() if isinstance(v, (int, float, str))})
            )
    finish_worker()


if __name__ == "__main__":
    main()
