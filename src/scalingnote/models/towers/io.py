"""Building and loading towers: from a base model (LLM or BERT, local directory or GGUF), from a
saved ``tower.json`` directory, or a query/document pair."""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scalingnote.config import load_config
from scalingnote.errors import ConfigError
from scalingnote.models.layers import is_bottom
from scalingnote.models.loading import (
    TOWER_FILE,
    Backbone,
    ModelSource,
    default_device,
    load_hf_backbone,
    parse_dtype,
    resolve_source,
)
from scalingnote.models.prompt import DEFAULT_FIELD_CAPS, PAPER_DOCUMENT_PROMPT
from scalingnote.models.st_import import MODULES_FILE, check_importable, dense_head, read_st_layout
from scalingnote.models.towers.classes import TOWER_CLASSES, DocumentTower, QueryTower
from scalingnote.models.towers.config import (
    DEFAULT_MAX_DOC_LENGTH,
    DEFAULT_MAX_QUERY_LENGTH,
    FORMAT,
    FORMAT_VERSION,
    ROLES,
    TowerConfig,
    matryoshka_dims_for,
)
from scalingnote.models.towers.pooling import default_pooling, from_st_mode, orthogonal_projection, pooling_modes
from scalingnote.models.towers.store import STORAGE_BASE, load_base, prepare_tokenizer, rebuild_backbone
from scalingnote.utils.io import read_json


