"""Filling feature caches: one pass of a tower's frozen prefix fills the pooled (``k = 0``) and
token (``0 < k``) caches of several ``(depth, k)`` pairs, with the disk size estimated and
logged before anything is computed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from scalingnote.data.types import Query
from scalingnote.models.prefix.cache import FeatureCache, cache_dir_name, cache_key, item_key
from scalingnote.models.prefix.surgery import check_trainable_layers, layer_list, sub_backbone

log = logging.getLogger(__name__)

#: JSON index bytes per row (key, offset, view positions), for the size estimate
_ROW_OVERHEAD = 64


# ============================================================================ tokenization
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


def _view_positions(tower, enc: Any) -> tuple[int, int, int] | None:
    """Unpadded positions before the §3.2 placeholders (LLM document prompt), else None."""
    return tuple(enc.view_positions) if tower.config.role == "document" and tower.kind == "llm" else None


def _pooled_views(tower, pooled: Tensor) -> Tensor:
    """``[B, V, H]`` from a tower's pooled output (``[B, H]`` or ``[B, 3, H]``)."""
    return pooled if pooled.dim() == 3 else pooled.unsqueeze(1)


def _iter_parts(tower, items: Sequence[Any], todo: list[int], part_size: int, batch_size: int):
    """Yield ``(part, encs, batches)``: ``part`` = positions in ``items`` (one cache part), ``encs``
    their encodings, ``batches`` = ``(rows of part, device batch)`` longest first (minimal padding)."""
    dev = tower.device
    for p0 in range(0, len(todo), part_size):
        part = todo[p0 : p0 + part_size]
        encs = _encodings(tower, [items[i] for i in part])
        order = sorted(range(len(part)), key=lambda j: -len(_ids_of(tower, encs[j])))
        chunks = (order[b : b + batch_size] for b in range(0, len(order), batch_size))
        yield (
            part,
            encs,
            ((idx, {kk: v.to(dev) for kk, v in _collate(tower, [encs[j] for j in idx]).items()}) for idx in chunks),
        )


# ============================================================================ size estimate
def _size(tower, pooled: bool, dtype: np.dtype, encs: list[Any]) -> dict[str, Any]:
    H = int(tower.config.hidden_size)
    n = len(encs)
    tokens = sum(len(_ids_of(tower, e)) for e in encs)
    if pooled:
        views = 3 if tower.config.role == "document" and tower.kind == "llm" else 1
        data = n * views * H * 4
    else:
        data = tokens * H * dtype.itemsize
    b = data + n * _ROW_OVERHEAD
    return {"rows": n, "tokens": tokens, "bytes": b, "gb": round(b / 1e9, 4)}


def estimate_cache_bytes(
    tower, trainable_layers: int, items: Sequence[Any], *, dtype: str = "float16"
) -> dict[str, Any]:
    """Disk size of the cache of ``items`` for ``trainable_layers = k`` before anything is computed:
    token count x hidden size x bytes per value (2 for float16) for a token cache, rows x views x
    hidden x 4 for a pooled one, plus the index. Returns ``{rows, tokens, bytes, gb}``."""
    k = check_trainable_layers(trainable_layers, int(tower.config.num_layers))
    return _size(tower, k == 0, np.dtype("float32" if k == 0 else dtype), _encodings(tower, list(items)))


def _log_plan(
    tower, caches: Sequence[FeatureCache], todo: list[int], items: Sequence[Any], keys: list[str]
) -> dict[str, dict]:
    encs = _encodings(tower, [items[i] for i in todo])
    plan = {}
    for c in caches:
        mine = [e for e, i in zip(encs, todo, strict=True) if keys[i] not in c]
        est = _size(tower, c.pooled, c.dtype, mine)
        c.planned = est
        plan[c.root.name] = est
        log.info(
            "feature cache %s: %d texts (%d tokens) to add, ~%.3f GB on disk (%s)",
            c.root,
            est["rows"],
            est["tokens"],
            est["gb"],
            "float32 pooled" if c.pooled else f"{c.dtype} tokens",
        )
    return plan


