"""Query and document towers (ScalingNote §3.2 Eq. 1-4, §3.3 Eq. 13-14).

Two tower classes share one base (:class:`Tower`):

* :class:`QueryTower` — ``tokenize_queries(texts) -> BatchEncoding`` and
  ``tower(batch) -> Tensor[B, out_dim]``.
  LLM: query text + EOS, pooled at the last non-padding position (§3.2, Eq. 2, 4).
  BERT: ``[CLS]`` first, pooled at ``[CLS]`` (§3.3, Eq. 13-14) or mean pooling.
* :class:`DocumentTower` — ``tokenize_documents(docs) -> BatchEncoding`` and
  ``tower(batch) -> {"title": T, "content": T, "emb": T}`` (each ``[B, out_dim]``).
  LLM: the §3.2 prompt; each view is the hidden state just before its placeholder (Eq. 1, 3).
  BERT (the TwinBERT baseline): ``Document.text`` pooled once; **all three views are the
  same tensor**, so the Stage I loss over views works unchanged.

Both end in an optional projection ``W`` (hidden -> ``dim``, no bias) whose prefixes
are the Matryoshka dims (Eq. 3-4: ``d = W h``, truncated to ``m``). ``dim=None`` means
no projection (identity, output = hidden size): the right choice for zero-shot use,
where a random projection would destroy quality. A trainable ``W`` is initialised as a
random orthogonal projection (rows orthonormal, from a seeded generator) scaled by
``sqrt(hidden/dim)``, which preserves norms in expectation (a Johnson-Lindenstrauss
style projection that is better conditioned than an i.i.d. Gaussian one).

Identity and compatibility
--------------------------
``fingerprint``: SHA-256 (32 hex) over the output-affecting config (everything except the
base model's path and the padding side), a tokenizer digest and all weights (as fp32).
It is computed once (before any cast to a lower precision) and stored in the saved
``tower.json``; :meth:`Tower.refresh_fingerprint` recomputes it after training
(:meth:`Tower.save` always does).

``compat_id``: the embedding space a tower's vectors live in. An index stores its
document tower's ``compat_id`` and refuses a query tower with a different one
(:func:`check_compatible`). The rule:

1. A tower built from a base model (zero-shot, untrained) gets the *space id*: a hash of
   its weights, tokenizer, kind, output dim and pooling family. A query and a document
   tower built from the same base with the same ``num_layers``/``dim``/``projection_seed``
   (and, for BERT, the same pooling) therefore share it: symmetric zero-shot towers are
   compatible, towers from different models are not.
2. Towers trained together are tied by :func:`pair_towers`: both get the document
   tower's (refreshed) fingerprint as their ``compat_id``.
3. A distilled student inherits its teacher's: ``student.compat_id = teacher.compat_id``.

An explicitly set ``compat_id`` is saved and reloaded as is; a derived one (rule 1) is
re-derived after :meth:`Tower.refresh_fingerprint`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from scalingnote.data import Document, Query
from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.models._fs import atomic_dir
from scalingnote.models.loading import (
    TOWER_FILE,
    Backbone,
    count_non_embedding_params,
    default_device,
    load_backbone,
    load_hf_backbone,
    parse_dtype,
    quiet_transformers,
    resolve_source,
)
from scalingnote.models.prompt import (
    DEFAULT_FIELD_CAPS,
    PAPER_DOCUMENT_PROMPT,
    SPECIAL_TOKENS,
    VIEWS,
    DocumentPrompt,
    EncodedDocument,
    special_prefix,
)

log = logging.getLogger("scalingnote.models")

#: Default projection size and Matryoshka prefixes (ScalingNote §3.2, "MRL"; §4 uses dim=128).
DEFAULT_DIM = 128
DEFAULT_MATRYOSHKA_DIMS = (16, 32, 64, 128)
DEFAULT_MAX_QUERY_LENGTH = 128
DEFAULT_MAX_DOC_LENGTH = {"llm": 512, "bert": 256}

FORMAT = "scalingnote-tower"
FORMAT_VERSION = 1
ROLES = ("query", "document")
POOLINGS = {
    ("llm", "query"): ("last", "mean"),
    ("llm", "document"): ("prompt", "mean"),
    ("bert", "query"): ("cls", "mean"),
    ("bert", "document"): ("cls", "mean"),
}


def matryoshka_dims_for(dim: int, low: int = 16) -> list[int]:
    """{dim_low, 2 dim_low, ..., dim/2, dim} (§3.2); just ``[dim]`` when dim < 2*low."""
    dims = [dim]
    while dims[-1] % 2 == 0 and dims[-1] // 2 >= low:
        dims.append(dims[-1] // 2)
    return sorted(dims)


@dataclass
class TowerConfig:
    """Everything needed to rebuild a tower from its saved weights (stored in ``tower.json``)."""

    kind: str  #: "llm" (decoder-only) or "bert" (bidirectional encoder)
    role: str  #: "query" or "document"
    base_model: str  #: packaged name or path the backbone came from (informational)
    hidden_size: int
    num_layers: int  #: transformer layers actually used
    base_num_layers: int  #: layers of the base checkpoint (before truncation)
    dim: int | None  #: projection size; None = no projection (output = hidden size)
    matryoshka_dims: list[int]
    #: "last" (LLM query, §3.2) / "prompt" (LLM document, §3.2) / "mean" (LLM, not in the
    #: paper: see :func:`_segment_means`); "cls" or "mean" (BERT)
    pooling: str
    max_query_length: int = DEFAULT_MAX_QUERY_LENGTH
    max_doc_length: int = 512
    doc_prompt: str | None = None  #: LLM document towers: the §3.2 template
    field_caps: dict[str, int | None] | None = None  #: LLM document towers: per-field token caps
    special_tokens: list[str] = field(default_factory=list)  #: tokens added to the base tokenizer
    projection_init: str | None = None  #: "orthogonal" when dim is set
    projection_seed: int = 0
    padding_side: str = "right"  #: "right" or "left" (LLM only; results do not depend on it)

    def __post_init__(self) -> None:
        if self.kind not in ("llm", "bert"):
            raise ValueError(f"kind must be 'llm' or 'bert', got {self.kind!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be 'query' or 'document', got {self.role!r}")
        allowed = POOLINGS[(self.kind, self.role)]
        if self.pooling not in allowed:
            raise ValueError(f"pooling for a {self.kind} {self.role} tower must be one of {allowed}, got {self.pooling!r}")
        if self.dim is not None and not 1 <= self.dim <= self.hidden_size:
            raise ValueError(f"dim must be in 1..hidden_size ({self.hidden_size}) or null, got {self.dim}")
        out = self.out_dim
        md = list(self.matryoshka_dims)
        if not md or md != sorted(set(md)) or md[-1] != out or md[0] < 1:
            raise ValueError(f"matryoshka_dims must be ascending, unique and end with the output dim {out}, got {md}")
        if self.max_query_length < 2 or self.max_doc_length < 2:
            raise ValueError("max_query_length and max_doc_length must be >= 2")
        if self.padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {self.padding_side!r}")
        if self.kind == "bert" and self.padding_side != "right":
            raise ValueError("BERT towers pad on the right (absolute positions start at 0)")
        if self.kind == "llm" and self.role == "document" and not self.doc_prompt:
            raise ValueError("an LLM document tower needs doc_prompt")

    @property
    def out_dim(self) -> int:
        return self.dim if self.dim is not None else self.hidden_size

    def identity(self) -> dict[str, Any]:
        """The fields that determine the tower's outputs (hashed into the fingerprint)."""
        d = dataclasses.asdict(self)
        for k in ("base_model", "padding_side"):
            d.pop(k)
        return d


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


