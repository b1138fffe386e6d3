"""The on-disk feature cache of frozen-prefix states (keyed by tower, depth, weights, tokenizer
and storage dtype); filling it is :mod:`scalingnote.models.prefix.fill`."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from scalingnote.data.types import Document, Query
from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.models.prefix.surgery import _LAYER_RE, check_trainable_layers
from scalingnote.models.towers.identity import tokenizer_digest
from scalingnote.utils.io import atomic_path, write_json

if TYPE_CHECKING:
    from scalingnote.models.towers.base import Tower

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


#: storage dtypes of token caches (pooled caches are always float32: one row per text is small)
TOKEN_DTYPES = ("float16", "float32")


def cache_key(
    tower: Tower, trainable_layers: int, *, depth: int | None = None, dtype: str = "float16"
) -> dict[str, Any]:
    """The fields a cache of ``tower``'s frozen prefix depends on.

    ``depth``: the number of frozen layers (default ``L - k``) — the key the same model truncated
    to ``depth + k`` layers would have (a token cache of prefix depth ``d`` serves every
    ``(L', k)`` with ``L' - k = d``). ``dtype`` (token caches only): ``"float16"`` (half the disk
    of float32; the step upcasts) or ``"float32"`` (exact).
    """

    cfg = tower.config
    L = int(cfg.num_layers)
    k = check_trainable_layers(trainable_layers, L)
    pooled = k == 0
    d = L - k if depth is None else int(depth)
    if not 0 <= d <= L:
        raise ValueError(f"cache depth must be in 0..{L}, got {d}")
    key = {
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
    if not pooled:  # pooled keys keep their v1 fields: existing pooled caches stay valid
        if dtype not in TOKEN_DTYPES:
            raise ConfigError(None, None, "feature_cache_dtype", f"must be one of {TOKEN_DTYPES}, got {dtype!r}")
        key["dtype"] = dtype
    return key


def cache_dir_name(key: dict[str, Any]) -> str:
    return f"{key['role']}-d{key['depth']}-{'pooled' if key['pooled'] else 'tokens'}-{key_digest(key)}"


def holds_tokens(dir_name: str) -> bool:
    """Whether a cache directory named by :func:`cache_dir_name` holds token features (not pooled)."""
    return "-tokens-" in dir_name


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

    Pooled caches hold ``[n, V, H]`` float32 (V = 3 document views for an LLM document tower,
    else 1); token caches hold the concatenated real-token states ``[sum(len), H]`` in the key's
    ``dtype`` (float16 by default) with offsets, and for an LLM document tower the positions
    before its §3.2 placeholders (checked against the re-tokenized batch at every read). Parts
    are memory-mapped when read. A part counts once its ``.json`` exists (written atomically
    after its atomically written ``.npy``), so an interrupted fill leaves at most an orphan array,
    never a part a reader would take for complete.
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
        #: the size estimate of the last fill, made before it computed anything ({rows, tokens, bytes, gb})
        self.planned: dict[str, Any] | None = None
        self._load_index()

    @classmethod
    def for_tower(
        cls,
        root: str | Path,
        tower: Tower,
        trainable_layers: int,
        *,
        depth: int | None = None,
        dtype: str = "float16",
    ) -> FeatureCache:
        """The cache of ``tower``'s prefix under ``root/<role>-d<depth>-<pooled|tokens>-<key digest>/``."""
        key = cache_key(tower, trainable_layers, depth=depth, dtype=dtype)
        return cls(Path(root) / cache_dir_name(key), key)

    @property
    def pooled(self) -> bool:
        return bool(self.key["pooled"])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.key.get("dtype", "float32"))

    def disk_bytes(self) -> int:
        """Bytes of the finished parts on disk (arrays and their indexes)."""
        return sum(p["npy"].stat().st_size + p["npy"].with_suffix(".json").stat().st_size for p in self._parts)

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

    def add(
        self,
        keys: Sequence[str],
        features: Sequence[np.ndarray] | np.ndarray,
        view_positions: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Store one part: pooled ``[n, V, H]`` or a list of ``[len_i, H]`` token states (with the
        unpadded positions before the 3 placeholders of each document, LLM document towers)."""
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
            arr = np.ascontiguousarray(np.concatenate([np.asarray(f) for f in features]).astype(self.dtype, copy=False))
            if view_positions is not None:
                info["view_positions"] = [[int(v) for v in vp] for vp in view_positions]
        if not np.isfinite(arr).all():
            raise ScalingNoteError(
                f"feature cache {self.root}: non-finite states (beyond the {self.dtype} range?) — use float32 storage "
                "(feature_cache_dtype: float32)"
            )
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
        """``[len_i, H]`` per key in the storage dtype (memory-mapped slices)."""
        res = []
        for k in keys:
            pi, row = self._index[k]
            off = self._parts[pi]["offsets"]
            res.append(self._array(pi)[off[row] : off[row + 1]])
        return res

    def view_positions(self, keys: Sequence[str]) -> list[list[int]] | None:
        """The cached positions before the 3 placeholders per key (None: not a document prompt cache)."""
        out = []
        for k in keys:
            pi, row = self._index[k]
            vp = self._parts[pi].get("view_positions")
            if vp is None:
                return None
            out.append(vp[row])
        return out
