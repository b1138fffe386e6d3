"""Use a sentence-transformers directory as a scalingnote tower (no conversion by hand).

A directory with a ``modules.json`` (one a user fine-tuned elsewhere, or one written by
``scalingnote models export --format sentence-transformers``) is read module by module:

* ``Transformer`` (its ``path``: the directory root or a sub-directory) -> the backbone;
* ``Pooling`` -> the tower's pooling: the entry of the pooling table
  (:mod:`~scalingnote.models.towers.pooling`) whose ``st_mode`` is the module's mode;
* ``Dense`` (at most one, identity activation, ``in_features`` = hidden size) -> the tower's
  projection ``W``; its bias ``b`` becomes the tower's centre ``c`` with ``W c = -b``
  (``W (h - c) = W h + b``), solved by least squares and checked;
* ``Normalize`` -> nothing to do (scalingnote normalises the embeddings it returns).

:func:`scalingnote.models.load_tower` reads every such directory with this module and builds the
tower from what it found, so ``index encode``, ``evaluate``, ``serve`` and QKD (teacher ``query_tower`` or student
``model``) accept one wherever they accept a Hugging Face directory. A directory with no
``Dense`` module loads exactly as the plain Hugging Face directory did before (so existing
indexes of the packaged all-MiniLM-L6-v2 keep their compat id).

Refused, with the reason: other module types, several ``Dense`` modules, a non-identity
activation, a pooling mode no entry of the pooling table computes for an encoder (by default
``max`` / ``weightedmean`` / ``lasttoken``), a non-empty prompt for the tower's role (scalingnote
towers add no text prefix), ``do_lower_case``, and decoder (LLM) models (scalingnote's LLM query
tower appends EOS and pools itself, §3.2).

This module reads the directory only; it imports nothing of the towers (which import it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scalingnote.errors import ConfigError
from scalingnote.utils.io import read_json

log = logging.getLogger("scalingnote.models")

MODULES_FILE = "modules.json"
_KNOWN = ("Transformer", "Pooling", "Dense", "Normalize")


@dataclass
class STLayout:
    """What a sentence-transformers directory holds, as far as a tower needs it."""

    root: Path
    transformer_dir: Path
    pooling: str | None  #: "mean" / "cls" / "lasttoken" / other ST mode, None without a Pooling module
    dense_dir: Path | None
    dense_in: int | None
    dense_out: int | None
    dense_bias: bool
    normalize: bool
    prompts: dict[str, str]
    default_prompt_name: str | None
    do_lower_case: bool


#: sentence-transformers' older ``Pooling`` config: one boolean per mode
_LEGACY_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def st_pooling_mode(cfg: dict[str, Any], f: Path) -> str:
    """The single mode of a ``Pooling`` config (``pooling_mode``, or the older per-mode flags);
    a ConfigError naming file ``f`` unless exactly one is set."""
    mode = cfg.get("pooling_mode")
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else None
    if mode is None:
        on = [v for k, v in _LEGACY_POOLING_FLAGS.items() if cfg.get(k)]
        if len(on) != 1:
            raise ConfigError(f, None, "pooling_mode", f"exactly one pooling mode must be set, found {on or 'none'}")
        mode = on[0]
    if not isinstance(mode, str):
        raise ConfigError(f, None, "pooling_mode", f"a single pooling mode is needed, got {cfg.get('pooling_mode')!r}")
    return mode


def declared_pooling(hf_dir: str | Path) -> str | None:
    """The sentence-transformers pooling mode a model directory declares in ``1_Pooling/config.json``
    (e.g. ``"mean"`` for all-MiniLM-L6-v2), or None (no such file, or not one readable mode)."""
    f = Path(hf_dir) / "1_Pooling" / "config.json"
    try:
        return st_pooling_mode(read_json(f), f) if f.is_file() else None
    except ConfigError:
        return None


def read_st_layout(path: str | Path) -> STLayout:
    """Parse ``modules.json`` and the module configs; refuse what a tower cannot express."""
    root = Path(path)
    mf = root / MODULES_FILE
    mods = read_json(mf)
    if not isinstance(mods, list) or not mods:
        raise ConfigError(mf, None, None, "must be a non-empty list of modules")
    transformer_dir = pooling = dense_dir = None
    dense_in = dense_out = None
    dense_bias = normalize = False
    n_dense = 0
    for i, m in enumerate(mods):
        if not isinstance(m, dict) or not isinstance(m.get("type"), str):
            raise ConfigError(mf, None, f"[{i}].type", "missing")
        short = m["type"].rsplit(".", 1)[-1]
        sub = root / str(m.get("path") or "")
        if short not in _KNOWN:
            raise ConfigError(
                mf,
                None,
                f"[{i}].type",
                f"module {m['type']!r} cannot be part of a scalingnote tower (supported: {', '.join(_KNOWN)})",
            )
        if short == "Transformer":
            if i != 0:
                raise ConfigError(mf, None, f"[{i}].type", "the Transformer must be the first module")
            transformer_dir = sub
        elif transformer_dir is None:
            raise ConfigError(mf, None, "[0].type", "the first module must be a Transformer")
        elif short == "Pooling":
            if pooling is not None or n_dense:
                raise ConfigError(mf, None, f"[{i}].type", "one Pooling module, before any Dense module, is supported")
            pooling = st_pooling_mode(read_json(sub / "config.json"), sub / "config.json")
        elif short == "Dense":
            n_dense += 1
            if n_dense > 1:
                raise ConfigError(mf, None, f"[{i}].type", "more than one Dense module: a tower has one linear head")
            if pooling is None:
                raise ConfigError(
                    mf, None, f"[{i}].type", "a Dense module before Pooling acts per token, which a tower head does not"
                )
            cf = sub / "config.json"
            cfg = read_json(cf)
            act = str(cfg.get("activation_function", "torch.nn.modules.activation.Tanh"))
            if act.rsplit(".", 1)[-1] != "Identity":
                raise ConfigError(
                    cf, None, "activation_function", f"{act}: a tower head is linear (identity activation)"
                )
            dense_dir, dense_in, dense_out = sub, int(cfg["in_features"]), int(cfg["out_features"])
            dense_bias = bool(cfg.get("bias", True))
        elif short == "Normalize":
            normalize = True
    if transformer_dir is None:
        raise ConfigError(mf, None, None, "no Transformer module")
    cst = root / "config_sentence_transformers.json"
    prompts, default_prompt = {}, None
    if cst.is_file():
        d = read_json(cst)
        prompts = {str(k): str(v) for k, v in (d.get("prompts") or {}).items()}
        default_prompt = d.get("default_prompt_name")
    sbc = transformer_dir / "sentence_bert_config.json"
    lower = bool(read_json(sbc).get("do_lower_case", False)) if sbc.is_file() else False
    return STLayout(
        root,
        transformer_dir,
        pooling,
        dense_dir,
        dense_in,
        dense_out,
        dense_bias,
        normalize,
        prompts,
        default_prompt,
        lower,
    )


def _dense_weights(layout: STLayout) -> tuple[torch.Tensor, torch.Tensor | None]:
    d = layout.dense_dir
    assert d is not None
    st = d / "model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        sd = load_file(str(st))
    elif (d / "pytorch_model.bin").is_file():
        sd = torch.load(d / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ConfigError(d, None, None, "Dense module has no model.safetensors or pytorch_model.bin")
    if "linear.weight" not in sd:
        raise ConfigError(d, None, "linear.weight", "missing from the Dense weights")
    w = sd["linear.weight"].to(torch.float64)
    if tuple(w.shape) != (layout.dense_out, layout.dense_in):
        raise ConfigError(
            d,
            None,
            "linear.weight",
            f"shape {tuple(w.shape)} != (out_features, in_features) {(layout.dense_out, layout.dense_in)}",
        )
    b = sd.get("linear.bias")
    if layout.dense_bias and b is None:
        raise ConfigError(d, None, "linear.bias", "config says bias=true but the weights have none")
    return w, (b.to(torch.float64) if b is not None else None)


def check_importable(layout: STLayout, role: str, kind: str) -> None:
    """Refuse what a ``kind`` ``role`` tower cannot embed like the directory does (see the module docstring)."""
    for name in (role, layout.default_prompt_name):
        if name and layout.prompts.get(name):
            raise ConfigError(
                layout.root / "config_sentence_transformers.json",
                None,
                f"prompts.{name}",
                f"{layout.prompts[name]!r}: scalingnote towers embed the text as given (no prompt prefix); "
                "remove the prompt, or prepend it to your queries/documents yourself",
            )
    if layout.do_lower_case:
        raise ConfigError(
            layout.transformer_dir / "sentence_bert_config.json",
            None,
            "do_lower_case",
            "scalingnote towers tokenize the text as given; use a lower-casing tokenizer instead",
        )
    if kind != "bert":
        raise ConfigError(
            layout.root / MODULES_FILE,
            None,
            "[0].type",
            "decoder (LLM) sentence-transformers models are not imported: a scalingnote LLM query tower appends EOS "
            "and pools itself (§3.2), which this directory's tokenizer/pooling may or may not do; load the base model "
            "directory instead",
        )


def dense_head(layout: STLayout, hidden_size: int, dim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``Dense`` module as a tower head: ``(W [out, hidden], c [hidden])`` (float64) with
    ``W (h - c) = W h + b``: the bias ``b`` becomes the centre ``c``, ``W c = -b``, solved by
    least squares and checked."""
    assert layout.dense_dir is not None
    if layout.dense_in != hidden_size:
        raise ConfigError(
            layout.dense_dir / "config.json",
            None,
            "in_features",
            f"{layout.dense_in} != the transformer's hidden size {hidden_size}",
        )
    if dim is not None and dim != layout.dense_out:
        raise ConfigError(
            layout.dense_dir / "config.json",
            None,
            "out_features",
            f"the Dense head gives {layout.dense_out} dims; asked for dim={dim}",
        )
    w, b = _dense_weights(layout)
    center = torch.zeros(hidden_size, dtype=torch.float64)
    if b is not None and float(b.abs().max()) > 0:
        center = -(torch.linalg.pinv(w) @ b)  # W c = -b  <=>  W (h - c) = W h + b
        resid = float((w @ center + b).abs().max())
        if resid > 1e-5 * (1.0 + float(b.abs().max())):
            raise ConfigError(
                layout.dense_dir,
                None,
                "linear.bias",
                f"cannot be written as W c (residual {resid:.2e}): the head's weight is rank-deficient",
            )
    return w, center