def orthogonal_projection(hidden: int, dim: int, seed: int) -> torch.Tensor:
    """``W`` (dim x hidden) with orthonormal rows times ``sqrt(hidden/dim)`` from a seeded generator.

    Norm-preserving in expectation: for ``x`` uniform on a sphere, E||Wx||^2 = ||x||^2.
    """
    g = torch.Generator().manual_seed(int(seed))
    a = torch.randn(hidden, dim, generator=g, dtype=torch.float64)
    q, r = torch.linalg.qr(a)  # q: hidden x dim, orthonormal columns
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)  # make the factorisation unique
    return (q.T * math.sqrt(hidden / dim)).to(torch.float32).contiguous()


def _segment_means(h: torch.Tensor, mask: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Mean of the hidden states of consecutive segments of each sequence.

    ``ends [B, S]`` are inclusive, ascending end positions: segment ``s`` covers the real
    (``mask`` = 1) tokens in ``(ends[:, s-1], ends[:, s]]``, the first one starts at the first
    real token. Returns ``[B, S, H]``.

    This is the ``"mean"`` pooling of LLM towers, **not the paper's** placeholder pooling
    (§3.2 reads one hidden state before each placeholder). A truncated, untrained decoder's
    last-token states are nearly identical across texts (zero-shot SmolLM2 at 1-16 layers: see
    ``benchmarks/results/llm_pooling_scifact.json``), and mean pooling over a causal decoder is
    the usual remedy (SGPT, Muennighoff 2022).
    """
    m = mask.to(h.dtype).unsqueeze(-1)
    csum = torch.cumsum(h * m, dim=1)  # [B, L, H]
    ccount = torch.cumsum(m, dim=1)  # [B, L, 1]
    idx = ends.long()
    sums = csum.gather(1, idx.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
    counts = ccount.gather(1, idx.unsqueeze(-1))
    prev_sums = torch.cat([torch.zeros_like(sums[:, :1]), sums[:, :-1]], dim=1)
    prev_counts = torch.cat([torch.zeros_like(counts[:, :1]), counts[:, :-1]], dim=1)
    return (sums - prev_sums) / (counts - prev_counts).clamp(min=1)


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

    def __init__(self, config: TowerConfig, backbone: nn.Module, tokenizer: Any, projection: nn.Linear | None = None):
        super().__init__()
        if config.role != self.role:
            raise ValueError(f"{type(self).__name__} needs role={self.role!r}, config has {config.role!r}")
        if (projection is None) != (config.dim is None):
            raise ValueError("projection must be given exactly when config.dim is set")
        if projection is not None and tuple(projection.weight.shape) != (config.dim, config.hidden_size):
            raise ValueError(f"projection weight must be {(config.dim, config.hidden_size)}, got {tuple(projection.weight.shape)}")
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
        if cfg.kind == "llm":
            family = "llm-mean" if cfg.pooling == "mean" else "llm"
        else:
            family = cfg.pooling
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
    def _pad(self, seqs: list[list[int]], padding_side: str | None = None) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
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

    def run_layers(self, batch: Any, backbone: nn.Module | None = None, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
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
        return self.projection(h.to(dt) - self.center.to(dt))

    def set_center(self, center: torch.Tensor) -> None:
        """Set the centre ``c`` (a fixed, saved buffer; changes the fingerprint)."""
        if self.projection is None:
            raise ValueError("only a tower with a projection can be centred")
        with torch.no_grad():
            self.center.copy_(center.to(self.center.device, torch.float32).reshape(-1))
        self._ids = None

    def _pool_bert(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.config.pooling == "cls":
            return h[:, 0]  # [CLS] is the first token (right padding), §3.3 Eq. 13-14
        m = mask.to(h.dtype).unsqueeze(-1)
        return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)  # sentence-transformers mean pooling

    def _bert_ids(self, texts: list[str], max_length: int) -> list[list[int]]:
        enc = self.tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)["input_ids"]
        cls_id = self.tokenizer.cls_token_id
        out = []
        for e in enc:
            e = list(e)
            if self.config.pooling == "cls" and cls_id is not None and (not e or e[0] != cls_id):
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
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``tower.json`` + ``backbone/`` (safetensors + tokenizer) + ``projection.safetensors``.

        The directory is written under a temporary name and renamed into place. An
        existing directory is replaced only if it is itself a saved tower.
        """
        from safetensors.torch import save_file

        from scalingnote.utils import run_metadata

        path = Path(path)
        if path.exists() and (not path.is_dir() or (any(path.iterdir()) and not (path / TOWER_FILE).is_file())):
            raise ConfigError(path, None, None, "exists and is not a saved tower directory; refusing to overwrite it")
        self.refresh_fingerprint()
        meta = run_metadata()
        doc = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "config": dataclasses.asdict(self.config),
            "fingerprint": self.fingerprint,
            "space_id": self.space_id,
            "compat_id": self.compat_id,
            "compat_source": self.compat_source,
            "non_embedding_params": self.non_embedding_params,
            "versions": meta["versions"],
            "created": meta["created"],
        }
        with atomic_dir(path, replace=True) as tmp, quiet_transformers():
            self.backbone.save_pretrained(tmp / "backbone")
            self.tokenizer.save_pretrained(tmp / "backbone")
            if self.projection is not None:
                save_file(
                    {"weight": self.projection.weight.detach().cpu().contiguous(), "center": self.center.detach().cpu().contiguous()},
                    str(tmp / "projection.safetensors"),
                )
            (tmp / TOWER_FILE).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return path

    def extra_repr(self) -> str:
        c = self.config
        return f"kind={c.kind}, role={c.role}, base={c.base_model!r}, layers={c.num_layers}, out_dim={c.out_dim}, pooling={c.pooling}"


