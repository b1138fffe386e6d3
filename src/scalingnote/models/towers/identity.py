"""Tower identity (see :mod:`scalingnote.models.towers`): tokenizer and weight digests, and the
compatibility rules — :func:`pair_towers` (towers trained together) and :func:`check_compatible`
(an index refuses a query tower of another embedding space)."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from scalingnote.errors import ConfigError, ScalingNoteError

if TYPE_CHECKING:
    from scalingnote.models.towers.base import Tower
    from scalingnote.models.towers.classes import DocumentTower, QueryTower


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()[:32]


_TOKENIZER_PROBE = "Hello, World! Ünïcödé naïve café 123 4.5e-6 — “quotes” 中文分词 [EMB] <eos>"


def tokenizer_digest(tokenizer: Any) -> str:
    """Hash of a tokenizer's vocabulary (added tokens included) and its output on a probe text."""
    vocab = sorted(tokenizer.get_vocab().items())
    probe = list(tokenizer(_TOKENIZER_PROBE, add_special_tokens=True)["input_ids"])
    specials = {k: getattr(tokenizer, k, None) for k in ("bos_token", "eos_token", "pad_token", "cls_token", "sep_token")}
    return _sha({"vocab": vocab, "probe": probe, "specials": specials})


def weights_digest(module: nn.Module) -> str:
    """SHA-256 over every entry of ``module.state_dict()`` (name, shape, values as fp32)."""
    h = hashlib.sha256()
    sd = module.state_dict()
    for name in sorted(sd):
        t = sd[name].detach()
        t = t.to("cpu", torch.float32) if t.is_floating_point() else t.to("cpu")
        t = t.contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(memoryview(t.numpy()).cast("B"))
    return h.hexdigest()[:32]


# ====================================================================== compatibility


def pair_towers(query: QueryTower, document: DocumentTower) -> str:
    """Tie towers trained together (rule 2): both get the document tower's fresh fingerprint."""
    if query.role != "query" or document.role != "document":
        raise ValueError("pair_towers(query_tower, document_tower)")
    if query.out_dim != document.out_dim:
        raise ConfigError(None, None, "dim", f"query out_dim {query.out_dim} != document out_dim {document.out_dim}")
    cid = document.refresh_fingerprint()
    document.compat_id = cid
    query.compat_id = cid
    return cid


def check_compatible(query: Tower, compat_id: str, *, out_dim: int | None = None, where: str | None = None) -> None:
    """Raise :class:`~scalingnote.errors.ScalingNoteError` unless ``query`` can search an index
    built with document embeddings of ``compat_id`` (and ``out_dim``)."""
    prefix = f"{where}: " if where else ""
    if query.compat_id != compat_id:
        raise ScalingNoteError(
            f"{prefix}query tower (compat_id {query.compat_id}) is not compatible with document embeddings "
            f"of compat_id {compat_id}: use the query tower trained or distilled with that document tower"
        )
    if out_dim is not None and out_dim > query.out_dim:
        raise ScalingNoteError(f"{prefix}index dim {out_dim} exceeds the query tower's output dim {query.out_dim}")
