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
    single-vector tower one ``emb`` view; ``neg`` is None without hard negatives. ``q_all`` /
    ``pos_all`` / ``neg_all``: the same gathered from every process (the cross-process in-batch
    negatives); ``offset``: the position of the local batch in them. On one process the ``*_all``
    fields are the local tensors and ``offset`` is 0.

    ``neg_mask`` [B*n] bool (query-major like ``neg``; ``neg_mask_all`` gathered): which rows of
    ``neg`` are real hard negatives. A batch whose examples have different numbers of negatives
    (an example with none among examples with one, or 2 of 3 after the false-negative guard) is
    padded to the batch's largest ``n`` with zero rows marked False; a loss must leave those rows
    out (:meth:`real_negatives`, and a masked mean in the hinge). None = every row is real (the
    usual case, and the only one before padding existed).
    """

    q: Tensor
    pos: Mapping[str, Tensor]
    neg: Mapping[str, Tensor] | None = None
    q_all: Tensor | None = None
    pos_all: Mapping[str, Tensor] | None = None
    neg_all: Mapping[str, Tensor] | None = None
    offset: int = 0
    neg_mask: Tensor | None = None
    neg_mask_all: Tensor | None = None

    def __post_init__(self) -> None:
        self.q_all = self.q if self.q_all is None else self.q_all
        self.pos_all = self.pos if self.pos_all is None else self.pos_all
        self.neg_all = self.neg if self.neg_all is None else self.neg_all
        self.neg_mask_all = self.neg_mask if self.neg_mask_all is None else self.neg_mask_all
        if self.neg_mask is not None and (
            self.neg is None or self.neg_mask.shape != (next(iter(self.neg.values())).shape[0],)
        ):
            raise ValueError("LossBatch.neg_mask: one bool per row of neg ([B*n]), and only with hard negatives")
        if self.neg is not None:
            rows = {int(t.shape[0]) for t in self.neg.values()}
            b = int(self.q.shape[0])
            if len(rows) != 1 or b == 0 or next(iter(rows)) % b or next(iter(rows)) == 0:
                raise ValueError(
                    f"LossBatch.neg: every view needs B*n rows (B={b} queries, n >= 1 negatives each), "
                    f"got {sorted(rows)}"
                )

    @property
    def num_negatives(self) -> int:
        """Hard negatives per query (``n``; 0 without hard negatives)."""
        if self.neg is None:
            return 0
        return int(next(iter(self.neg.values())).shape[0]) // int(self.q.shape[0])

    def real_negatives(self, view: str) -> Tensor | None:
        """The gathered hard negatives of ``view`` without the padding rows (``neg_all[view]`` where
        ``neg_mask_all``), e.g. to append to an in-batch softmax's candidates; None without any."""
        if self.neg_all is None:
            return None
        rows = self.neg_all[view]
        return rows if self.neg_mask_all is None else rows[self.neg_mask_all]


__all__ = ["LossBatch"]