class QueryTower(Tower):
    """Query encoder: ``tower(tower.tokenize_queries(texts)) -> Tensor[B, out_dim]``."""

    role = "query"

    def __init__(self, config: TowerConfig, backbone: nn.Module, tokenizer: Any, projection: nn.Linear | None = None):
        super().__init__(config, backbone, tokenizer, projection)
        if self.kind == "llm" and tokenizer.eos_token_id is None:
            raise ConfigError(None, None, "tokenizer", "an LLM query tower needs an EOS token (§3.2 appends [EOS])")

    def query_ids(self, texts: list[str], max_length: int | None = None) -> list[list[int]]:
        """Unpadded token ids per query (LLM: text + EOS; BERT: [CLS] text [SEP]), at most ``max_length``."""
        texts = _as_texts(texts, "texts")
        length = int(max_length or self.config.max_query_length)
        if not texts:
            return []
        if self.kind == "llm":
            eos = int(self.tokenizer.eos_token_id)
            enc = self.tokenizer(texts, add_special_tokens=True)["input_ids"]
            return [list(e)[: length - 1] + [eos] for e in enc]  # §3.2: [EOS] appended after the query
        return self._bert_ids(texts, length)

    def tokenize_queries(self, texts: list[str], max_length: int | None = None, padding_side: str | None = None) -> Any:
        """A padded ``BatchEncoding`` (CPU tensors) ready for :meth:`forward`."""
        batch, _ = self._batch(self.query_ids(texts, max_length), padding_side)
        return batch

    def pooled(self, batch: Any) -> torch.Tensor:
        """Pooled hidden states ``[B, hidden]`` before the projection."""
        return self.pool_hidden(self.hidden_states(batch), batch)

    def pool_hidden(self, h: torch.Tensor, batch: Any) -> torch.Tensor:
        """Pool last hidden states ``h [B, L, H]`` of ``batch`` (see :meth:`pooled`)."""
        mask = batch["attention_mask"].to(h.device)
        if self.kind == "llm":
            # last non-padding position, under left or right padding (§3.2, Eq. 2)
            pos = torch.arange(mask.shape[1], device=mask.device)
            last = (mask * pos).argmax(-1)
            if self.config.pooling == "mean":
                return _segment_means(h, mask, last.unsqueeze(1))[:, 0]
            return h[torch.arange(h.shape[0], device=h.device), last]
        return self._pool_bert(h, mask)

    def forward(self, batch: Any) -> torch.Tensor:
        """Projected (not normalised) query embeddings ``[B, out_dim]``, with grad when training."""
        return self.project(self.pooled(batch))

    def encode_queries(
        self,
        texts: list[str],
        *,
        batch_size: int = 64,
        dim: int | None = None,
        normalize: bool = True,
        show_progress: bool = True,
        max_length: int | None = None,
    ) -> np.ndarray:
        """float32 ``[N, dim]`` embeddings (L2-normalised unless ``normalize=False``).

        ``dim`` selects a Matryoshka prefix (default: the full output). Batched by sorted
        length, no grad, eval mode; results do not depend on the batch composition.
        """
        seqs = self.query_ids(texts, max_length)
        return self._run(
            seqs,
            lambda idx: self._batch([seqs[i] for i in idx])[0],
            self.forward,
            batch_size=batch_size,
            dim=dim,
            normalize=normalize,
            show_progress=show_progress,
            desc="encode queries",
            views=None,
        )


