"""The training-time tower over cached prefix features (:class:`PrefixTower`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from scalingnote.data.types import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.models.prefix.cache import FeatureCache, item_key
from scalingnote.models.prefix.fill import (
    _collate,
    _encodings,
    _ids_of,
    _view_positions,
    estimate_cache_bytes,
    fill_cache,
)
from scalingnote.models.prefix.lora import add_top_lora
from scalingnote.models.prefix.surgery import check_trainable_layers, freeze_prefix, sub_backbone
from scalingnote.models.prompt import VIEWS


# ============================================================================ training-time tower
class PrefixTower:
    """A tower whose bottom ``L - k`` layers are frozen and cached (see the module docstring).

    ``queries(texts)`` / ``documents(docs)`` return what ``tower(tower.tokenize_...(x))``
    returns — projected, not normalised, with grad through the top layers and the head —
    but read the frozen part from the cache (filled on demand).

    ``dtype``: storage of a token cache (``"float16"``: half the disk and page cache; the step
    upcasts to the tower's dtype). With every layer trainable (``k = L``) only the embedding block
    is frozen: it runs live (no dropout, as cached states would have been computed) instead of
    from a cache, since a lookup costs less than writing and reading its token states.

    ``lora``: a LoRA spec (``r``, ``alpha``, ``dropout``, ``target_modules``) — adapters on the
    top ``k`` layers train instead of their weights.
    """

    def __init__(
        self,
        tower,
        trainable_layers: int,
        cache_root: str | Path,
        *,
        batch_size: int = 32,
        show_progress: bool = True,
        dtype: str = "float16",
        lora: Any = None,
    ):
        self.tower = tower
        L = int(tower.config.num_layers)
        self.k = check_trainable_layers(trainable_layers, L)
        self.dtype = dtype
        self.live = self.k == L  #: nothing frozen below the trainable layers but the embedding block
        self._cache = None if self.live else FeatureCache.for_tower(cache_root, tower, self.k, dtype=dtype)
        self.batch_size = batch_size
        self.show_progress = show_progress
        self._top = None if self.k == 0 else sub_backbone(tower.backbone, L - self.k, from_hidden=True)
        freeze_prefix(tower, self.k)
        if lora is not None:
            add_top_lora(tower, self.k, lora)

    @property
    def cache(self) -> FeatureCache:
        """The feature cache (none when the embedding block runs live, ``k = L``)."""
        if self._cache is None:
            raise ScalingNoteError(
                "a PrefixTower with every layer trainable has no feature cache (its embeddings run live)"
            )
        return self._cache

    def estimate(self, items: Sequence[Any]) -> dict[str, Any]:
        """The cache's disk size for ``items`` before filling (``{rows, tokens, bytes, gb}``;
        zero bytes when the embedding block runs live)."""
        est = estimate_cache_bytes(self.tower, self.k, items, dtype=self.dtype)
        return {**est, "bytes": 0, "gb": 0.0} if self.live else est

    def ensure(self, items: Sequence[Any]) -> int:
        """Cache the features of ``items`` that are missing (the size to be written is logged
        first, and kept in ``self.cache.planned``); returns how many were computed (0 when the
        embedding block runs live)."""
        if self.live:
            return 0
        return fill_cache(
            self.cache, self.tower, self.k, items, batch_size=self.batch_size, show_progress=self.show_progress
        )

    def pooled(self, items: Sequence[Any]) -> Tensor:
        """Pooled states before the projection: ``[B, H]`` or ``[B, 3, H]`` (LLM documents)."""
        items = list(items)
        if self.live:
            return self._live_pooled(items)
        keys = [item_key(it) for it in items]
        if self.cache.missing(keys):
            self.ensure(items)
        t = self.tower
        dev = t.device
        if self.k == 0:
            x = torch.from_numpy(self.cache.pooled_rows(keys)).to(dev)
            return x[:, 0] if x.shape[1] == 1 else x
        encs = _encodings(t, items)
        states = self.cache.token_rows(keys)
        cached_vp = self.cache.view_positions(keys)
        for i, (e, s, it) in enumerate(zip(encs, states, items, strict=True)):
            if len(_ids_of(t, e)) != s.shape[0]:
                raise ScalingNoteError(
                    f"feature cache {self.cache.root}: cached length {s.shape[0]} != tokenized length for "
                    f"{item_key(it)}"
                )
            vp = _view_positions(t, e)
            if vp is not None and (cached_vp is None or tuple(cached_vp[i]) != vp):
                raise ScalingNoteError(
                    f"feature cache {self.cache.root}: placeholder positions of {item_key(it)} "
                    "differ from the cached ones"
                )
        batch = {kk: v.to(dev) for kk, v in _collate(t, encs).items()}
        mask = batch["attention_mask"].bool()
        h = torch.zeros(mask.shape + (states[0].shape[1],), dtype=t.dtype, device=dev)
        h[mask] = torch.from_numpy(np.concatenate(states)).to(
            dev, t.dtype
        )  # row-major: each row's real tokens in order
        out = t.run_layers(batch, backbone=self._top, inputs_embeds=h)
        return t.pool_hidden(out, batch)

    def _live_pooled(self, items: list[Any]) -> Tensor:
        """:meth:`pooled` with the frozen embedding block run live: in eval mode (no dropout), as
        the cache's states are computed, so the result equals a cached float32 state's."""
        t = self.tower
        batch = {kk: v.to(t.device) for kk, v in _collate(t, _encodings(t, items)).items()}
        emb = getattr(t.backbone, "embeddings", None)  # BERT's block (dropout); a decoder's lookup has none
        was = emb.training if emb is not None else False
        if emb is not None:
            emb.eval()
        try:
            out = t.run_layers(batch)
        finally:
            if emb is not None:
                emb.train(was)
        return t.pool_hidden(out, batch)

    def queries(self, texts: Sequence[Any]) -> Tensor:
        return self.tower.project(self.pooled(texts))

    def documents(self, docs: Sequence[Document]) -> dict[str, Tensor]:
        p = self.tower.project(self.pooled(docs))
        if p.dim() == 3:
            return {v: p[:, i] for i, v in enumerate(VIEWS)}
        return {v: p for v in VIEWS}

    def encode_documents(
        self,
        docs: Sequence[Document],
        *,
        batch_size: int = 256,
        show_progress: bool = False,
        view: str = "emb",
        dim: int | None = None,
        normalize: bool = True,
    ) -> np.ndarray:
        """Like :meth:`DocumentTower.encode_documents` (what ``index encode`` calls), from the cache."""
        return self.encode(docs, view=view, dim=dim, normalize=normalize, batch_size=batch_size)

    @torch.no_grad()
    def encode(
        self,
        items: Sequence[Any],
        *,
        view: str | None = "emb",
        dim: int | None = None,
        normalize: bool = True,
        batch_size: int = 256,
    ) -> np.ndarray:
        """float32 embeddings like ``encode_queries`` / ``encode_documents`` (eval mode, no grad)."""
        items = list(items)
        self.ensure(items)
        return encode_eval(self, items, view=view, dim=dim, normalize=normalize, batch_size=batch_size)


@torch.no_grad()
def encode_eval(
    enc: Any, items: list[Any], *, view: str | None, dim: int | None, normalize: bool, batch_size: int
) -> np.ndarray:
    """The eval-mode, no-grad batching loop shared by :class:`PrefixTower` and the fusion
    encoders: ``enc`` has ``tower`` (its ``config.role`` picks ``queries`` or ``documents``),
    ``queries(chunk) -> [B, D]`` and ``documents(chunk) -> {view: [B, D]}``; features must be cached."""
    was = enc.tower.training
    enc.tower.eval()
    out = []
    try:
        for i in range(0, len(items), batch_size):
            chunk = items[i : i + batch_size]
            e = enc.queries(chunk) if enc.tower.config.role == "query" else enc.documents(chunk)[view or "emb"]
            e = e[:, : (dim or e.shape[1])].float()
            if normalize:
                e = torch.nn.functional.normalize(e, dim=-1)
            out.append(e.cpu().numpy())
    finally:
        enc.tower.train(was)
    return np.concatenate(out) if out else np.zeros((0, dim or enc.tower.out_dim), dtype=np.float32)
