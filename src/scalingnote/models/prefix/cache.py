"""The on-disk feature cache of frozen-prefix states (keyed by tower, depth, weights and
tokenizer), and filling it for a list of texts or documents."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from scalingnote.data.types import Document, Query
from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.utils.io import atomic_path, write_json

from scalingnote.models.prefix.surgery import _LAYER_RE, check_trainable_layers, layer_list, sub_backbone

FORMAT = "scalingnote-feature-cache"
FORMAT_VERSION = 1


# ============================================================================ keys
def prefix_weights_digest(backbone: nn.Module, depth: int, *, final_norm: bool) -> str:
    """SHA-256 over the frozen part of a backbone: every state entry that is not a layer at
    index >= ``depth`` (and not the final norm unless ``final_norm``; BERT's pooler never)."""
    h = hashlib.sha256()
    sd = backbone.state_dict()
    for name in sorted(sd):
        m = _LAYER_RE.search(name)
        if m is not None and int(m.group(1)) >= depth:
            continue
        if name.startswith("pooler."):
            continue
        if not final_norm and m is None and name.startswith("norm."):
            continue
        t = sd[name].detach()
        t = (t.to("cpu", torch.float32) if t.is_floating_point() else t.to("cpu")).contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(memoryview(t.numpy()).cast("B"))
    return h.hexdigest()[:32]


def cache_key(tower: nn.Module, trainable_layers: int, *, depth: int | None = None) -> dict[str, Any]:
    """The fields a cache of ``tower``'s frozen prefix depends on.

    ``depth`` (``k = 0`` only): the key the same model truncated to ``depth`` layers would have.
    """
    from scalingnote.models.towers import tokenizer_digest

    cfg = tower.config
    L = int(cfg.num_layers)
    k = check_trainable_layers(trainable_layers, L)
    pooled = k == 0
    d = L - k if depth is None else int(depth)
    if depth is not None and not pooled:
        raise ValueError("depth= is only for pooled (k = 0) caches")
    return {
        "kind": cfg.kind,
        "role": cfg.role,
        "depth": d,
        "pooled": pooled,
        "pooling": cfg.pooling if pooled else None,
        "max_length": int(cfg.max_query_length if cfg.role == "query" else cfg.max_doc_length),
        "doc_prompt": cfg.doc_prompt,
        "field_caps": cfg.field_caps,
        "tokenizer": tokenizer_digest(tower.tokenizer),
        "weights": prefix_weights_digest(tower.backbone, d, final_norm=pooled),
    }


def key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()[:24]


def item_key(item: Any) -> str:
    """Row key: hash of a query text, or of a document's (title, topic, content)."""
    if isinstance(item, Document):
        payload = json.dumps(["doc", item.title, item.topic, item.content], ensure_ascii=False)
    else:
        payload = json.dumps(["text", item.text if isinstance(item, Query) else item], ensure_ascii=False)
    return hashlib.sha1(payload.encode("utf-8")).hexdigest()


# ============================================================================ the cache
class FeatureCache:
    """One directory of cached features for one key: ``meta.json`` + ``part-NNNNN.{npy,json}``.

    Pooled caches hold ``[n, V, H]`` (V = 3 document views for an LLM document tower, else 1);
    token caches hold the concatenated real-token states ``[sum(len), H]`` with offsets. A part
    counts once its ``.json`` exists (written after its ``.npy``), so an interrupted write
    leaves at most an orphan array that is overwritten on resume.
    """

    def __init__(self, root: str | Path, key: dict[str, Any]):
        self.root = Path(root)
        self.key = dict(key)
        meta = self.root / "meta.json"
        if meta.exists():
            try:
                stored = json.loads(meta.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ConfigError(meta, e.lineno, None, f"invalid JSON: {e.msg}") from None
            if stored.get("format") != FORMAT or stored.get("format_version") != FORMAT_VERSION:
                raise ConfigError(meta, None, "format", f"not a {FORMAT} v{FORMAT_VERSION} directory")
            old = stored.get("key", {})
            diff = sorted(k for k in set(old) | set(self.key) if old.get(k) != self.key.get(k))
            if diff:
                raise ScalingNoteError(
                    f"{meta}: feature cache was made for another tower or setting (differs in {', '.join(diff)}); "
                    "refusing to use it — delete the directory or choose another feature_cache_dir"
                )
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            write_json(meta, {"format": FORMAT, "format_version": FORMAT_VERSION, "key": self.key})
        self._index: dict[str, tuple[int, int]] = {}
        self._parts: list[dict[str, Any]] = []
        self._arrays: dict[int, np.ndarray] = {}
        self._load_index()

    @classmethod
    def for_tower(cls, root: str | Path, tower: nn.Module, trainable_layers: int, *, depth: int | None = None) -> FeatureCache:
        """The cache of ``tower``'s prefix under ``root/<key digest>/``."""
        key = cache_key(tower, trainable_layers, depth=depth)
        return cls(Path(root) / f"{key['role']}-d{key['depth']}-{'pooled' if key['pooled'] else 'tokens'}-{key_digest(key)}", key)

    @property
    def pooled(self) -> bool:
        return bool(self.key["pooled"])

    def _load_index(self) -> None:
        parts = sorted(self.root.glob("part-*.json"))
        for p in parts:
            info = json.loads(p.read_text(encoding="utf-8"))
            pi = len(self._parts)
            info["npy"] = p.with_suffix(".npy")
            self._parts.append(info)
            for row, k in enumerate(info["keys"]):
                self._index.setdefault(k, (pi, row))

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: str) -> bool:
        return key in self._index

    def missing(self, keys: Sequence[str]) -> list[int]:
        """Positions of ``keys`` not in the cache (first occurrence of each)."""
        seen: set[str] = set()
        out = []
        for i, k in enumerate(keys):
            if k not in self._index and k not in seen:
                seen.add(k)
                out.append(i)
        return out

    def _array(self, pi: int) -> np.ndarray:
        a = self._arrays.get(pi)
        if a is None:
            a = np.load(self._parts[pi]["npy"], mmap_mode="r")
            self._arrays[pi] = a
        return a

    def add(self, keys: Sequence[str], features: Sequence[np.ndarray] | np.ndarray) -> None:
        """Store one part: pooled ``[n, V, H]`` or a list of ``[len_i, H]`` token states."""
        if len(keys) == 0:
            return
        pi = len(self._parts)
        # a unique name: two processes filling one cache never overwrite each other's parts
        stem = self.root / f"part-{pi:05d}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        info: dict[str, Any] = {"keys": list(keys)}
        if self.pooled:
            arr = np.ascontiguousarray(np.asarray(features, dtype=np.float32))
            if arr.ndim != 3 or arr.shape[0] != len(keys):
                raise ValueError(f"pooled features must be [n, V, H] with n = {len(keys)}, got {arr.shape}")
        else:
            lens = [int(f.shape[0]) for f in features]
            info["offsets"] = np.concatenate([[0], np.cumsum(lens)]).tolist()
            arr = np.ascontiguousarray(np.concatenate([np.asarray(f, dtype=np.float32) for f in features]))
        with atomic_path(stem.with_suffix(".npy"), suffix=".npy") as tmp:
            np.save(tmp, arr)
        write_json(stem.with_suffix(".json"), info, indent=None)
        info["npy"] = stem.with_suffix(".npy")
        self._parts.append(info)
        for row, k in enumerate(keys):
            self._index.setdefault(k, (pi, row))

    def pooled_rows(self, keys: Sequence[str]) -> np.ndarray:
        """``[n, V, H]`` float32 for cached keys (KeyError names the first missing one)."""
        out = None
        for i, k in enumerate(keys):
            pi, row = self._index[k]
            a = self._array(pi)
            if out is None:
                out = np.empty((len(keys),) + a.shape[1:], dtype=np.float32)
            out[i] = a[row]
        return out if out is not None else np.zeros((0, 1, 1), dtype=np.float32)

    def token_rows(self, keys: Sequence[str]) -> list[np.ndarray]:
        """``[len_i, H]`` per key (memory-mapped slices)."""
        res = []
        for k in keys:
            pi, row = self._index[k]
            off = self._parts[pi]["offsets"]
            res.append(self._array(pi)[off[row] : off[row + 1]])
        return res


# ============================================================================ filling
def _encodings(tower, items: Sequence[Any]) -> list[Any]:
    if tower.config.role == "query":
        return tower.query_ids([it.text if isinstance(it, Query) else it for it in items])
    return tower.document_encodings(list(items))


def _collate(tower, encs: list[Any]) -> Any:
    if tower.config.role == "query":
        return tower._batch(encs)[0]
    return tower.collate_documents(encs)


def _ids_of(tower, enc: Any) -> list[int]:
    return enc if tower.config.role == "query" else enc.input_ids


def _pooled_views(tower, pooled: Tensor) -> Tensor:
    """``[B, V, H]`` from a tower's pooled output (``[B, H]`` or ``[B, 3, H]``)."""
    return pooled if pooled.dim() == 3 else pooled.unsqueeze(1)


def _iter_parts(tower, items: Sequence[Any], todo: list[int], part_size: int, batch_size: int):
    """Yield ``(part, batches)``: ``part`` = positions in ``items`` (one cache part), ``batches`` =
    ``(rows of part, device batch)`` in longest-first order (minimal padding)."""
    dev = tower.device
    for p0 in range(0, len(todo), part_size):
        part = todo[p0 : p0 + part_size]
        encs = _encodings(tower, [items[i] for i in part])
        order = sorted(range(len(part)), key=lambda j: -len(_ids_of(tower, encs[j])))
        chunks = (order[b : b + batch_size] for b in range(0, len(order), batch_size))
        yield part, ((idx, {kk: v.to(dev) for kk, v in _collate(tower, [encs[j] for j in idx]).items()}) for idx in chunks)


@torch.no_grad()
def fill_cache(cache: FeatureCache, tower, trainable_layers: int, items: Sequence[Any], *, batch_size: int = 32,
               part_size: int = 2048, show_progress: bool = True) -> int:
    """Compute and store the prefix features of the ``items`` not yet cached. Returns how many."""
    from tqdm.auto import tqdm

    keys = [item_key(it) for it in items]
    todo = cache.missing(keys)
    if not todo:
        return 0
    L = int(tower.config.num_layers)
    k = check_trainable_layers(trainable_layers, L)
    was_training = tower.training
    tower.eval()
    bottom = None if k == 0 else sub_backbone(tower.backbone, 0, L - k, final_norm=False)
    try:
        with tqdm(total=len(todo), desc=f"feature cache ({tower.config.role}, depth {cache.key['depth']})", unit="text",
                  disable=not show_progress) as bar:
            for part, batches in _iter_parts(tower, items, todo, part_size, batch_size):
                feats: list[Any] = [None] * len(part)
                for idx, batch in batches:
                    if k == 0:
                        p = _pooled_views(tower, tower.pooled(batch)).float().cpu().numpy()
                        for r, j in enumerate(idx):
                            feats[j] = p[r]
                    else:
                        h = tower.run_layers(batch, backbone=bottom).float().cpu().numpy()
                        mask = batch["attention_mask"].cpu().numpy().astype(bool)
                        for r, j in enumerate(idx):
                            feats[j] = h[r][mask[r]]
                    bar.update(len(idx))
                cache.add([keys[i] for i in part], np.stack(feats) if k == 0 else feats)
    finally:
        tower.train(was_training)
    return len(todo)


@torch.no_grad()
def fill_pooled_depths(root: str | Path, tower, depths: Sequence[int], items: Sequence[Any], *, batch_size: int = 16,
                       part_size: int = 1024, show_progress: bool = True) -> dict[int, FeatureCache]:
    """One pass of ``tower`` fills the ``k = 0`` caches of the same model truncated to each depth.

    The state after layer ``N`` (+ the final norm of a decoder) pooled the tower's way is what a
    tower truncated to ``N`` layers pools; :func:`cache_key` with ``depth=N`` gives that tower's key.
    """
    from tqdm.auto import tqdm

    L = int(tower.config.num_layers)
    depths = sorted({int(d) for d in depths})
    if not depths or depths[0] < 1 or depths[-1] > L:
        raise ValueError(f"depths must be in 1..{L}, got {depths}")
    caches = {d: FeatureCache.for_tower(root, tower, 0, depth=d) for d in depths}
    keys = [item_key(it) for it in items]
    todo = sorted({i for c in caches.values() for i in c.missing(keys)})
    if not todo:
        return caches
    layers = layer_list(tower.backbone)
    norm = getattr(tower.backbone, "norm", None) if tower.config.kind == "llm" else None
    captured: dict[int, Tensor] = {}
    hooks = [layers[d - 1].register_forward_hook(lambda m, a, out, d=d: captured.__setitem__(d, out[0] if isinstance(out, tuple) else out))
             for d in depths]
    top = sub_backbone(tower.backbone, 0, depths[-1])  # no need to run layers above the deepest depth
    was_training = tower.training
    tower.eval()
    try:
        with tqdm(total=len(todo), desc=f"feature cache ({tower.config.role}, depths {depths})", unit="text",
                  disable=not show_progress) as bar:
            for part, batches in _iter_parts(tower, items, todo, part_size, batch_size):
                feats = {d: [None] * len(part) for d in depths}
                for idx, batch in batches:
                    captured.clear()
                    tower.run_layers(batch, backbone=top)
                    for d in depths:
                        h = captured[d]
                        if norm is not None:
                            h = norm(h)
                        p = _pooled_views(tower, tower.pool_hidden(h, batch)).float().cpu().numpy()
                        for r, j in enumerate(idx):
                            feats[d][j] = p[r]
                    bar.update(len(idx))
                for d in depths:
                    c = caches[d]
                    sel = [j for j, i in enumerate(part) if keys[i] not in c]
                    c.add([keys[part[j]] for j in sel], np.stack([feats[d][j] for j in sel]) if sel else np.zeros((0, 1, 1)))
    finally:
        for hk in hooks:
            hk.remove()
        tower.train(was_training)
    return caches
