"""Two torchrun processes (gloo, CPU) == one process on the concatenated batch (loss and every gradient)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _ddp_worker import MASK, TinyDual, make_batch, step

from tests.helpers.torchrun import torchrun


@pytest.mark.parametrize("hard_in_denominator,masked", [(False, False), (True, False), (True, True)])
def test_two_process_equals_one_process(tmp_path, hard_in_denominator, masked):
    """``masked``: padding rows among the hard negatives (an example without one), the same
    number of real rows on each rank, so the ranks' means average to the one-process mean."""
    out = tmp_path / "ddp.pt"
    torchrun(
        Path(__file__).parent / "_ddp_worker.py",
        str(out),
        "1" if hard_in_denominator else "0",
        "1" if masked else "0",
        timeout=300,
    )
    ddp = torch.load(out)

    torch.manual_seed(0)
    model = TinyDual().double()
    loss = step(model, *make_batch(), hard_in_denominator, MASK if masked else None)
    loss.backward()
    assert abs(ddp["loss"] - float(loss.detach())) < 1e-6
    for name, p in model.named_parameters():
        torch.testing.assert_close(ddp["grads"][name], p.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_the_ranks_agree_on_the_hard_negative_slots_when_one_rank_has_none(tmp_path):
    """Rank 0's examples have two hard negatives, rank 1's none: both take two slots (every rank
    gathers rows of one shape), rank 1's all masked (it used to skip the gather: a hang)."""
    out = tmp_path / "agree.pt"
    torchrun(Path(__file__).parent / "_neg_agree_worker.py", str(out), timeout=300)
    r0, r1 = torch.load(out)
    assert r0 == {"n": 2, "mask": None} and r1["n"] == 2 and r1["mask"] == [False] * 6
