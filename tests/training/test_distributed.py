"""Two torchrun processes (gloo, CPU) == one process on the concatenated batch (loss and every gradient)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _ddp_worker import TinyDual, make_batch, step  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("hard_in_denominator", [False, True])
def test_two_process_equals_one_process(tmp_path, hard_in_denominator):
    out = tmp_path / "ddp.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
        f"--master_addr=127.0.0.1", f"--master_port={_free_port()}",
        str(Path(__file__).parent / "_ddp_worker.py"), str(out), "1" if hard_in_denominator else "0",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = torch.load(out)

    torch.manual_seed(0)
    model = TinyDual().double()
    loss = step(model, *make_batch(), hard_in_denominator)
    loss.backward()
    assert abs(ddp["loss"] - float(loss.detach())) < 1e-6
    for name, p in model.named_parameters():
        torch.testing.assert_close(ddp["grads"][name], p.grad, atol=1e-6, rtol=1e-5, msg=name)
