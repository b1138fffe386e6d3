"""Tower identity (see :mod:`scalingnote.models.towers`): the tokenizer and weight digests hashed
into a tower's fingerprint and space id. The compatibility rules built on them
(:func:`~scalingnote.models.towers.classes.pair_towers`, :func:`~scalingnote.models.towers.classes.check_compatible`)
live beside the tower classes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from torch import nn


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()[:32]


_TOKENIZER_PROBE = "Hello, World! Ünïcödé naïve café 123 4.5e-6 — “quotes” 中文分词 [EMB] <eos>"


def tokenizer_digest(tokenizer: Any) -> str:
    """Hash of a tokenizer's vocabulary (added tokens included) and its output on a probe text."""
    vocab = sorted(tokenizer.get_vocab().items())
    probe = list(tokenizer(_TOKENIZER_PROBE, add_special_tokens=True)["input_ids"])
    specials = {
        k: getattr(tokenizer, k, None) for k in ("bos_token", "eos_token", "pad_token", "cls_token", "sep_token")
    }
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