class DocumentTower(Tower):
    """Document encoder: ``tower(tower.tokenize_documents(docs)) -> {"title", "content", "emb"}``.

    For a BERT document tower the three views are the same tensor (one pooled vector of
    ``Document.text``).
    """

    role = "document"

    def __init__(self, config: TowerConfig, backbone: nn.Module, tokenizer: Any, projection: nn.Linear | None = None):
        super().__init__(config, backbone, tokenizer, projection)
        self.prompt: DocumentPrompt | None = None
        if self.kind == "llm":
            self.prompt = DocumentPrompt(tokenizer, config.doc_prompt or PAPER_DOCUMENT_PROMPT, config.field_caps)

    def document_encodings(self, docs: list[Document], max_length: int | None = None) -> list[EncodedDocument]:
        """Unpadded ids (and, for LLMs, positions before each placeholder) per document."""
        docs = _as_docs(docs)
        length = int(max_length or self.config.max_doc_length)
        if self.prompt is not None:
            return self.prompt.encode(docs, length)
        ids = self._bert_ids([d.text for d in docs], length) if docs else []
        return [EncodedDocument(e, (0, 0, 0), {}, False) for e in ids]

    def collate_documents(self, encs: list[EncodedDocument], padding_side: str | None = None) -> Any:
        """Pad encodings into a ``BatchEncoding``; LLM batches carry ``view_positions [B, 3]``."""
        batch, offsets = self._batch([e.input_ids for e in encs], padding_side)
        if self.kind == "llm":
            vp = torch.tensor([e.view_positions for e in encs], dtype=torch.long).reshape(len(encs), 3)
            batch["view_positions"] = vp + torch.tensor(offsets, dtype=torch.long).unsqueeze(1)
        return batch

    def tokenize_documents(self, docs: list[Document], max_length: int | None = None, padding_side: str | None = None) -> Any:
        """A padded ``BatchEncoding`` (CPU tensors) ready for :meth:`forward`."""
        return self.collate_documents(self.document_encodings(docs, max_length), padding_side)

    def pooled(self, batch: Any) -> torch.Tensor:
        """Pooled hidden states before the projection: ``[B, 3, hidden]`` (title, content, emb
        positions) for an LLM tower, ``[B, hidden]`` for a BERT tower."""
        return self.pool_hidden(self.hidden_states(batch), batch)

    def pool_hidden(self, h: torch.Tensor, batch: Any) -> torch.Tensor:
        """Pool last hidden states ``h [B, L, H]`` of ``batch`` (see :meth:`pooled`)."""
        if self.kind == "llm":
            if self.prompt.absent_views:  # a prompt preset without some views (issue #21): see DocumentPrompt.pool
                return self.prompt.pool(h, batch, self.config.pooling)
            vp = batch["view_positions"].to(h.device)
            ids = batch["input_ids"].to(h.device)
            expected = torch.tensor([self.prompt.placeholder_ids[v] for v in VIEWS], device=h.device)
            if not bool((ids.gather(1, vp + 1) == expected).all()):
                raise RuntimeError("view_positions do not point just before the placeholders: batch was not built by this tower")
            if self.config.pooling == "mean":
                mask = batch["attention_mask"].to(h.device)
                segs = _segment_means(h, mask, vp[:, :2])  # title: ..vp_t, content: vp_t+1..vp_c
                emb = _segment_means(h, mask, vp[:, 2:])  # emb: the whole prompt up to vp_e
                return torch.cat([segs, emb], dim=1)
            rows = torch.arange(h.shape[0], device=h.device).unsqueeze(1)
            return h[rows, vp]  # §3.2 Eq. 1: the state just before each placeholder
        mask = batch["attention_mask"].to(h.device)
        return self._pool_bert(h, mask)

    def forward(self, batch: Any) -> dict[str, torch.Tensor]:
        """Projected (not normalised) views ``{"title", "content", "emb"}``, each ``[B, out_dim]``."""
        p = self.project(self.pooled(batch))  # Eq. 3
        if self.kind == "llm":
            return {v: p[:, i] for i, v in enumerate(VIEWS)}
        return {v: p for v in VIEWS}

    def _encode_views(self, docs, views, batch_size, dim, normalize, show_progress, max_length):
        encs = self.document_encodings(docs, max_length)
        return self._run(
            [e.input_ids for e in encs],
            lambda idx: self.collate_documents([encs[i] for i in idx]),
            self.forward,
            batch_size=batch_size,
            dim=dim,
            normalize=normalize,
            show_progress=show_progress,
            desc="encode documents",
            views=views,
        )

    def encode_documents(
        self,
        docs: list[Document],
        *,
        view: str = "emb",
        batch_size: int = 16,
        dim: int | None = None,
        normalize: bool = True,
        show_progress: bool = True,
        max_length: int | None = None,
    ) -> np.ndarray:
        """float32 ``[N, dim]`` embeddings of one view (default the final ``[EMB]`` view)."""
        if view not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
        return self._encode_views(docs, (view,), batch_size, dim, normalize, show_progress, max_length)[view]

    def encode_document_views(
        self,
        docs: list[Document],
        *,
        batch_size: int = 16,
        dim: int | None = None,
        normalize: bool = True,
        show_progress: bool = True,
        max_length: int | None = None,
    ) -> dict[str, np.ndarray]:
        """All three views ``{"title", "content", "emb"}`` as float32 ``[N, dim]`` arrays."""
        return self._encode_views(docs, VIEWS, batch_size, dim, normalize, show_progress, max_length)


