"""Fusion towers (ScalingNote §3.5, Fig. 3): semantic IDs and side features fused into the
document embedding, an optional user/context vector fused into the query embedding.

The online system of §3.5 encodes a document with the LLM document tower, assigns it semantic
IDs by 6-layer residual K-means (:class:`scalingnote.index.semantic_ids.ResidualKMeans`), and
"all inputs are processed through a neural network to generate comprehensive document
embeddings"; queries are combined with "user historical information". The paper does not give
the network; this module uses the simplest one that can only add information (not in the paper):

Document side, :class:`DocumentFusion` (shapes for a batch of ``B`` documents)::

    e      [B, dim]   a view of the document tower (title / content / emb), not normalised
    codes  [B, L]     int64 semantic IDs, layer l in 0..K_l-1
    cat    [B]        int64 category id (e.g. the note's topic), 0..C-1
    num    [B, F]     float32 numeric side features (standardised: length, popularity, ...)
    z      = [ Σ_l E_l[codes_l]  ;  E_cat[cat]  ;  GELU(W_1 num + b_1) ]      [B, S + S + H]
    fused  = e + W_out z                                                       [B, dim]

Query side, :class:`QueryFusion`: ``fused = e_q + W_ctx ctx`` with ``ctx [B, C]`` a user/context vector.

``W_out`` and ``W_ctx`` start at zero, so a fusion tower starts exactly at the plain tower and
training (the same Stage I losses; the fusion parameters are ordinary trainable parameters of the
tower they are attached to) decides how much of the side information to use. Each view of a
document gets the same fusion vector. :class:`FusedPrefixEncoder` plugs the fusion into the
cached-prefix training path (``trainable_layers: 0``) used by the Stage I trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from scalingnote.errors import ScalingNoteError
from scalingnote.models.prefix.tower import encode_eval


class DocumentFusion(nn.Module):
    """``e + W_out [Σ_l E_l[codes_l]; E_cat[cat]; GELU(W_1 num)]`` (see the module docstring for shapes)."""

    def __init__(
        self,
        dim: int,
        *,
        codebook_sizes: Sequence[int] = (),
        num_categories: int = 0,
        num_numeric: int = 0,
        embed_dim: int = 32,
        hidden: int = 32,
    ):
        super().__init__()
        if not codebook_sizes and not num_categories and not num_numeric:
            raise ScalingNoteError(
                "DocumentFusion needs at least one input: semantic IDs, a category or numeric features"
            )
        self.dim = int(dim)
        self.codebook_sizes = [int(k) for k in codebook_sizes]
        sid = [nn.Embedding(k, embed_dim) for k in self.codebook_sizes]
        self.sid = nn.ModuleList(sid)
        self.category = nn.Embedding(num_categories, embed_dim) if num_categories else None
        self.numeric = nn.Linear(num_numeric, hidden) if num_numeric else None
        width = (
            (embed_dim if self.codebook_sizes else 0)
            + (embed_dim if num_categories else 0)
            + (hidden if num_numeric else 0)
        )
        self.out = nn.Linear(width, dim, bias=False)
        for e in sid:
            nn.init.normal_(e.weight, std=1.0 / len(sid) ** 0.5)
        if self.category is not None:
            nn.init.normal_(self.category.weight, std=1.0)
        nn.init.zeros_(self.out.weight)  # starts as the plain tower

    def side(self, codes: Tensor | None = None, cat: Tensor | None = None, num: Tensor | None = None) -> Tensor:
        """``W_out z``: the fusion vector ``[B, dim]``."""
        parts = []
        if self.sid:
            if codes is None or codes.dim() != 2 or codes.shape[1] != len(self.sid):
                raise ScalingNoteError(
                    f"semantic IDs must be [B, {len(self.sid)}], got {None if codes is None else tuple(codes.shape)}"
                )
            parts.append(sum(emb(codes[:, i]) for i, emb in enumerate(self.sid)))
        if self.category is not None:
            if cat is None or cat.dim() != 1:
                raise ScalingNoteError("category ids must be [B]")
            parts.append(self.category(cat))
        if self.numeric is not None:
            if num is None or num.dim() != 2 or num.shape[1] != self.numeric.in_features:
                raise ScalingNoteError(f"numeric side features must be [B, {self.numeric.in_features}]")
            parts.append(torch.nn.functional.gelu(self.numeric(num)))
        return self.out(torch.cat(parts, dim=-1))

    def forward(
        self, e: Tensor, codes: Tensor | None = None, cat: Tensor | None = None, num: Tensor | None = None
    ) -> Tensor:
        return e + self.side(codes, cat, num).to(e.dtype)


class QueryFusion(nn.Module):
    """``e_q + W_ctx ctx``: a user/context vector ``ctx [B, C]`` fused into the query embedding ``[B, dim]``."""

    def __init__(self, dim: int, context_dim: int):
        super().__init__()
        self.ctx = nn.Linear(int(context_dim), int(dim), bias=False)
        nn.init.zeros_(self.ctx.weight)

    def forward(self, e: Tensor, ctx: Tensor) -> Tensor:
        if ctx.dim() != 2 or ctx.shape[1] != self.ctx.in_features or ctx.shape[0] != e.shape[0]:
            raise ScalingNoteError(
                f"context vectors must be [{e.shape[0]}, {self.ctx.in_features}], got {tuple(ctx.shape)}"
            )
        return e + self.ctx(ctx.to(e.dtype))


@dataclass
class DocumentFeatures:
    """Per-document fusion inputs, looked up by document id (rows of the arrays)."""

    ids: list[str]
    codes: np.ndarray | None = None  #: [n, L] int64 semantic IDs
    category: np.ndarray | None = None  #: [n] int64
    numeric: np.ndarray | None = None  #: [n, F] float32

    def __post_init__(self) -> None:
        self.index = {d: i for i, d in enumerate(self.ids)}
        n = len(self.ids)
        for name in ("codes", "category", "numeric"):
            a = getattr(self, name)
            if a is not None and len(a) != n:
                raise ScalingNoteError(f"DocumentFeatures.{name} has {len(a)} rows for {n} documents")

    def rows(self, doc_ids: Sequence[str]) -> dict[str, Tensor | None]:
        try:
            idx = np.asarray([self.index[d] for d in doc_ids], dtype=np.int64)
        except KeyError as e:
            raise ScalingNoteError(f"no fusion features for document {e.args[0]!r}") from None
        t = lambda a, dt: None if a is None else torch.from_numpy(np.ascontiguousarray(a[idx])).to(dt)  # noqa: E731
        return {
            "codes": t(self.codes, torch.long),
            "cat": t(self.category, torch.long),
            "num": t(self.numeric, torch.float32),
        }


class FusedPrefixEncoder:
    """A :class:`~scalingnote.models.PrefixTower` (``trainable_layers: 0``) with a fusion module.

    Document role: ``fusion`` is a :class:`DocumentFusion` and ``features`` a
    :class:`DocumentFeatures`; query role: ``fusion`` is a :class:`QueryFusion` and ``features``
    maps a query text to its context vector (``[C]``; texts without one get zeros). The fusion
    module is attached to the tower (``tower.fusion``), so the trainer optimises it with the tower
    and keeps it with the best weights. Offers what the trainer and the evaluation call:
    ``pooled``, ``ensure``, ``queries`` / ``documents``, ``encode``.
    """

    def __init__(self, prefix, fusion: QueryFusion | DocumentFusion, features: Any):
        if prefix.k != 0:
            raise ScalingNoteError("FusedPrefixEncoder needs a head-only PrefixTower (trainable_layers 0)")
        self.prefix = prefix
        self.tower = prefix.tower
        self.fusion = fusion
        self.features = features
        self.tower.fusion = fusion  # a submodule: its parameters train with the tower's
        self.role = self.tower.config.role

    def pooled(self, items):
        return self.prefix.pooled(items)

    def ensure(self, items) -> int:
        return self.prefix.ensure(items)

    def _context(self, texts: Sequence[str]) -> Tensor:
        assert isinstance(self.fusion, QueryFusion)  # the query role's fusion (see the class docstring)
        dim = self.fusion.ctx.in_features
        rows = [self.features.get(t) for t in texts]
        return torch.from_numpy(
            np.stack([r if r is not None else np.zeros(dim, np.float32) for r in rows]).astype(np.float32)
        )

    def queries(self, texts) -> Tensor:
        if self.role != "query":
            raise ScalingNoteError("queries() on a document encoder")
        e = self.prefix.queries(texts)
        return self.fusion(e, self._context([t if isinstance(t, str) else t.text for t in texts]).to(e.device))

    def documents(self, docs) -> dict[str, Tensor]:
        if self.role != "document":
            raise ScalingNoteError("documents() on a query encoder")
        assert isinstance(self.fusion, DocumentFusion)  # the document role's fusion
        views = self.prefix.documents(docs)
        f = self.features.rows([d.id for d in docs])
        side = self.fusion.side(**{k: (v.to(self.tower.device) if v is not None else None) for k, v in f.items()})
        return {k: v + side.to(v.dtype) for k, v in views.items()}

    def encode_documents(
        self,
        docs,
        *,
        batch_size: int = 256,
        show_progress: bool = False,
        view: str = "emb",
        dim: int | None = None,
        normalize: bool = True,
    ) -> np.ndarray:
        return self.encode(docs, view=view, dim=dim, normalize=normalize, batch_size=batch_size)

    @torch.no_grad()
    def encode(
        self, items, *, view: str | None = "emb", dim: int | None = None, normalize: bool = True, batch_size: int = 256
    ) -> np.ndarray:
        items = list(items)
        self.prefix.ensure(items)
        return encode_eval(self, items, view=view, dim=dim, normalize=normalize, batch_size=batch_size)


__all__ = ["DocumentFeatures", "DocumentFusion", "FusedPrefixEncoder", "QueryFusion"]
