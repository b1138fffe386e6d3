"""Worker launched (float64, so a 1e-6 tolerance tests the algebra, not rounding) by torchrun in
test_distributed.py: one DDP step with cross-process negatives.

Writes {"loss": mean over ranks, "grads": {name: grad}} from rank 0 to argv[1] (torch.save).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from scalingnote.training.distributed import gather_with_grad, rank, world_size
from scalingnote.training.losses import scalingnote_loss


class TinyDual(torch.nn.Module):
    """Query encoder + 3-view document encoder over fixed features (enough to test gradients)."""

    def __init__(self, h: int = 12, dim: int = 16):
        super().__init__()
        self.q = torch.nn.Sequential(torch.nn.Linear(h, 24), torch.nn.Tanh(), torch.nn.Linear(24, dim))
        self.d = torch.nn.Sequential(torch.nn.Linear(h, 24), torch.nn.Tanh(), torch.nn.Linear(24, 3 * dim))
        self.dim = dim

    def forward(self, xq, xd, xn):
        q = self.q(xq)
        d = self.d(torch.cat([xd, xn]))
        views = dict(zip(("title", "content", "emb"), d.split(self.dim, dim=1), strict=True))
        n = xq.shape[0]
        return q, {k: v[:n] for k, v in views.items()}, {k: v[n:] for k, v in views.items()}


def make_batch(n: int = 8, h: int = 12):
    g = torch.Generator().manual_seed(1234)
    return tuple(torch.randn(n, h, generator=g, dtype=torch.float64) for _ in range(3))


LOSS_KW = dict(dims=(4, 8, 16), tau=0.1, margin=0.2, alpha=0.5)


MASK = torch.tensor([True, False, True, True, True, True, False, True])  # padding rows: 3 real per rank of 4


def step(model, xq, xd, xn, hard_in_denominator: bool, mask=None):
    q, pos, neg = model(xq, xd, xn)
    loss, _ = scalingnote_loss(
        q,
        pos,
        neg,
        q_all=gather_with_grad(q),
        pos_all={k: gather_with_grad(v) for k, v in pos.items()},
        neg_all={k: gather_with_grad(v) for k, v in neg.items()},
        offset=rank() * q.shape[0],
        hard_in_denominator=hard_in_denominator,
        neg_mask=mask,
        neg_mask_all=None if mask is None else gather_with_grad(mask.to(torch.uint8)).bool(),
        **LOSS_KW,
    )
    return loss


def main() -> None:
    out, hard, masked = sys.argv[1], sys.argv[2] == "1", len(sys.argv) > 3 and sys.argv[3] == "1"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(TinyDual().double())
    xq, xd, xn = make_batch()
    b = xq.shape[0] // world_size()
    sl = slice(rank() * b, (rank() + 1) * b)
    loss = step(model, xq[sl], xd[sl], xn[sl], hard, MASK[sl] if masked else None)
    loss.backward()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    mean_loss /= world_size()
    if rank() == 0:
        grads = {n: p.grad.detach().clone() for n, p in model.module.named_parameters()}
        torch.save({"loss": float(mean_loss), "grads": grads}, out)
    # Tear down in order: DDP (its reducer holds the process group) before the group, and no rank
    # before its peer is done (otherwise: "terminate called without an active exception", SIGABRT).
    del model
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.helpers.torchrun import finish_worker

    finish_worker()


if __name__ == "__main__":
    main()
