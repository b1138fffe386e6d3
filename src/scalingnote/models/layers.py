"""Which transformer layers of a checkpoint a tower keeps: the first N (truncation, the model-size
axis) or a listed subset (a student's start, chosen on validation by QKD)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from scalingnote.errors import ConfigError


def layer_list(model: nn.Module) -> nn.ModuleList:
    for attr in ("layers", "encoder.layer", "h", "transformer.h", "decoder.layers"):
        obj: Any = model
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, nn.ModuleList):
            return obj
    raise ConfigError(None, None, "num_layers", f"cannot find the layer list of {type(model).__name__}")


def select_layers(model: nn.Module, layers: Sequence[int]) -> nn.Module:
    """Keep the listed transformer layers of a loaded model, in order (in place): a student that
    starts from layers (0, 5) of a 6-layer teacher (DistilBERT's every-other-layer start, Sanh et
    al. 2019) instead of its bottom two."""
    ml = layer_list(model)
    keep = [ml[i] for i in layers]
    del ml[:]
    ml.extend(keep)
    for i, m in enumerate(keep):  # decoder layers index their KV-cache slot
        attn = getattr(m, "self_attn", None)
        if attn is not None and hasattr(attn, "layer_idx"):
            attn.layer_idx = i
    config: Any = model.config  # a transformers PretrainedConfig
    lt = getattr(config, "layer_types", None)
    config.num_hidden_layers = len(keep)
    if isinstance(lt, (list, tuple)) and len(lt) > max(layers):
        config.layer_types = [lt[i] for i in layers]
    return model


def is_bottom(layers: Sequence[int] | None) -> bool:
    """Whether ``layers`` lists a checkpoint's first ``len(layers)`` layers, i.e. is plain
    truncation (None = no list = the bottom ones too)."""
    return layers is None or list(layers) == list(range(len(layers)))


def check_layer_list(layers: Any, base_layers: int, where: Any) -> list[int]:
    """``layers`` as ascending unique layer indices of a ``base_layers``-layer checkpoint, or a
    :class:`ConfigError` naming ``where``."""
    ok = (
        isinstance(layers, (list, tuple))
        and layers
        and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
    )
    if not ok or list(layers) != sorted(set(layers)) or layers[0] < 0 or layers[-1] >= base_layers:
        raise ConfigError(
            where, None, "layers", f"must be ascending unique layer indices in 0..{base_layers - 1}, got {layers!r}"
        )
    return [int(i) for i in layers]


def start_candidates(k: int, n: int) -> list[list[int]]:
    """Where a ``k``-layer student of an ``n``-layer teacher can start: its bottom ``k`` layers (the
    paper's truncated student), ``k`` layers spread evenly from the first to the last (DistilBERT's
    every-other-layer start; ``[0, 5]`` for 2 of 6), and its top ``k`` layers. Unique, bottom
    first; one candidate when ``k >= n``."""
    if k >= n:
        return [list(range(k))]
    spread = sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [n - 1]
    out: list[list[int]] = []
    for c in (list(range(k)), spread, list(range(n - k, n))):
        if len(c) == k and c not in out:
            out.append(c)
    return out


__all__ = ["check_layer_list", "is_bottom", "layer_list", "select_layers", "start_candidates"]