TOWER_CLASSES: dict[str, type[Tower]] = {"query": QueryTower, "document": DocumentTower}


# ====================================================================== construction


def _add_placeholder_tokens(model: nn.Module, tokenizer: Any) -> list[str]:
    """Add [TITLE_QUERY], [CONTENT_QUERY], [EMB] as special tokens; new embedding rows = mean of old rows.

    The mean (not HF's random ``mean_resizing`` sample) keeps construction deterministic,
    so query and document towers built separately from one base get identical weights.
    """
    vocab = tokenizer.get_vocab()
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        tokenizer.add_special_tokens({"extra_special_tokens": missing}, replace_extra_special_tokens=False)
    emb = model.get_input_embeddings()
    old = emb.weight.shape[0]
    needed = max(len(tokenizer), max(int(tokenizer.convert_tokens_to_ids(t)) for t in SPECIAL_TOKENS) + 1)
    if needed > old:
        with torch.no_grad():
            mean = emb.weight[:old].float().mean(0)
        model.resize_token_embeddings(needed, mean_resizing=False)
        with torch.no_grad():
            w = model.get_input_embeddings().weight
            w[old:] = mean.to(w.dtype)
    return list(SPECIAL_TOKENS)


def build_tower(
    backbone: Backbone,
    role: str = "query",
    *,
    dim: int | None = None,
    matryoshka_dims: list[int] | tuple[int, ...] | None = None,
    pooling: str | None = None,
    max_query_length: int | None = None,
    max_doc_length: int | None = None,
    doc_prompt: str | None = None,
    field_caps: dict[str, int | None] | None = None,
    projection_seed: int = 0,
    padding_side: str = "right",
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> QueryTower | DocumentTower:
    """Wrap a loaded :class:`Backbone` into a tower (takes ownership of it: the model and
    tokenizer are modified in place — LLM placeholders are added).

    ``pooling=None`` picks: LLM query "last", LLM document "prompt"; BERT: the pooling a
    sentence-transformers directory declares (``1_Pooling``; all-MiniLM-L6-v2: "mean"),
    else "cls" as in the paper (§3.3).
    """
    if role not in ROLES:
        raise ConfigError(None, None, "role", f"must be 'query' or 'document', got {role!r}")
    model, tok, kind = backbone.model, backbone.tokenizer, backbone.kind
    special: list[str] = []
    if kind == "llm":
        if tok.eos_token_id is None:
            raise ConfigError(backbone.hf_dir, None, "eos_token", "an LLM tower needs a tokenizer with an EOS token")
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        # added to every LLM tower (query ones too) so both towers of a pair share one vocabulary
        special = _add_placeholder_tokens(model, tok)
        default_pool = "last" if role == "query" else "prompt"
    else:
        if tok.pad_token_id is None:
            raise ConfigError(backbone.hf_dir, None, "pad_token", "a BERT tower needs a tokenizer with a pad token")
        default_pool = backbone.native_pooling if backbone.native_pooling in ("cls", "mean") else "cls"
    pool = pooling or default_pool
    hidden = int(model.config.hidden_size)
    out = dim if dim is not None else hidden
    if matryoshka_dims is None:
        md = matryoshka_dims_for(out) if dim is not None else [out]
    else:
        md = sorted({int(m) for m in matryoshka_dims})
    doc_len = max_doc_length or DEFAULT_MAX_DOC_LENGTH[kind]
    is_llm_doc = kind == "llm" and role == "document"
    try:
        cfg = TowerConfig(
            kind=kind,
            role=role,
            base_model=backbone.source.name,
            hidden_size=hidden,
            num_layers=int(model.config.num_hidden_layers),
            base_num_layers=backbone.base_num_layers,
            dim=dim,
            matryoshka_dims=md,
            pooling=pool,
            max_query_length=max_query_length or DEFAULT_MAX_QUERY_LENGTH,
            max_doc_length=doc_len,
            doc_prompt=(doc_prompt or PAPER_DOCUMENT_PROMPT) if is_llm_doc else None,
            field_caps=dict(field_caps if field_caps is not None else DEFAULT_FIELD_CAPS) if is_llm_doc else None,
            special_tokens=special,
            projection_init="orthogonal" if dim is not None else None,
            projection_seed=int(projection_seed),
            padding_side=padding_side,
        )
    except ValueError as e:
        raise ConfigError(None, None, "tower", str(e)) from None
    projection = None
    if dim is not None:
        projection = nn.Linear(hidden, dim, bias=False)
        with torch.no_grad():
            projection.weight.copy_(orthogonal_projection(hidden, dim, projection_seed))
    tower = TOWER_CLASSES[role](cfg, model, tok, projection)
    tower.eval()
    dev = torch.device(device) if device is not None else default_device()
    dt = parse_dtype(dtype, dev)
    if dt != torch.float32:
        tower.refresh_fingerprint()  # identity is defined on the fp32 weights, before the cast
    return tower.to(device=dev, dtype=dt)


def _read_tower_json(path: Path) -> dict[str, Any]:
    f = path / TOWER_FILE
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f, None, None, f"cannot read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f, e.lineno, None, f"invalid JSON: {e.msg}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f, None, "format", f"not a {FORMAT} file")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ConfigError(f, None, "format_version", f"unsupported version {doc.get('format_version')!r} (expected {FORMAT_VERSION})")
    for key in ("config", "fingerprint", "space_id", "compat_id", "compat_source"):
        if key not in doc:
            raise ConfigError(f, None, key, "missing")
    return doc


