"""A summary of a model or saved tower (what ``scalingnote models info`` prints)."""

from __future__ import annotations

import json
import os
from typing import Any

from scalingnote.models.loading import (
    TOWER_FILE,
    cached_gguf_dir,
    convert_gguf,
    count_non_embedding_params,
    load_backbone,
    resolve_source,
)
from scalingnote.models.towers.io import load_saved_tower


def model_info(
    name_or_path: str | os.PathLike, *, num_layers: int | None = None, cache_dir: str | os.PathLike | None = None
) -> dict[str, Any]:
    """Kind, sizes and parameter counts of a packaged name, HF directory, .gguf file or saved tower.

    A GGUF file is converted into the cache if it is not there yet.
    """
    src = resolve_source(name_or_path)
    info: dict[str, Any] = {"source": src.name, "form": src.form, "path": str(src.path)}
    if src.form == "tower":
        doc = json.loads((src.path / TOWER_FILE).read_text(encoding="utf-8"))
        tower = load_saved_tower(src.path, device="cpu", dtype="float32")
        cfg = doc["config"]
        info.update(
            kind=cfg["kind"],
            role=cfg["role"],
            base_model=cfg["base_model"],
            num_layers=cfg["num_layers"],
            base_num_layers=cfg["base_num_layers"],
            hidden_size=cfg["hidden_size"],
            dim=cfg["dim"],
            matryoshka_dims=cfg["matryoshka_dims"],
            pooling=cfg["pooling"],
            vocab_size=len(tower.tokenizer),
            params=sum(p.numel() for p in tower.parameters()),
            non_embedding_params=count_non_embedding_params(tower),
            fingerprint=doc["fingerprint"],
            compat_id=doc["compat_id"],
            compat_source=doc["compat_source"],
            storage=doc.get("storage", "full"),  # "base+trained": the trained parts over a base named by fingerprint
            base=doc.get("base"),
            trained_tensors=len(doc.get("trained_tensors", [])),
        )
        return info
    if src.form == "gguf":
        info["cached"] = cached_gguf_dir(src.path, cache_dir) is not None
    bb = load_backbone(src.path, num_layers=num_layers, cache_dir=cache_dir)
    cfg = bb.model.config
    tok = bb.tokenizer
    info.update(
        kind=bb.kind,
        model_type=cfg.model_type,
        hf_dir=str(bb.hf_dir),
        num_layers=bb.num_layers,
        base_num_layers=bb.base_num_layers,
        hidden_size=bb.hidden_size,
        vocab_size=len(tok),
        params=sum(p.numel() for p in bb.model.parameters()),
        non_embedding_params=count_non_embedding_params(bb.model),
        native_pooling=bb.native_pooling,
        eos_token=tok.eos_token,
        pad_token=tok.pad_token,
        cls_token=getattr(tok, "cls_token", None),
    )
    return info


def hidden_size(name_or_path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> int:
    """A model's hidden size (its backbone's width) read from its config, without loading weights:
    a saved tower's ``tower.json``, a Hugging Face ``config.json``, or a GGUF file's converted
    directory (converted into the cache once, as loading it would)."""
    src = resolve_source(name_or_path)
    if src.form in ("tower", "tower_backbone"):
        return int(json.loads((src.path / TOWER_FILE).read_text(encoding="utf-8"))["config"]["hidden_size"])
    hf_dir = convert_gguf(src.path, cache_dir) if src.form == "gguf" else src.path
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(hf_dir, local_files_only=True).hidden_size)
