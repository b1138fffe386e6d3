"""What a Stage I loss receives: the embeddings of one training step."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor


@dataclass
class LossBatch:
    """The embeddings of one training step (before normalisation).

    ``q`` [B, dim]: the local queries; ``pos``: view name -> [B, dim] local positive documents;
    ``neg``: view name -> [B*n, dim] local hard negatives, ``n`` >= 1 per query, query-major (rows
    ``i*n .. i*n+n-1`` belong to query ``i``; with one negative per query this is [B, dim]). An
    LLM document tower gives the ``title``, ``content`` and ``emb`` views of ScalingNote §3.2, a
    single-vector tower one ``emb`` view; ``neg`` is None without hard negatives. ``q_all`` / ``pos_all`` / ``neg_all``: the same gathered from every process
    (the cross-process in-batch negatives); ``offset``: the position of the local batch in them.
    On one process the ``*_all`` fields are the local tensors and ``offset`` is 0.
    """

    q: Tensor
    pos: Mapping[str, Tensor]
    neg: Mapping[str, Tensor] | None = None
    q_all: Tensor | None = None
    pos_all: Mapping[str, Tensor] | None = None
    neg_all: Mapping[str, Tensor] | None = None
    offset: int = 0

    def __post_init__(self) -> None:
        self.q_all = self.q if self.q_all is None else self.q_all
        self.pos_all = self.pos if self.pos_all is None else self.pos_all
        self.neg_all = self.neg if self.neg_all is None else self.neg_all
        if self.neg is not None:
            rows = {int(t.shape[0]) for t in self.neg.values()}
            b = int(self.q.shape[0])
            if len(rows) != 1 or b == 0 or next(iter(rows)) % b or next(iter(rows)) == 0:
                raise ValueError(f"LossBatch.neg: every view needs B*n rows (B={b} queries, n >= 1 negatives each), got {sorted(rows)}")

    @property
    def num_negatives(self) -> int:
        """Hard negatives per query (``n``; 0 without hard negatives)."""
        if self.neg is None:
            return 0
        return int(next(iter(self.neg.values())).shape[0]) // int(self.q.shape[0])


__all__ = ["LossBatch"]