def load_saved_tower(
    path: str | os.PathLike,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    verify: bool = False,
    padding_side: str | None = None,
) -> QueryTower | DocumentTower:
    """Load a directory written by :meth:`Tower.save` (exact round trip).

    The stored fingerprint is trusted; ``verify=True`` recomputes it from the loaded
    weights and raises if they differ (a modified or corrupted directory).
    """
    from safetensors.torch import load_file

    from scalingnote.config import load_config

    path = Path(path)
    doc = _read_tower_json(path)
    cfg_dict = dict(doc["config"])
    if padding_side is not None:
        cfg_dict["padding_side"] = padding_side
    try:
        cfg = load_config(TowerConfig, cfg_dict)
    except ConfigError as e:
        raise ConfigError(path / TOWER_FILE, None, f"config.{e.field}" if e.field else "config", e.reason) from None
    bb = load_hf_backbone(path / "backbone", kind=cfg.kind)
    if bb.num_layers != cfg.num_layers or bb.hidden_size != cfg.hidden_size:
        raise ConfigError(path / "backbone" / "config.json", None, "num_hidden_layers", "does not match tower.json")
    projection = None
    if cfg.dim is not None:
        pf = path / "projection.safetensors"
        if not pf.is_file():
            raise ConfigError(pf, None, None, "missing (tower.json says dim is set)")
        tensors = load_file(str(pf))
        w = tensors["weight"].to(torch.float32)
        center = tensors.get("center")
        projection = nn.Linear(cfg.hidden_size, cfg.dim, bias=False)
        if tuple(w.shape) != (cfg.dim, cfg.hidden_size):
            raise ConfigError(pf, None, "weight", f"shape {tuple(w.shape)} != {(cfg.dim, cfg.hidden_size)}")
        with torch.no_grad():
            projection.weight.copy_(w)
    tower = TOWER_CLASSES[cfg.role](cfg, bb.model, bb.tokenizer, projection)
    if projection is not None and center is not None:
        if tuple(center.shape) != (cfg.hidden_size,):
            raise ConfigError(pf, None, "center", f"shape {tuple(center.shape)} != {(cfg.hidden_size,)}")
        with torch.no_grad():
            tower.center.copy_(center.to(torch.float32))
    tower.eval()
    stored = {"fingerprint": doc["fingerprint"], "space_id": doc["space_id"]}
    if verify:
        actual = tower._compute_ids()
        if actual != stored:
            raise ConfigError(path / TOWER_FILE, None, "fingerprint", f"stored {stored['fingerprint']} but the weights give {actual['fingerprint']}")
    tower._ids = stored
    if doc["compat_source"] == "explicit":
        tower._compat_explicit = doc["compat_id"]
    dev = torch.device(device) if device is not None else default_device()
    return tower.to(device=dev, dtype=parse_dtype(dtype, dev))


