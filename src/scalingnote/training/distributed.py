"""Cross-process negatives: all-gather of embeddings *with* gradients.

``gather_with_grad(x)`` returns the concatenation of ``x`` from every rank, in
rank order. Backward sums the incoming gradient over all ranks (all-reduce) and
hands each rank the slice of its own rows, so the gradient reaching the local
embeddings includes the terms from every rank's loss. Combined with DDP's
gradient averaging and a per-rank loss that is the local mean, the update equals
that of one process on the concatenated batch. Uses only ``all_gather`` and
``all_reduce``, so it works on gloo (CPU) as well as NCCL.
"""

from __future__ import annotations

from typing import overload

import torch
import torch.distributed as dist
from torch import Tensor


def init_from_env() -> bool:
    """Initialise the default process group when launched by ``torchrun`` (WORLD_SIZE > 1):
    NCCL on GPU, gloo on CPU. Returns True when running distributed."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return True


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def local_device() -> torch.device:
    """This process's device: ``cuda:<rank on this node>`` when CUDA is available, else CPU."""
    import os

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count()))
    return torch.device("cpu")


def local_batch_size(global_batch: int) -> int:
    """This rank's share of a global batch (an error unless the ranks split it evenly)."""
    ws = world_size()
    if global_batch % ws:
        raise ValueError(f"optim.batch_size={global_batch} must be divisible by the world size {ws}")
    return global_batch // ws


def rank_slice(batch):
    """This rank's contiguous slice of a global batch (rank r takes the r-th of equal parts)."""
    n = len(batch) // world_size()
    return batch[rank() * n : (rank() + 1) * n]


def barrier() -> None:
    """Wait for every rank (no-op in one process)."""
    if is_distributed():
        dist.barrier()


def average_gradients(modules) -> None:
    """DDP's gradient step: all-reduce every ``.grad`` of ``modules`` and divide by the world
    size, so each rank holds the gradient of the mean of the ranks' (local-mean) losses."""
    if not is_distributed():
        return
    ws = dist.get_world_size()
    for m in modules:
        for p in m.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= ws


def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Copy ``src``'s parameters and buffers into every rank's ``module`` (same architecture)."""
    if not is_distributed():
        return
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src)


@overload
def broadcast_float(x: float, src: int = 0) -> float: ...
@overload
def broadcast_float(x: float | None, src: int = 0) -> float | None: ...
def broadcast_float(x: float | None, src: int = 0) -> float | None:
    """``src``'s value of ``x`` on every rank (None stays None when ``src`` has None)."""
    if not is_distributed():
        return x
    obj = [x]
    dist.broadcast_object_list(obj, src)
    return obj[0]


def gather_to_rank0(obj):
    """Every rank's ``obj`` (picklable) as a list in rank order on rank 0; None on the other
    ranks and in one process."""
    if not is_distributed():
        return None
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)  # (all_gather_object works on gloo and NCCL alike; the objects are small)
    return out if dist.get_rank() == 0 else None


def mean_over_ranks(x: float) -> float:
    """The mean of ``x`` over ranks (each rank's local-mean loss -> the global-batch loss)."""
    if not is_distributed():
        return x
    t = torch.tensor([x], dtype=torch.float64, device=local_device() if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    return float(t) / dist.get_world_size()


def max_over_ranks(x: int) -> int:
    """The largest ``x`` over ranks (every rank gets it); ``x`` in one process."""
    if not is_distributed():
        return x
    t = torch.tensor([int(x)], dtype=torch.long, device=local_device() if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ws = dist.get_world_size()
        sizes = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(ws)]
        dist.all_gather(sizes, torch.tensor([x.shape[0]], device=x.device))
        if any(int(s) != x.shape[0] for s in sizes):
            raise RuntimeError(
                f"cross-process negatives need the same local batch size on every rank, got {[int(s) for s in sizes]} "
                "(use drop_last=True)"
            )
        out = [torch.empty_like(x) for _ in range(ws)]
        dist.all_gather(out, x.contiguous())
        ctx.n = x.shape[0]
        return torch.cat(out)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        r = dist.get_rank()
        return grad[r * ctx.n : (r + 1) * ctx.n]


def gather_with_grad(x: Tensor) -> Tensor:
    """All-gather ``x`` ([B, ...]) across ranks with gradient; identity when not distributed."""
    if not is_distributed():
        return x
    return _GatherWithGrad.apply(x)
