"""Backbone surgery for frozen-prefix training: the layer list of a backbone, a sub-backbone
that runs layers ``start..stop`` on cached states, freezing the prefix."""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from scalingnote.errors import ConfigError

if TYPE_CHECKING:
    from scalingnote.models.towers.base import Tower

_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer)\.(\d+)\.")


# ============================================================================ backbone views
def layer_list(backbone: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a backbone (decoder: ``.layers``; BERT: ``.encoder.layer``)."""
    layers = getattr(backbone, "layers", None)
    if isinstance(layers, nn.ModuleList):
        return layers
    enc = getattr(backbone, "encoder", None)
    if enc is not None and isinstance(getattr(enc, "layer", None), nn.ModuleList):
        return enc.layer
    raise ConfigError(
        None,
        None,
        "trainable_layers",
        f"cannot find the transformer layers of {type(backbone).__name__} (LoRA-wrapped backbones cannot be split)",
    )


class _PassThroughEmbeddings(nn.Module):
    """Stands in for BERT's embedding block when the input already is a hidden state."""

    def forward(self, input_ids=None, inputs_embeds=None, **_: Any) -> Tensor:
        return inputs_embeds


def sub_backbone(
    backbone: nn.Module,
    start: int,
    stop: int | None = None,
    *,
    final_norm: bool = True,
    from_hidden: bool | None = None,
) -> nn.Module:
    """A view of ``backbone`` that runs only layers ``start .. stop-1`` (parameters shared).

    ``from_hidden`` (default ``start > 0``): the view is called with ``inputs_embeds`` = the hidden
    state entering layer ``start`` (the embedding block is skipped).
    ``final_norm=False`` drops a decoder's final norm (for a prefix that feeds more layers).
    Uses each model's own forward (masks, rotary positions), so the result equals the
    corresponding part of a full forward pass.
    """
    layers = list(layer_list(backbone))
    stop = len(layers) if stop is None else stop
    if not 0 <= start <= stop <= len(layers):
        raise ValueError(f"layer range {start}..{stop} outside 0..{len(layers)}")
    view = copy.copy(backbone)
    view._modules = dict(backbone._modules)  # a new child table; the children themselves are shared
    kept = nn.ModuleList(layers[start:stop])
    if isinstance(getattr(backbone, "layers", None), nn.ModuleList):  # decoder (Llama family)
        view._modules["layers"] = kept
        if not final_norm and "norm" in view._modules:
            view._modules["norm"] = nn.Identity()
    else:  # BERT: embeddings -> encoder.layer[...] (no final norm)
        encoder = backbone.encoder
        assert isinstance(encoder, nn.Module)  # layer_list found the BERT block list under it
        enc = copy.copy(encoder)
        enc._modules = dict(encoder._modules)
        enc._modules["layer"] = kept
        view._modules["encoder"] = enc
        if (start > 0) if from_hidden is None else from_hidden:
            view._modules["embeddings"] = _PassThroughEmbeddings()
        view._modules["pooler"] = None
    return view


def freeze_prefix(tower: Tower, trainable_layers: int | None) -> None:
    """Freeze the embeddings and the bottom ``L - k`` layers (``k = 0``: the whole backbone)."""
    if trainable_layers is None:
        return
    L = int(tower.config.num_layers)
    k = check_trainable_layers(trainable_layers, L)
    if k == 0:
        for p in tower.backbone.parameters():
            p.requires_grad_(False)
        return
    for name, p in tower.backbone.named_parameters():
        m = _LAYER_RE.search(name)
        if m is not None:
            if int(m.group(1)) < L - k:
                p.requires_grad_(False)
        elif "embed" in name:  # token / position / type embeddings and the embedding norm
            p.requires_grad_(False)


def check_trainable_layers(k: int | None, num_layers: int) -> int:
    if k is None:
        return num_layers
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= num_layers:
        raise ConfigError(None, None, "trainable_layers", f"must be 'all' or an integer in 0..{num_layers}, got {k!r}")
    return k
