"""The tower base class: backbone + tokenizer + optional projection ``W`` with Matryoshka
prefixes, fingerprint / compat id, padding, the encoding loop and saving (ScalingNote §3.2)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from scalingnote.data.types import Document, Query
from scalingnote.errors import ConfigError
from scalingnote.models._fs import atomic_dir
from scalingnote.models.loading import TOWER_FILE, count_non_embedding_params, quiet_transformers
from scalingnote.models.prompt import special_prefix
from scalingnote.models.towers.config import FORMAT, FORMAT_VERSION, TowerConfig
from scalingnote.models.towers.identity import _sha, tokenizer_digest, weights_digest
from scalingnote.models.towers.pooling import PoolingMode, pooling_mode
from scalingnote.models.towers.store import STORAGE_BASE, STORAGE_FULL, TRAINED_FILE, trained_parts
from scalingnote.utils import run_metadata


def _as_texts(texts: Any, what: str) -> list[str]:
    """Strings (or :class:`~scalingnote.data.Query` records, whose ``.text`` is used)."""
    if isinstance(texts, str):
        raise TypeError(f"{what} must be a list of strings, not a single string")
    out = []
    for i, t in enumerate(texts):
        if isinstance(t, Query):
            t = t.text
        if not isinstance(t, str):
            raise TypeError(f"{what}[{i}] must be a str or Query, got {type(t).__name__}")
        out.append(t)
    return out


def _as_docs(docs: Any) -> list[Document]:
    out = list(docs)
    for i, d in enumerate(out):
        if not isinstance(d, Document):
            raise TypeError(f"docs[{i}] must be a scalingnote.data.Document, got {type(d).__name__}")
    return out


class Tower(nn.Module):
    """Common machinery: backbone + tokenizer + optional projection, encode loop, save, identity."""

    role: ClassVar[str] = ""
    center: torch.Tensor | None  #: the centre ``c`` (a buffer; None without a projection)
    source_path: str | None = None  #: the saved directory the tower was loaded from (None: built in memory)

    def __init__(self, config: TowerConfig, backbone: nn.Module, tokenizer: Any, projection: nn.Linear | None = None):
        super().__init__()
        if config.role != self.role:
            raise ValueError(f"{type(self).__name__} needs role={self.role!r}, config has {config.role!r}")
        if (projection is None) != (config.dim is None):
            raise ValueError("projection must be given exactly when config.dim is set")
        if projection is not None and tuple(projection.weight.shape) != (config.dim, config.hidden_size):
            raise ValueError(
                f"projection weight must be {(config.dim, config.hidden_size)}, got {tuple(projection.weight.shape)}"
            )
        self.config = config
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.projection = projection
        # Centre subtracted from the pooled hidden state before W (zeros = no centring); see
        # :meth:`init_center`. Only towers with a projection have one.
        if projection is not None:
            self.register_buffer("center", torch.zeros(config.hidden_size, dtype=torch.float32))
        else:
            self.center = None
        self._ids: dict[str, str] | None = None  # {"fingerprint", "space_id"}, computed once
        self._compat_explicit: str | None = None
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self.pad_id = int(pad)
        self._prefix = special_prefix(tokenizer)

    # ------------------------------------------------------------------ properties
    @property
    def kind(self) -> str:
        return self.config.kind

    @property
    def pooling_mode(self) -> PoolingMode:
        """The pooling table's entry for ``config.pooling``."""
        return pooling_mode(self.config.pooling)

    @property
    def out_dim(self) -> int:
        """Output size: ``dim`` with a projection, else the hidden size."""
        return self.config.out_dim

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def non_embedding_params(self) -> int:
        """Non-embedding parameters of backbone + projection (scaling-law N)."""
        return count_non_embedding_params(self)

    # ------------------------------------------------------------------ identity
    def _compute_ids(self) -> dict[str, str]:
        tok = tokenizer_digest(self.tokenizer)
        w = weights_digest(self)
        cfg = self.config
        fp = _sha({"format": FORMAT, "config": cfg.identity(), "tokenizer": tok, "weights": w})
        family = self.pooling_mode.family(cfg.kind)
        space = _sha({"kind": cfg.kind, "out_dim": cfg.out_dim, "family": family, "tokenizer": tok, "weights": w})
        return {"fingerprint": fp, "space_id": space}

    def refresh_fingerprint(self) -> str:
        """Recompute the fingerprint from the current weights (call after training)."""
        self._ids = self._compute_ids()
        return self._ids["fingerprint"]

    @property
    def fingerprint(self) -> str:
        """Stable hash of config + tokenizer + weights (computed once, stored when saved)."""
        if self._ids is None:
            self._ids = self._compute_ids()
        return self._ids["fingerprint"]

    @property
    def space_id(self) -> str:
        """Hash of weights + tokenizer + kind + output dim + pooling family (rule 1 of the compat rule)."""
        if self._ids is None:
            self._ids = self._compute_ids()
        return self._ids["space_id"]

    @property
    def compat_id(self) -> str:
        """Identifier of the embedding space (see the module docstring for the rule)."""
        return self._compat_explicit if self._compat_explicit is not None else self.space_id

    @compat_id.setter
    def compat_id(self, value: str | None) -> None:
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError("compat_id must be a non-empty string or None")
        self._compat_explicit = value

    @property
    def compat_source(self) -> str:
        return "explicit" if self._compat_explicit is not None else "weights"

    # ------------------------------------------------------------------ tensors
    def _pad(
        self, seqs: list[list[int]], padding_side: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        side = padding_side or self.config.padding_side
        if self.kind == "bert" and side != "right":
            raise ConfigError(None, None, "padding_side", "BERT towers pad on the right")
        n = len(seqs)
        length = max((len(s) for s in seqs), default=0)
        ids = torch.full((n, length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, length), dtype=torch.long)
        offsets = []
        for i, s in enumerate(seqs):
            off = length - len(s) if side == "left" else 0
            ids[i, off : off + len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, off : off + len(s)] = 1
            offsets.append(off)
        return ids, mask, offsets

    def _batch(self, seqs: list[list[int]], padding_side: str | None = None) -> tuple[Any, list[int]]:
        from transformers import BatchEncoding

        ids, mask, offsets = self._pad(seqs, padding_side)
        data: dict[str, torch.Tensor] = {"input_ids": ids, "attention_mask": mask}
        if self.kind == "llm":
            # positions count real tokens only, so left padding gives the same results as right padding
            data["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
        return BatchEncoding(data), offsets

    def hidden_states(self, batch: Any) -> torch.Tensor:
        """Last hidden states ``[B, L, H]`` of the backbone for a tokenized batch."""
        return self.run_layers(batch)

    def run_layers(
        self, batch: Any, backbone: nn.Module | None = None, inputs_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Last hidden states of ``backbone`` (default: the whole backbone; a
        :func:`~scalingnote.models.prefix.sub_backbone` view runs only some layers) for a tokenized
        batch; ``inputs_embeds`` replaces the token ids (the state entering the view's first layer)."""
        dev = self.device
        kw: dict[str, Any] = {"attention_mask": batch["attention_mask"].to(dev)}
        if inputs_embeds is None:
            kw["input_ids"] = batch["input_ids"].to(dev)
        else:
            kw["inputs_embeds"] = inputs_embeds.to(dev)
        if self.kind == "llm":
            pos = batch.get("position_ids") if hasattr(batch, "get") else None
            if pos is None:
                pos = (kw["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            kw["position_ids"] = pos.to(dev)
            kw["use_cache"] = False
        out = (backbone if backbone is not None else self.backbone)(**kw)
        return out.last_hidden_state

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Apply ``W`` (Eq. 3-4 / Eq. 14) to the centred pooled state ``h - c`` if the tower has a
        projection (``c`` = 0 unless :meth:`init_center` was called)."""
        if self.projection is None:
            return h
        dt = self.projection.weight.dtype
        assert self.center is not None  # a tower with a projection has a centre
        return self.projection(h.to(dt) - self.center.to(dt))

    def set_projection(self, init: str, weight: torch.Tensor | None = None) -> None:
        """Record a fitted start of ``W`` (``config.projection_init = init``; changes the
        fingerprint), copying ``weight`` [dim, hidden] into it when given."""
        if self.projection is None:
            raise ValueError("only a tower with a projection has a W to set")
        if weight is not None:
            with torch.no_grad():
                self.projection.weight.copy_(weight.to(self.projection.weight.device, self.projection.weight.dtype))
        self.config = dataclasses.replace(self.config, projection_init=init)
        self._ids = None

    def set_center(self, center: torch.Tensor) -> None:
        """Set the centre ``c`` (a fixed, saved buffer; changes the fingerprint)."""
        if self.projection is None:
            raise ValueError("only a tower with a projection can be centred")
        assert self.center is not None  # a tower with a projection has a centre
        with torch.no_grad():
            self.center.copy_(center.to(self.center.device, torch.float32).reshape(-1))
        self._ids = None

    def _bert_ids(self, texts: list[str], max_length: int) -> list[list[int]]:
        enc = self.tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)["input_ids"]
        cls_id = self.tokenizer.cls_token_id
        out = []
        for e in enc:
            e = list(e)
            if self.pooling_mode.reads == "first" and cls_id is not None and (not e or e[0] != cls_id):
                e = ([cls_id] + e)[:max_length]  # §3.3: [CLS] inserted before the text
            out.append(e)
        return out

    # ------------------------------------------------------------------ encoding loop
    def _run(
        self,
        seqs: list[list[int]],
        make_batch,
        pooled_fn,
        *,
        batch_size: int,
        dim: int | None,
        normalize: bool,
        show_progress: bool,
        desc: str,
        views: tuple[str, ...] | None,
    ) -> Any:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        d = self.out_dim if dim is None else int(dim)
        if not 1 <= d <= self.out_dim:
            raise ValueError(f"dim must be in 1..{self.out_dim}, got {dim}")
        n = len(seqs)
        keys = views if views is not None else ("_",)
        outs = {k: np.zeros((n, d), dtype=np.float32) for k in keys}
        # longest first: a memory problem shows up in the first batch, and padding is minimal
        order = sorted(range(n), key=lambda i: (-len(seqs[i]), i))
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad(), tqdm(total=n, desc=desc, unit="text", disable=not show_progress) as bar:
                for start in range(0, n, batch_size):
                    idx = order[start : start + batch_size]
                    batch = make_batch(idx)
                    res = pooled_fn(batch)
                    if not isinstance(res, dict):
                        res = {"_": res}
                    for k in keys:
                        v = res[k][:, :d].float()  # Matryoshka prefix, then normalise (§3.2)
                        if normalize:
                            v = torch.nn.functional.normalize(v, dim=-1)
                        outs[k][idx] = v.cpu().numpy()
                    bar.update(len(idx))
        finally:
            self.train(was_training)
        return outs if views is not None else outs["_"]

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike, whole: bool = False) -> Path:
        """Write ``tower.json`` + ``projection.safetensors`` + what the tower trained over its base
        (:mod:`~scalingnote.models.towers.store`: ``trained.safetensors``, ``tokenizer/`` when it
        differs; the base named by package or path and fingerprint), or with ``whole`` (or a base
        that cannot be rebuilt) the whole ``backbone/`` (safetensors + tokenizer).

        The directory is written under a temporary name and renamed into place. An
        existing directory is replaced only if it is itself a saved tower.
        """
        from safetensors.torch import save_file

        path = Path(path)
        if path.exists() and (not path.is_dir() or (any(path.iterdir()) and not (path / TOWER_FILE).is_file())):
            raise ConfigError(path, None, None, "exists and is not a saved tower directory; refusing to overwrite it")
        self.refresh_fingerprint()
        meta = run_metadata()
        parts = None if whole else trained_parts(self)
        doc = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "config": dataclasses.asdict(self.config),
            "fingerprint": self.fingerprint,
            "space_id": self.space_id,
            "compat_id": self.compat_id,
            "compat_source": self.compat_source,
            "non_embedding_params": self.non_embedding_params,
            "storage": STORAGE_FULL if parts is None else STORAGE_BASE,
            **({} if parts is None else {"base": parts[0], "trained_tensors": sorted(parts[1])}),
            "versions": meta["versions"],
            "created": meta["created"],
        }
        with atomic_dir(path, replace=True) as tmp, quiet_transformers():
            if parts is None:
                backbone: Any = self.backbone  # a transformers PreTrainedModel
                backbone.save_pretrained(tmp / "backbone")
                self.tokenizer.save_pretrained(tmp / "backbone")
            else:
                if parts[1]:
                    save_file(parts[1], str(tmp / TRAINED_FILE))
                if parts[2]:
                    self.tokenizer.save_pretrained(tmp / "tokenizer")
            if self.projection is not None:
                assert self.center is not None  # a tower with a projection has a centre
                save_file(
                    {
                        "weight": self.projection.weight.detach().cpu().contiguous(),
                        "center": self.center.detach().cpu().contiguous(),
                    },
                    str(tmp / "projection.safetensors"),
                )
            (tmp / TOWER_FILE).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return path

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"kind={c.kind}, role={c.role}, base={c.base_model!r}, layers={c.num_layers}, out_dim={c.out_dim}, "
            f"pooling={c.pooling}"
        )