def load_tower(
    name_or_path: str | os.PathLike,
    role: str | None = None,
    *,
    num_layers: int | None = None,
    dim: int | None = None,
    pooling: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    matryoshka_dims: list[int] | tuple[int, ...] | None = None,
    max_query_length: int | None = None,
    max_doc_length: int | None = None,
    doc_prompt: str | None = None,
    field_caps: dict[str, int | None] | None = None,
    projection_seed: int = 0,
    padding_side: str | None = None,
    verify: bool = False,
) -> QueryTower | DocumentTower:
    """Load a tower from a packaged name (``smollm2-135m``, ``minilm-l6``), an HF directory,
    a ``.gguf`` file (converted once into the cache) or a saved tower directory.

    Base models: ``role`` defaults to "query"; ``dim=None`` means **no projection**
    (zero-shot; output = hidden size) — pass ``dim=DEFAULT_DIM`` (128) for a trainable
    projection; ``num_layers`` keeps the first N layers. Saved towers: the saved settings
    are used; arguments that would change them must be left None or equal the saved value.
    Device: CUDA if available else CPU; dtype: fp32 on CPU, bf16 on GPU.
    """
    src = resolve_source(name_or_path)
    if src.form == "tower":
        doc = _read_tower_json(src.path)
        saved = doc["config"]
        wanted = {
            "role": role,
            "num_layers": num_layers,
            "dim": dim,
            "pooling": pooling,
            "max_query_length": max_query_length,
            "max_doc_length": max_doc_length,
            "doc_prompt": doc_prompt,
            "field_caps": field_caps,
        }
        if matryoshka_dims is not None:
            wanted["matryoshka_dims"] = sorted({int(m) for m in matryoshka_dims})
        for k, v in wanted.items():
            if v is not None and v != saved.get(k):
                raise ConfigError(src.path / TOWER_FILE, None, f"config.{k}", f"saved tower has {saved.get(k)!r}, asked for {v!r}")
        return load_saved_tower(src.path, device=device, dtype=dtype, verify=verify, padding_side=padding_side)
    if src.form == "hf" and (src.path / "modules.json").is_file():  # a sentence-transformers directory (issue 23)
        from scalingnote.models.st_import import load_st_tower

        return load_st_tower(
            src, role or "query", num_layers=num_layers, dim=dim, pooling=pooling, cache_dir=cache_dir, dtype=dtype, device=device,
            matryoshka_dims=matryoshka_dims, max_query_length=max_query_length, max_doc_length=max_doc_length,
            doc_prompt=doc_prompt, field_caps=field_caps, projection_seed=projection_seed, padding_side=padding_side or "right",
        )
    bb = load_backbone(src.path, num_layers=num_layers, cache_dir=cache_dir)
    bb.source = dataclasses.replace(bb.source, name=src.name)
    return build_tower(
        bb,
        role or "query",
        dim=dim,
        matryoshka_dims=matryoshka_dims,
        pooling=pooling,
        max_query_length=max_query_length,
        max_doc_length=max_doc_length,
        doc_prompt=doc_prompt,
        field_caps=field_caps,
        projection_seed=projection_seed,
        padding_side=padding_side or "right",
        device=device,
        dtype=dtype,
    )


