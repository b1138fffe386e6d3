"""What a saved tower stores: the parts it trained, not copies of the model it was given.

A tower built from a base model (a packaged name, a Hugging Face directory, a ``.gguf`` file or
another saved tower) and then trained keeps most of that base as it was: heads over frozen
layers change only the projection, a distilled student changes its layers but not its
vocabulary. :meth:`~scalingnote.models.towers.base.Tower.save` therefore writes

* ``tower.json`` with ``"storage": "base+trained"`` and a ``"base"`` entry: the base model's name
  as given, where it was found, and its fingerprint (the SHA-256 of its weight files; a saved
  tower's own fingerprint);
* ``trained.safetensors``: only the backbone tensors that differ from the rebuilt base (none
  for a frozen backbone), and ``tokenizer/`` only when the tokenizer differs from the base's
  (with the placeholder tokens every LLM tower gets);
* ``projection.safetensors`` as before.

Loading rebuilds the base from its package or path, checks its fingerprint (a missing or changed
base is a :class:`~scalingnote.errors.ConfigError` naming the base and both fingerprints) and
applies the stored tensors, so the loaded tower is the one that was saved, bit for bit. A tower
whose base cannot be rebuilt (built in memory, or the base is gone at save time) is saved whole,
``backbone/`` beside ``tower.json`` as before; both layouts load the same way.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from scalingnote.errors import ConfigError
from scalingnote.models.layers import check_layer_list, is_bottom, select_layers
from scalingnote.models.loading import (
    TOWER_FILE,
    Backbone,
    ModelSource,
    file_sha256,
    load_backbone,
    load_hf_backbone,
    resolve_source,
)
from scalingnote.models.prompt import SPECIAL_TOKENS
from scalingnote.models.registry import canonical_name
from scalingnote.models.towers.identity import tokenizer_digest

#: ``tower.json``'s ``storage``: the whole backbone in ``backbone/`` (older towers have no key)
STORAGE_FULL = "full"
#: only the trained tensors, over a base rebuilt from its package or path
STORAGE_BASE = "base+trained"
TRAINED_FILE = "trained.safetensors"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


# ----------------------------------------------------------------------------- tokenizer preparation
def add_placeholder_tokens(model: Any, tokenizer: Any) -> list[str]:
    """Add [TITLE_QUERY], [CONTENT_QUERY], [EMB] as special tokens; new embedding rows = mean of old rows.

    The mean (not HF's random ``mean_resizing`` sample) keeps construction deterministic,
    so query and document towers built separately from one base get identical weights (and a
    base rebuilt at load time gets the rows it had when the tower was saved).
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


def prepare_tokenizer(backbone: Backbone) -> list[str]:
    """Check the tokenizer of a tower's backbone and give it what the tower needs: an LLM gets a pad
    token (its EOS) and the placeholder tokens (added to every LLM tower, query ones too, so both
    towers of a pair share one vocabulary); a BERT tokenizer must have a pad token. Returns the
    special tokens added."""
    tok = backbone.tokenizer
    if backbone.kind == "llm":
        if tok.eos_token_id is None:
            raise ConfigError(backbone.hf_dir, None, "eos_token", "an LLM tower needs a tokenizer with an EOS token")
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        return add_placeholder_tokens(backbone.model, tok)
    if tok.pad_token_id is None:
        raise ConfigError(backbone.hf_dir, None, "pad_token", "a BERT tower needs a tokenizer with a pad token")
    return []


# ----------------------------------------------------------------------------- the base and its fingerprint
def _weight_files(src: ModelSource) -> list[Path]:
    if src.path.is_file():
        return [src.path]
    return sorted(p for p in src.path.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def source_fingerprint(src: ModelSource) -> dict[str, Any]:
    """The base's identity: a saved tower's own fingerprint, else the SHA-256 over its weight files
    (name, size and content of each; memoised per file within a process) and their total size."""
    if src.form == "tower_backbone":
        return {"fingerprint": json.loads((src.path / TOWER_FILE).read_text(encoding="utf-8"))["fingerprint"]}
    files = _weight_files(src)
    if not files:
        raise ConfigError(src.path, None, "model", "holds no weight file (*.safetensors, *.bin, *.gguf)")
    h = hashlib.sha256()
    for f in files:
        h.update(
            f"{f.relative_to(src.path) if src.path.is_dir() else f.name}:{f.stat().st_size}:{file_sha256(f)}\n".encode()
        )
    return {"sha256": h.hexdigest(), "bytes": sum(f.stat().st_size for f in files)}


def _short(fp: dict[str, Any]) -> str:
    return f"sha256 {fp['sha256'][:16]}" if "sha256" in fp else f"tower fingerprint {fp.get('fingerprint', '?')[:16]}"


def base_reference(base_model: str) -> dict[str, Any] | None:
    """``tower.json``'s ``base`` entry for a tower built from ``base_model`` (its config's name):
    the name, whether it is a packaged model, the resolved path and the fingerprint; None when the
    base cannot be found now (the tower is then saved whole)."""
    try:
        src = resolve_source(base_model)
    except ConfigError:
        return None
    if src.form == "tower":  # a whole saved tower is no base (its backbone is: ``<tower>/backbone``)
        return None
    packaged = canonical_name(base_model) is not None and not Path(base_model).expanduser().exists()
    where = src.path / "backbone" if src.form == "tower_backbone" else src.path
    return {"name": base_model, "packaged": packaged, "form": src.form, "path": str(where), **source_fingerprint(src)}


def resolve_base(ref: dict[str, Any], where: Path) -> str:
    """Find a stored base again and check its fingerprint: a packaged base by its name (wherever
    the package is installed), any other by its path. Returns what to load it from."""
    what = f"base model {ref['name']!r} ({_short(ref)})"
    target = ref["name"] if ref.get("packaged") else ref["path"]
    try:
        src = resolve_source(target)
    except ConfigError as e:
        hint = "install its package" if ref.get("packaged") else f"put it back at {ref['path']}"
        raise ConfigError(
            where, None, "base", f"{what} not found ({e.reason}): this tower stores only what it trained; {hint}"
        ) from None
    now = source_fingerprint(src)
    if {k: now.get(k) for k in ("sha256", "fingerprint")} != {k: ref.get(k) for k in ("sha256", "fingerprint")}:
        raise ConfigError(
            where,
            None,
            "base",
            f"{what} has changed: {src.path} now has {_short(now)}; this tower was trained on "
            f"{_short(ref)} and stores only what it trained over it (restore that base, or retrain)",
        )
    return target


def _saved_backbone(path: Path) -> tuple[nn.Module, Any, dict[str, Any]]:
    """The backbone, tokenizer and config (a dict) of the saved tower ``path``, in either layout."""
    doc = json.loads((path / TOWER_FILE).read_text(encoding="utf-8"))
    cfg = doc["config"]
    if doc.get("storage") == STORAGE_BASE:
        model, tok = rebuild_backbone(
            path,
            doc,
            SimpleNamespace(kind=cfg["kind"], num_layers=cfg["num_layers"], base_layers=cfg.get("base_layers")),
        )
        return model, tok, cfg
    bb = load_hf_backbone(path / "backbone", kind=cfg["kind"])
    return bb.model, bb.tokenizer, cfg


def load_base(
    target: str | Path,
    *,
    num_layers: int | None = None,
    kind: str | None = None,
    cache_dir: Any = None,
    layers: Sequence[int] | None = None,
) -> Backbone:
    """:func:`~scalingnote.models.loading.load_backbone`, and the backbone of a saved tower
    (``<tower>/backbone``, which a tower that stores only its trained parts has no directory for): a
    student that starts from its teacher's trained layers — its first ``num_layers`` or its ``layers``."""
    src = resolve_source(target)
    if src.form != "tower_backbone":
        return load_backbone(target, num_layers=num_layers, kind=kind, cache_dir=cache_dir, layers=layers)
    model, tok, cfg = _saved_backbone(src.path)
    n = int(cfg["num_layers"])
    keep = check_layer_list(list(layers), n, src.path) if layers is not None else None
    if num_layers is not None and not 1 <= num_layers <= n:
        raise ConfigError(src.path, None, "num_layers", f"must be an integer in 1..{n}, got {num_layers!r}")
    keep = keep if keep is not None else list(range(num_layers or n))
    if keep != list(range(n)):
        select_layers(model, keep)
    return Backbone(
        model=model.eval(),
        tokenizer=tok,
        kind=cfg["kind"],
        source=src,
        hf_dir=src.path,
        base_num_layers=n,
        kept_layers=None if is_bottom(keep) else keep,
    )


def base_backbone(target: str, kind: str, num_layers: int, layers: list[int] | None, cache_dir: Any = None) -> Backbone:
    """The base as a tower built from it holds it: its first ``num_layers`` (or its ``layers``), the
    tokenizer prepared (:func:`prepare_tokenizer`)."""
    bb = load_base(target, num_layers=num_layers, kind=kind, cache_dir=cache_dir, layers=layers)
    prepare_tokenizer(bb)
    return bb


def _tensor_hash(t: torch.Tensor) -> str:
    t = t.detach()
    t = (t.to("cpu", torch.float32) if t.is_floating_point() else t.to("cpu")).contiguous()
    return hashlib.blake2b(t.numpy().data.cast("B"), digest_size=16).hexdigest() + str(tuple(t.shape))


@functools.lru_cache(maxsize=4)
def _base_hashes(
    target: str, fp: str, kind: str, num_layers: int, layers: tuple[int, ...] | None
) -> tuple[dict[str, str], str]:
    """Per-tensor hashes of a rebuilt base (its state dict) and its tokenizer digest, per base fingerprint and cut."""
    bb = base_backbone(target, kind, num_layers, list(layers) if layers is not None else None)
    return {k: _tensor_hash(v) for k, v in bb.model.state_dict().items()}, tokenizer_digest(bb.tokenizer)


def trained_parts(tower: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor], bool] | None:
    """What :meth:`Tower.save` stores over the base: (the ``base`` entry, the backbone tensors
    that differ from the rebuilt base, whether the tokenizer differs); None when the base cannot
    be rebuilt (the tower is then saved whole)."""
    cfg = tower.config
    ref = base_reference(cfg.base_model)
    if ref is None:
        return None
    layers = tuple(cfg.base_layers) if cfg.base_layers is not None else None
    try:
        hashes, tok = _base_hashes(
            ref["name"] if ref["packaged"] else ref["path"],
            ref.get("sha256") or ref.get("fingerprint"),
            cfg.kind,
            cfg.num_layers,
            layers,
        )
    except ConfigError:
        return None
    sd = tower.backbone.state_dict()
    if set(hashes) - set(sd):  # the tower lost tensors its base has: not a base plus changes
        return None
    trained = {k: v.detach().to("cpu").contiguous() for k, v in sd.items() if hashes.get(k) != _tensor_hash(v)}
    return ref, trained, tokenizer_digest(tower.tokenizer) != tok


def apply_trained(model: nn.Module, trained: dict[str, torch.Tensor], where: Path) -> None:
    """Overwrite the rebuilt base's tensors with the stored ones (names and shapes checked)."""
    sd = model.state_dict()
    unknown = sorted(set(trained) - set(sd))
    if unknown:
        raise ConfigError(
            where, None, "tensors", f"{len(unknown)} stored tensors are not in the base, e.g. {unknown[:3]}"
        )
    with torch.no_grad():
        for k, v in trained.items():
            if tuple(sd[k].shape) != tuple(v.shape):
                raise ConfigError(where, None, k, f"shape {tuple(v.shape)} != the base's {tuple(sd[k].shape)}")
            sd[k].copy_(v.to(sd[k].dtype))


def rebuild_backbone(path: Path, doc: dict[str, Any], cfg: Any) -> tuple[Any, Any]:
    """The backbone and tokenizer of a tower saved as base + trained parts (``path``: its directory)."""
    from safetensors.torch import load_file

    where = path / TOWER_FILE
    target = resolve_base(doc["base"], where)
    bb = base_backbone(target, cfg.kind, cfg.num_layers, cfg.base_layers)
    tf = path / TRAINED_FILE
    if tf.is_file():
        apply_trained(bb.model, load_file(str(tf)), tf)
    tok = bb.tokenizer
    if (path / "tokenizer").is_dir():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path / "tokenizer", local_files_only=True)
    return bb.model, tok


def dir_bytes(path: str | Path) -> int:
    """Bytes of the files under ``path`` (links not followed)."""
    p = Path(path)
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink()) if p.exists() else 0


__all__ = [
    "STORAGE_BASE",
    "STORAGE_FULL",
    "TRAINED_FILE",
    "add_placeholder_tokens",
    "apply_trained",
    "base_backbone",
    "base_reference",
    "dir_bytes",
    "load_base",
    "prepare_tokenizer",
    "rebuild_backbone",
    "resolve_base",
    "source_fingerprint",
    "trained_parts",
]
