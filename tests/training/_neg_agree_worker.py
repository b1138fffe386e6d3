"""torchrun worker: the ranks agree on a batch's hard-negative slots (rank 0's examples have two
negatives each, rank 1's none) — rank 1 pads with masked rows instead of skipping the collective."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from scalingnote.data.types import Document
from scalingnote.training.data import Example
from scalingnote.training.distributed import rank
from scalingnote.training.trainer import batch_negatives, negative_mask


def main() -> None:
    dist.init_process_group("gloo")
    r = rank()
    negs = 2 if r == 0 else 0
    exs = [
        Example(
            f"q{r}{i}",
            "text",
            Document(f"p{r}{i}"),
            Document(f"n{r}{i}") if negs else None,
            extra_negs=(Document(f"m{r}{i}"),) if negs else (),
        )
        for i in range(3)
    ]
    n = batch_negatives(exs)
    mask = negative_mask(exs, n) if n else None
    out = [None, None]
    dist.all_gather_object(out, {"n": n, "mask": None if mask is None else mask.tolist()})
    if r == 0:
        torch.save(out, sys.argv[1])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
