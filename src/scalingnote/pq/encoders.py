"""Training-time access to the two towers: full forward passes, or cached backbone features.

With a trainable backbone, a batch is tokenized and run through the tower (with grad).
With a frozen backbone, the tower's output is ``W (pool(backbone(text)) - c)`` and only ``W``
trains: ``pool(backbone(text))`` is computed once (:func:`pooled_features`, stored raw) and
the training forward pass is ``tower.project(features[rows])`` — the same function of the
same weights, so a tower saved after training encodes exactly what training saw. When the
tower's centre ``c`` is zero, the projection is linear without bias and the embeddings are
L2-normalised afterwards, so features may also come normalised from an embeddings directory
of the projection-less tower without changing embeddings or gradients.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from scalingnote.data import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index.embeddings import load_embeddings
from scalingnote.models.prefix import FeatureCache, fill_cache, item_key
from scalingnote.models.prompt import VIEWS
from scalingnote.models.towers import FORMAT
from scalingnote.models.towers.identity import _sha, tokenizer_digest, weights_digest

EMB_VIEW = "emb"


def _pooled(tower, batch) -> Tensor:
    """Pooled backbone output (the projection's input, before centring) for a tokenized batch."""
    dev = tower.device
    h = tower.pooled({k: v.to(dev) for k, v in batch.items()})
    if h.dim() == 3:  # LLM document tower: the states before the three placeholders
        h = h[:, VIEWS.index(EMB_VIEW)]
    return h.detach()


@torch.no_grad()
def pooled_features(
    tower, items: Sequence[Any], *, batch_size: int = 32, show_progress: bool = False, desc: str = "features"
) -> np.ndarray:
    """``pool(backbone(x))`` (before the projection) for queries (str) or documents, float32 ``[n, hidden]``."""
    from tqdm.auto import tqdm

    items = list(items)
    hidden = int(tower.config.hidden_size)
    out = np.zeros((len(items), hidden), dtype=np.float32)
    if not items:
        return out
    is_doc = tower.role == "document"
    lengths = (
        [len(e.input_ids) for e in tower.document_encodings(items)]
        if is_doc
        else [len(s) for s in tower.query_ids(items)]
    )
    order = sorted(range(len(items)), key=lambda i: (-lengths[i], i))
    was_training = tower.training
    tower.eval()
    try:
        with tqdm(
            total=len(items), desc=desc, unit="doc" if is_doc else "q", disable=not show_progress, dynamic_ncols=True
        ) as bar:
            for s in range(0, len(items), batch_size):
                idx = order[s : s + batch_size]
                sub = [items[i] for i in idx]
                batch = tower.tokenize_documents(sub) if is_doc else tower.tokenize_queries(sub)
                out[idx] = _pooled(tower, batch).float().cpu().numpy()
                bar.update(len(idx))
    finally:
        tower.train(was_training)
    return out


def projectionless_fingerprint(tower) -> str:
    """The fingerprint the same tower would have without its projection (``dim=None``, as
    ``load_tower(base, role, dim=None)`` builds it): identifies embeddings that are exactly
    this tower's pooled features, normalised."""
    from torch import nn

    cfg = copy.deepcopy(tower.config)
    cfg.dim = None
    cfg.matryoshka_dims = [cfg.hidden_size]
    cfg.projection_init = None
    cfg.projection_seed = 0
    holder = nn.Module()
    holder.backbone = tower.backbone
    return _sha(
        {
            "format": FORMAT,
            "config": cfg.identity(),
            "tokenizer": tokenizer_digest(tower.tokenizer),
            "weights": weights_digest(holder),
        }
    )


class PooledFeatureEncoder:
    """Adapter for :func:`scalingnote.index.encode_corpus`: encodes documents into the tower's
    pooled features (sharded, resumable). Identity = the projection-less fingerprint."""

    def __init__(self, tower):
        if tower.role != "document":
            raise ValueError("PooledFeatureEncoder needs a document tower")
        self.tower = tower
        self.fingerprint = projectionless_fingerprint(tower)
        self.compat_id = self.fingerprint
        self.dim = int(tower.config.hidden_size)
        self.name = f"{tower.config.base_model} (pooled features)"

    def encode_documents(
        self, docs: Sequence[Document], batch_size: int = 32, show_progress: bool = False
    ) -> np.ndarray:
        return pooled_features(self.tower, docs, batch_size=batch_size, show_progress=show_progress)


def cached_pooled_features(
    tower, items: Sequence[Any], root: str | Path, *, batch_size: int = 32, show_progress: bool = True
) -> np.ndarray:
    """Pooled features ``[n, hidden]`` (the ``[EMB]`` view of an LLM document tower) through the
    shared frozen-prefix feature cache (:mod:`scalingnote.models.prefix`, ``k = 0``) under ``root``:
    the same cache Stage I and QKD read, keyed by the backbone, pooling, lengths and prompt."""

    items = list(items)
    cache = FeatureCache.for_tower(root, tower, 0)
    fill_cache(cache, tower, 0, items, batch_size=batch_size, show_progress=show_progress)
    if not items:
        return np.zeros((0, int(tower.config.hidden_size)), dtype=np.float32)
    x = cache.pooled_rows([item_key(i) for i in items])
    return np.ascontiguousarray(x[:, VIEWS.index(EMB_VIEW)] if x.shape[1] == len(VIEWS) else x[:, 0])


def load_doc_features(
    tower,
    docs: Sequence[Document],
    cache_dir: Path,
    *,
    source_dir: str | Path | None = None,
    batch_size: int = 32,
    show_progress: bool = True,
) -> np.ndarray:
    """Pooled features of the corpus, rows in ``docs`` order.

    ``source_dir``: an existing embeddings directory written by the projection-less tower
    (its manifest fingerprint must equal :func:`projectionless_fingerprint`; the tower's
    centre must be zero, since those rows are normalised). Otherwise the features come from the
    shared feature cache under ``cache_dir`` (:func:`cached_pooled_features`; resumable).
    """

    if source_dir is None:
        return cached_pooled_features(tower, docs, cache_dir, batch_size=batch_size, show_progress=show_progress)
    enc = PooledFeatureEncoder(tower)
    center = getattr(tower, "center", None)
    if center is not None and bool(center.abs().sum() > 0):
        raise ScalingNoteError(
            f"{source_dir}: normalised embeddings cannot stand for the pooled features of a tower with a non-zero "
            "projection centre; drop towers.doc_features_dir"
        )
    emb = load_embeddings(source_dir)
    fp = emb.tower.get("fingerprint")
    if fp != enc.fingerprint:
        raise ScalingNoteError(
            f"{Path(source_dir) / 'manifest.json'}: field 'tower.fingerprint' is {fp!r}, but the document tower "
            f"without its projection has fingerprint {enc.fingerprint!r} (encode the corpus with the same base "
            "model, layers, pooling and max length, and no projection)"
        )
    pos = {d: i for i, d in enumerate(emb.ids)}
    missing = [d.id for d in docs if d.id not in pos]
    if missing:
        raise ScalingNoteError(f"{emb.root}: no features for document {missing[0]!r} ({len(missing)} missing)")
    vec = np.asarray(emb.vectors, dtype=np.float32)
    return np.ascontiguousarray(vec[[pos[d.id] for d in docs]])


def load_query_features(
    tower, texts: Sequence[str], cache_path: Path, *, batch_size: int = 64, show_progress: bool = True
) -> np.ndarray:
    """Pooled features of the queries from the shared feature cache (root: ``cache_path`` without
    its suffix; a ``.npy`` name is accepted for compatibility)."""
    root = Path(cache_path)
    root = root.with_suffix("") if root.suffix == ".npy" else root
    return cached_pooled_features(tower, list(texts), root, batch_size=batch_size, show_progress=show_progress)


class Side:
    """One tower during training: ``embed(rows)`` (unnormalised, with grad through the trainable
    parts) and ``encode_all()`` (normalised numpy, no grad)."""

    def __init__(self, tower, items: Sequence[Any], features: np.ndarray | None = None, batch_size: int = 32):
        self.tower = tower
        self.items = list(items)
        self.batch_size = int(batch_size)
        self.features = None if features is None else torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
        if self.features is not None and self.features.shape[0] != len(self.items):
            raise ValueError(f"{self.features.shape[0]} feature rows for {len(self.items)} items")
        if self.features is not None:
            tower.backbone.requires_grad_(False)

    @property
    def is_doc(self) -> bool:
        return self.tower.role == "document"

    @property
    def cached(self) -> bool:
        return self.features is not None

    def trainable(self) -> bool:
        return any(p.requires_grad for p in self.tower.parameters())

    def train_mode(self, on: bool) -> None:
        """Dropout only when the backbone itself runs (never on cached features)."""
        self.tower.train(on and not self.cached)

    def embed(self, rows: np.ndarray | Sequence[int]) -> Tensor:
        rows = np.asarray(rows, dtype=np.int64)
        dev = self.tower.device
        if self.features is not None:
            f = self.features[torch.from_numpy(rows)].to(dev)
            return self.tower.project(f).float()
        sub = [self.items[i] for i in rows]
        batch = self.tower.tokenize_documents(sub) if self.is_doc else self.tower.tokenize_queries(sub)
        out = self.tower({k: v.to(dev) for k, v in batch.items()})
        return (out[EMB_VIEW] if isinstance(out, dict) else out).float()

    @torch.no_grad()
    def encode(self, rows: np.ndarray | Sequence[int] | None = None) -> np.ndarray:
        """Normalised float32 embeddings of ``rows`` (default: all items)."""
        rows = np.arange(len(self.items)) if rows is None else np.asarray(rows, dtype=np.int64)
        was = self.tower.training
        self.tower.eval()
        try:
            if self.features is not None:
                out = []
                for s in range(0, len(rows), 8192):
                    out.append(F.normalize(self.embed(rows[s : s + 8192]), dim=-1).cpu().numpy())
                return (
                    np.concatenate(out, axis=0).astype(np.float32)
                    if out
                    else np.zeros((0, self.tower.out_dim), np.float32)
                )
            sub = [self.items[i] for i in rows]
            if self.is_doc:
                return self.tower.encode_documents(sub, batch_size=self.batch_size, show_progress=False)
            return self.tower.encode_queries(sub, batch_size=self.batch_size, show_progress=False)
        finally:
            self.tower.train(was)
