"""LoRA (PEFT) on the trained top ``k`` layers of a tower over a cached prefix.

The adapters are injected into the backbone in place (``peft.inject_adapter_in_model``, no
``PeftModel`` wrapper), so :func:`~scalingnote.models.prefix.sub_backbone` views still find the
layers, and only layers ``L - k .. L - 1`` get adapters: the frozen prefix — and with it the key
of its cache — is untouched. LoRA's ``B`` starts at zero, so a fresh adapter changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.models.prefix.surgery import check_trainable_layers, layer_list

if TYPE_CHECKING:
    from scalingnote.models.towers.base import Tower


def _layers_pattern(backbone: nn.Module) -> str:
    return "layers" if isinstance(getattr(backbone, "layers", None), nn.ModuleList) else "layer"


def add_top_lora(tower: Tower, trainable_layers: int, spec: Any) -> None:
    """Put LoRA adapters (``spec``: ``r``, ``alpha``, ``dropout``, ``target_modules``) on the top
    ``trainable_layers`` layers; every other backbone weight, the top layers' own included, is frozen."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as e:  # pragma: no cover - peft is a pinned dependency
        raise ScalingNoteError("lora: the peft package is not installed") from e
    L = int(tower.config.num_layers)
    k = check_trainable_layers(trainable_layers, L)
    if k == 0:
        raise ConfigError(
            None, None, "lora", "LoRA needs trainable layers (trainable_layers > 0): a k = 0 tower trains its head only"
        )
    layer_list(tower.backbone)  # a clear error for backbones without a layer list
    lc = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules),
        layers_to_transform=list(range(L - k, L)),
        layers_pattern=_layers_pattern(tower.backbone),
    )
    try:
        inject_adapter_in_model(lc, tower.backbone)
    except ValueError as e:
        raise ConfigError(
            None, None, "lora.target_modules", f"{list(spec.target_modules)} on a {tower.config.kind} tower: {e}"
        ) from None
    for name, p in tower.backbone.named_parameters():
        p.requires_grad_("lora_" in name)


def has_lora(module: nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    return any(isinstance(m, LoraLayer) for m in module.modules())


def merge_lora(tower: Tower) -> int:
    """Fold injected adapters into their base weights and remove them (a plain backbone again,
    what :meth:`save` writes). Returns how many layers were merged."""
    from peft.tuners.lora import LoraLayer

    found = [(name, m) for name, m in tower.backbone.named_modules() if isinstance(m, LoraLayer)]
    for name, m in found:
        m.merge()
        parent_name, _, child = name.rpartition(".")
        parent = tower.backbone.get_submodule(parent_name) if parent_name else tower.backbone
        setattr(parent, child, m.get_base_layer())
    return len(found)
