"""Launching test workers under ``torchrun`` (2 processes, gloo on loopback, 1 thread each) and
ending them cleanly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    worker: Path, *args: str, nproc: int = 2, check: bool = True, timeout: int = 600
) -> subprocess.CompletedProcess:
    """Run ``worker`` (a script) on ``nproc`` local processes; with ``check`` assert it succeeded."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(worker),
        *args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def finish_worker() -> None:
    """End a worker: wait for the peers, destroy the process group, and skip interpreter teardown
    (under heavy load a gloo thread can still be joinable when C++ static destructors run, which
    aborts the process with SIGABRT after its work is done)."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def kill_hook(kill_at: int | None):
    """An ``on_step(step)`` callback that SIGKILLs rank 0 right after optimizer step ``kill_at``
    (a real kill: no cleanup, no checkpoint of that step); None: never."""
    import signal

    import torch.distributed as dist

    def on_step(step: int) -> None:
        if kill_at == step and dist.get_rank() == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    return on_step


def assert_same_steps(got: dict, ref: dict, n_steps: int, tol: float = 1e-5) -> None:
    """Records of ``n_steps`` optimizer steps ({"loss", "grad_norm", "grads", "weights"}) agree:
    the multi-process run ``got`` against the one-process reference ``ref``."""
    import torch

    for s in range(n_steps):
        assert abs(got["loss"][s] - ref["loss"][s]) < tol, (s, got["loss"][s], ref["loss"][s])
        assert abs(got["grad_norm"][s] - ref["grad_norm"][s]) < tol * max(1.0, ref["grad_norm"][s])
        g, r = got["grads"][s], ref["grads"][s]
        assert g.keys() == r.keys() and r
        for k in r:
            torch.testing.assert_close(g[k], r[k], atol=tol, rtol=tol, msg=f"grad step {s}: {k}")
    w, r = got["weights"], ref["weights"]
    assert w.keys() == r.keys()
    for k in r:
        torch.testing.assert_close(w[k], r[k], atol=tol, rtol=tol, msg=f"weight {k}")


def assert_kill_resumes(launch, spec: dict, full: Path, killed: Path, weights, marker: str = "sharded.json") -> None:
    """Exact resume of a multi-process run: ``launch("train", spec_json, out, check=...)`` runs 5
    steps with a checkpoint every 2. The run killed after step 3 leaves only the step-2
    checkpoint (complete: its ``marker`` file exists; ``state.pt`` for a DDP checkpoint) and no
    final output; relaunched, it ends with ``weights(out)`` equal to the uninterrupted run's to
    the bit and a metrics log with each step once."""
    import json

    import torch

    launch("train", json.dumps(spec), str(full))
    proc = launch("train", json.dumps({**spec, "kill_at": 3}), str(killed), check=False)
    assert proc.returncode != 0  # rank 0 died by SIGKILL after step 3 (checkpoint at step 2 only)
    ck = killed / "checkpoints"
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("step-")) == [
        "step-00000002"
    ]  # beside STEP_INPUTS.json
    assert (ck / "step-00000002" / marker).exists()
    assert not (killed / "query_tower").exists()
    launch("train", json.dumps(spec), str(killed))
    a, b = weights(full), weights(killed)
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.equal(a[k], b[k]), k
    lines = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4, 5]  # step 3 of the killed run was redone, not duplicated