# ============================================================================ filling
@torch.no_grad()
def fill_targets(
    tower,
    items: Sequence[Any],
    caches: Sequence[FeatureCache],
    *,
    batch_size: int = 32,
    part_size: int = 256,
    show_progress: bool = True,
) -> int:
    """One pass of ``tower``'s prefix (up to the deepest cache) fills every cache in ``caches``
    (pooled: the state after ``depth`` layers + a decoder's final norm, pooled the tower's way;
    tokens: the state entering layer ``depth``, every real token). Returns the rows computed."""
    from tqdm.auto import tqdm

    keys = [item_key(it) for it in items]
    todo = sorted({i for c in caches for i in c.missing(keys)})
    if not todo:
        return 0
    _log_plan(tower, caches, todo, items, keys)
    L = int(tower.config.num_layers)
    layers = layer_list(tower.backbone)
    depths = {int(c.key["depth"]) for c in caches}
    if min(depths) < 0 or max(depths) > L:
        raise ValueError(f"cache depths must be in 0..{L}, got {sorted(depths)}")
    norm = getattr(tower.backbone, "norm", None) if tower.config.kind == "llm" else None
    captured: dict[tuple[bool, int], Tensor] = {}

    def after(d):  # the output of layer d - 1 (pooled caches)
        return lambda m, a, out: captured.__setitem__((True, d), out[0] if isinstance(out, tuple) else out)

    def before(d):  # the input of layer d (token caches)
        return lambda m, args, kwargs: captured.__setitem__((False, d), args[0] if args else kwargs["hidden_states"])

    hooks = []
    for pooled, d in {(c.pooled, int(c.key["depth"])) for c in caches}:
        if pooled:
            hooks.append(layers[d - 1].register_forward_hook(after(d)))
        else:
            hooks.append(layers[d].register_forward_pre_hook(before(d), with_kwargs=True))
    stop = max(int(c.key["depth"]) + (0 if c.pooled else 1) for c in caches)
    run = sub_backbone(tower.backbone, 0, stop, final_norm=False)  # no layer above the deepest one needed
    was_training = tower.training
    tower.eval()
    desc = f"feature cache ({tower.config.role}, {', '.join(sorted(c.root.name.rsplit('-', 1)[0] for c in caches))})"
    try:
        with tqdm(total=len(todo), desc=desc, unit="text", disable=not show_progress) as bar:
            for part, encs, batches in _iter_parts(tower, items, todo, part_size, batch_size):
                feats: dict[int, list[Any]] = {id(c): [None] * len(part) for c in caches}
                for idx, batch in batches:
                    captured.clear()
                    tower.run_layers(batch, backbone=run)
                    mask = batch["attention_mask"].bool()
                    for c in caches:
                        h = captured[(c.pooled, int(c.key["depth"]))]
                        if c.pooled:
                            p = (
                                _pooled_views(tower, tower.pool_hidden(norm(h) if norm is not None else h, batch))
                                .float()
                                .cpu()
                                .numpy()
                            )
                            rows = [p[r] for r in range(len(idx))]
                        else:
                            h = h.to(torch.float16 if c.dtype == np.float16 else torch.float32).cpu()
                            rows = [h[r][mask[r].cpu()].numpy() for r in range(len(idx))]
                        for r, j in enumerate(idx):
                            feats[id(c)][j] = rows[r]
                    bar.update(len(idx))
                for c in caches:
                    sel = [j for j, i in enumerate(part) if keys[i] not in c]
                    if not sel:
                        continue
                    f = [feats[id(c)][j] for j in sel]
                    vps = [_view_positions(tower, encs[j]) for j in sel]
                    positions = None
                    if not (c.pooled or vps[0] is None):
                        positions = [v for v in vps if v is not None]
                        assert len(positions) == len(vps)  # one tower: every text has the same prompt
                    c.add([keys[part[j]] for j in sel], np.stack(f) if c.pooled else f, view_positions=positions)
    finally:
        for hk in hooks:
            hk.remove()
        tower.train(was_training)
    return len(todo)


def fill_cache(
    cache: FeatureCache,
    tower,
    trainable_layers: int,
    items: Sequence[Any],
    *,
    batch_size: int = 32,
    part_size: int = 256,
    show_progress: bool = True,
) -> int:
    """Compute and store the prefix features of the ``items`` not yet cached. Returns how many."""
    check_trainable_layers(trainable_layers, int(tower.config.num_layers))
    return fill_targets(tower, items, [cache], batch_size=batch_size, part_size=part_size, show_progress=show_progress)


def fill_depths(
    root: str | Path,
    tower,
    pairs: Sequence[tuple[int, int]],
    items: Sequence[Any],
    *,
    dtype: str = "float16",
    batch_size: int = 16,
    part_size: int = 256,
    show_progress: bool = True,
) -> dict[tuple[int, int], FeatureCache]:
    """One pass of ``tower`` fills the caches of the same model truncated to ``N`` layers with its
    top ``k`` trainable, for every ``(N, k)`` in ``pairs``: ``k = 0`` the pooled state after layer
    ``N``; ``k > 0`` the token states entering layer ``N - k`` (pairs with equal ``N - k`` share
    one cache). Each cache's key is the one that truncated tower computes (:func:`cache_key`)."""
    L = int(tower.config.num_layers)
    pairs = sorted({(int(n), int(k)) for n, k in pairs})
    bad = [(n, k) for n, k in pairs if not (1 <= n <= L and 0 <= k <= n)]
    if not pairs or bad:
        raise ValueError(f"(depth, k) pairs need 1 <= depth <= {L} and 0 <= k <= depth, got {bad or pairs}")
    by_dir: dict[str, FeatureCache] = {}
    out = {}
    for n, k in pairs:
        key = cache_key(tower, 0 if k == 0 else 1, depth=n - k, dtype=dtype)  # any k > 0 gives the token fields
        name = cache_dir_name(key)
        out[(n, k)] = by_dir.setdefault(name, FeatureCache(Path(root) / name, key))
    fill_targets(
        tower, items, list(by_dir.values()), batch_size=batch_size, part_size=part_size, show_progress=show_progress
    )
    return out


def fill_pooled_depths(
    root: str | Path,
    tower,
    depths: Sequence[int],
    items: Sequence[Any],
    *,
    batch_size: int = 16,
    part_size: int = 1024,
    show_progress: bool = True,
) -> dict[int, FeatureCache]:
    """One pass of ``tower`` fills the ``k = 0`` caches of the same model truncated to each depth
    (the state after layer ``N`` + a decoder's final norm, pooled the tower's way)."""
    L = int(tower.config.num_layers)
    depths = sorted({int(d) for d in depths})
    if not depths or depths[0] < 1 or depths[-1] > L:
        raise ValueError(f"depths must be in 1..{L}, got {depths}")
    caches = fill_depths(
        root,
        tower,
        [(d, 0) for d in depths],
        items,
        batch_size=batch_size,
        part_size=part_size,
        show_progress=show_progress,
    )
    return {n: c for (n, _), c in caches.items()}