def _tower_config(
    backbone: Backbone,
    role: str,
    special: list[str],
    *,
    dim: int | None,
    matryoshka_dims: Any,
    pooling: str | None,
    max_query_length: int | None,
    max_doc_length: int | None,
    doc_prompt: str | None,
    field_caps: dict[str, int | None] | None,
    projection_seed: int,
    padding_side: str,
) -> TowerConfig:
    """The :class:`TowerConfig` of a tower built by :func:`build_tower` (its keywords resolved to
    their defaults); a ``ConfigError`` for settings the config refuses."""
    model, kind = backbone.model, backbone.kind
    # a BERT tower takes the pooling its sentence-transformers directory declares (when the pooling
    # table has it); an LLM tower pools as §3.2 says unless asked
    declared = from_st_mode(backbone.native_pooling, kind) if kind == "bert" else None
    pool = pooling or default_pooling(kind, role, declared)
    hidden = int(model.config.hidden_size)
    out = dim if dim is not None else hidden
    if matryoshka_dims is None:
        md = matryoshka_dims_for(out) if dim is not None else [out]
    else:
        md = sorted({int(m) for m in matryoshka_dims})
    doc_len = max_doc_length or DEFAULT_MAX_DOC_LENGTH[kind]
    is_llm_doc = kind == "llm" and role == "document"
    try:
        return TowerConfig(
            kind=kind,
            role=role,
            base_model=backbone.source.name,
            hidden_size=hidden,
            num_layers=int(model.config.num_hidden_layers),
            base_num_layers=backbone.base_num_layers,
            base_layers=backbone.kept_layers,
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

    ``pooling`` names an entry of the pooling table (:mod:`~scalingnote.models.towers.pooling`) or
    a dotted path to one; ``None`` picks: LLM query "last", LLM document "prompt"; BERT: the pooling
    a sentence-transformers directory declares (``1_Pooling``; all-MiniLM-L6-v2: "mean"), else
    "cls" as in the paper (§3.3).
    """
    if role not in ROLES:
        raise ConfigError(None, None, "role", f"must be 'query' or 'document', got {role!r}")
    special = prepare_tokenizer(backbone)
    cfg = _tower_config(
        backbone,
        role,
        special,
        dim=dim,
        matryoshka_dims=matryoshka_dims,
        pooling=pooling,
        max_query_length=max_query_length,
        max_doc_length=max_doc_length,
        doc_prompt=doc_prompt,
        field_caps=field_caps,
        projection_seed=projection_seed,
        padding_side=padding_side,
    )
    model, tok, hidden = backbone.model, backbone.tokenizer, cfg.hidden_size
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
    doc = read_json(f)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f, None, "format", f"not a {FORMAT} file")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ConfigError(
            f, None, "format_version", f"unsupported version {doc.get('format_version')!r} (expected {FORMAT_VERSION})"
        )
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

    path = Path(path)
    doc = _read_tower_json(path)
    cfg_dict = dict(doc["config"])
    if padding_side is not None:
        cfg_dict["padding_side"] = padding_side
    try:
        cfg = load_config(TowerConfig, cfg_dict)
    except ConfigError as e:
        raise ConfigError(path / TOWER_FILE, None, f"config.{e.field}" if e.field else "config", e.reason) from None
    if doc.get("storage") == STORAGE_BASE:  # the trained parts over a base rebuilt from its package or path
        model, tokenizer = rebuild_backbone(path, doc, cfg)
        n, h, where = int(model.config.num_hidden_layers), int(model.config.hidden_size), path / TOWER_FILE
    else:
        bb = load_hf_backbone(path / "backbone", kind=cfg.kind)
        model, tokenizer, n, h, where = (
            bb.model,
            bb.tokenizer,
            bb.num_layers,
            bb.hidden_size,
            path / "backbone" / "config.json",
        )
    if n != cfg.num_layers or h != cfg.hidden_size:
        raise ConfigError(where, None, "num_hidden_layers", "does not match tower.json")
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
    tower = TOWER_CLASSES[cfg.role](cfg, model, tokenizer, projection)
    if projection is not None and center is not None:
        if tuple(center.shape) != (cfg.hidden_size,):
            raise ConfigError(pf, None, "center", f"shape {tuple(center.shape)} != {(cfg.hidden_size,)}")
        assert tower.center is not None  # a tower with a projection has a centre
        with torch.no_grad():
            tower.center.copy_(center.to(torch.float32))
    tower.eval()
    stored = {"fingerprint": doc["fingerprint"], "space_id": doc["space_id"]}
    if verify:
        actual = tower._compute_ids()
        if actual != stored:
            raise ConfigError(
                path / TOWER_FILE,
                None,
                "fingerprint",
                f"stored {stored['fingerprint']} but the weights give {actual['fingerprint']}",
            )
    tower._ids = stored
    tower.source_path = str(path.resolve())  # where these weights live (recorded in index manifests)
    if doc["compat_source"] == "explicit":
        tower._compat_explicit = doc["compat_id"]
    dev = torch.device(device) if device is not None else default_device()
    return tower.to(device=dev, dtype=parse_dtype(dtype, dev))


def _where(src: ModelSource) -> Path:
    """What :func:`load_backbone` loads ``src`` from (a saved tower's backbone: ``<tower>/backbone``)."""
    return src.path / "backbone" if src.form == "tower_backbone" else src.path


def _named_backbone(
    path: Path, name: str, num_layers: int | None, cache_dir: Any, layers: list[int] | None
) -> Backbone:
    """The backbone in ``path`` (its first ``num_layers`` or its ``layers``), named ``name`` (the
    source a user gave: a packaged name, a directory) in the tower config."""
    bb = load_base(path, num_layers=num_layers, cache_dir=cache_dir, layers=layers)
    bb.source = dataclasses.replace(bb.source, name=name)
    return bb


def _load_st_tower(
    src: ModelSource, role: str, num_layers: int | None, cache_dir: Any, layers: Any = None, **kw: Any
) -> QueryTower | DocumentTower:
    """A tower from a sentence-transformers directory (read by :mod:`scalingnote.models.st_import`):
    its transformer, its pooling (the pooling table's entry with that ``st_mode``) and its ``Dense``
    head as the projection, the bias as the centre. ``kw``: :func:`build_tower`'s keywords."""
    layout = read_st_layout(src.path)
    mf = src.path / MODULES_FILE
    bb = _named_backbone(layout.transformer_dir, src.name, num_layers, cache_dir, layers)
    check_importable(layout, role, bb.kind)
    st_pool = from_st_mode(layout.pooling, bb.kind)
    if layout.pooling is not None and st_pool is None:
        known = sorted({m.st_mode for m in pooling_modes(bb.kind) if m.st_mode})
        raise ConfigError(
            mf,
            None,
            "Pooling",
            f"pooling mode {layout.pooling!r}: a {bb.kind.upper()} tower pools with one of {known} "
            "(register a pooling mode with that st_mode to import it)",
        )
    pooling, dim = kw.pop("pooling"), kw.pop("dim")
    if layout.dense_dir is None:
        # no head: exactly the tower a plain HF directory gives (the declared pooling is the default)
        return build_tower(bb, role, dim=dim, pooling=pooling or st_pool, **kw)
    if pooling is not None and st_pool is not None and pooling != st_pool:
        raise ConfigError(
            mf, None, "Pooling", f"the Dense head was trained on {st_pool!r} pooling; asked for {pooling!r}"
        )
    w, center = dense_head(layout, bb.hidden_size, dim)
    device, dtype = kw.pop("device"), kw.pop("dtype")
    tower = build_tower(bb, role, dim=layout.dense_out, pooling=st_pool, device="cpu", dtype=torch.float32, **kw)
    assert tower.projection is not None  # built with dim=layout.dense_out
    with torch.no_grad():
        tower.projection.weight.copy_(w.to(torch.float32))
    tower.set_center(center.to(torch.float32))
    tower.refresh_fingerprint()  # identity of the fp32 weights, before any cast
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
    layers: list[int] | None = None,
) -> QueryTower | DocumentTower:
    """Load a tower from a packaged name (``smollm2-135m``, ``minilm-l6``), an HF directory,
    a ``.gguf`` file (converted once into the cache) or a saved tower directory.

    Base models: ``role`` defaults to "query"; ``dim=None`` means **no projection**
    (zero-shot; output = hidden size) — pass ``dim=DEFAULT_DIM`` (128) for a trainable
    projection; ``num_layers`` keeps the first N layers, ``layers`` the listed ones
    (:func:`~scalingnote.models.layers.select_layers`). Saved towers: the saved settings
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
            "base_layers": None if is_bottom(layers) else layers,  # bottom = truncation
        }
        if matryoshka_dims is not None:
            wanted["matryoshka_dims"] = sorted({int(m) for m in matryoshka_dims})
        for k, v in wanted.items():
            if v is not None and v != saved.get(k):
                raise ConfigError(
                    src.path / TOWER_FILE, None, f"config.{k}", f"saved tower has {saved.get(k)!r}, asked for {v!r}"
                )
        return load_saved_tower(src.path, device=device, dtype=dtype, verify=verify, padding_side=padding_side)
    # build_tower's keywords
    options: dict[str, Any] = dict(
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
    if src.form == "hf" and (src.path / MODULES_FILE).is_file():  # a sentence-transformers directory
        return _load_st_tower(src, role or "query", num_layers, cache_dir, layers, **options)
    return build_tower(
        _named_backbone(_where(src), src.name, num_layers, cache_dir, layers), role or "query", **options
    )


def load_tower_pair(
    name_or_path: str | os.PathLike,
    *,
    pooling: str | None = None,
    query_pooling: str | None = None,
    doc_pooling: str | None = None,
    dim: int | None = None,
    num_layers: int | None = None,
    layers: list[int] | None = None,
    cache_dir: str | os.PathLike | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
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
    bb = _named_backbone(_where(src), src.name, num_layers, cache_dir, layers)
    bb2 = dataclasses.replace(bb, model=copy.deepcopy(bb.model), tokenizer=copy.deepcopy(bb.tokenizer))
    common = dict(dim=dim, device=device, dtype=dtype, **kwargs)
    q = build_tower(bb, "query", pooling=query_pooling or pooling, **common)
    d = build_tower(bb2, "document", pooling=doc_pooling or pooling, **common)
    return q, d  # type: ignore[return-value]