def load_tower_pair(
    name_or_path: str | os.PathLike,
    *,
    num_layers: int | None = None,
    dim: int | None = None,
    pooling: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    query_pooling: str | None = None,
    doc_pooling: str | None = None,
    **kwargs: Any,
) -> tuple[QueryTower, DocumentTower]:
    """A query and a document tower initialised from the same base model (loaded once).

    ``pooling`` applies to both towers; ``query_pooling`` / ``doc_pooling`` override it per tower.

    Stage I (§3.2) starts both towers from one checkpoint; their weights are independent
    copies. Built with the same settings they share a ``compat_id`` (rule 1).
    """
    src = resolve_source(name_or_path)
    if src.form == "tower":
        raise ConfigError(src.path, None, "model", "is a saved tower: load each saved tower with load_tower")
    bb = load_backbone(src.path, num_layers=num_layers, cache_dir=cache_dir)
    bb.source = dataclasses.replace(bb.source, name=src.name)
    bb2 = dataclasses.replace(bb, model=copy.deepcopy(bb.model), tokenizer=copy.deepcopy(bb.tokenizer))
    common = dict(dim=dim, device=device, dtype=dtype, **kwargs)
    q = build_tower(bb, "query", pooling=query_pooling or pooling, **common)
    d = build_tower(bb2, "document", pooling=doc_pooling or pooling, **common)
    return q, d  # type: ignore[return-value]


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
