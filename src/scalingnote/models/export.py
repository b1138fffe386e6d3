"""Export a tower for other stacks: a sentence-transformers directory or an ONNX model.

This module holds the sentence-transformers export and the ``export_tower`` dispatch; the
ONNX export lives in :mod:`scalingnote.models.onnx_export` and the shared pieces in
:mod:`scalingnote.models.export_common` (all public names are importable from here).

Two formats (``scalingnote models export <tower> --format ... --out DIR``):

* **sentence-transformers** — ``SentenceTransformer(DIR)`` loads it offline and embeds like
  scalingnote's own encoder: ``modules.json`` with the transformer (saved in the directory
  root), ``Pooling`` (the ``st_mode`` of the tower's entry in the pooling table:
  mean / cls / lasttoken for the built-in modes), the trained head as a ``Dense`` module
  (identity activation; the tower's centre ``c`` becomes the bias ``-W c``: ``W (h - c)``),
  and ``Normalize``. ``config_sentence_transformers.json`` carries the query/document prompts
  (empty strings: scalingnote towers add no text prefix). An LLM query tower appends EOS to
  every query (ScalingNote §3.2); the exported tokenizer does that itself (its
  post-processor appends EOS), so last-token pooling reads the same position.
* **onnx** — ``model.onnx`` (fp32) computing the *normalised* embedding from
  ``input_ids`` / ``attention_mask`` (int64 ``[batch, sequence]``) -> ``sentence_embedding``
  (float32 ``[batch, out_dim]``), plus the tokenizer (``tokenizer.json``) and
  ``scalingnote_onnx.json`` (names, shapes, the source tower's identity). ``quantize="int8"``
  adds ``model_int8.onnx``: ONNX Runtime dynamic quantization (int8 weights per output
  channel, uint8 activations quantized at run time) of the weight MatMuls, keeping in fp32 the
  MatMuls whose quantization moves the embeddings most, chosen on *validation* queries (see
  :func:`select_int8_nodes`).

Why ``torch.onnx`` (the dynamo exporter) rather than optimum-onnx / sentence-transformers'
ONNX backend: the towers are scalingnote modules (pooling + centred projection + norm, LLM
positions from the mask), which ``torch.onnx.export`` traces as one graph, and it is part of
PyTorch itself, released in lock-step with the torch we pin; optimum-onnx exports only the
bare Hugging Face backbone (no head, no pooling) and lags transformers releases (its latest
release predates the transformers 5.x we use).

Every export verifies itself before the directory is renamed into place: the
sentence-transformers directory is loaded with ``SentenceTransformer`` and must reach cosine
>= 0.99999 with the tower on mixed English/Chinese probe texts; the fp32 ONNX model must agree
to 1e-4. A tower sentence-transformers cannot express (an LLM document tower: its §3.2 prompt
fills three fields into a template and pools before a placeholder in the middle) is refused
with :class:`ExportRefused`, never exported to something that embeds differently.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.models._fs import atomic_dir
from scalingnote.models.export_common import (  # the public names are re-exported here
    FORMATS,
    ONNX_INT8,
    ONNX_META,
    PROBE_TEXTS,
    QUANTIZE,
    ST_META,
    ExportRefused,
    _check_tokenizer,
    _export_tokenizer,
    _fp32_cpu_copy,
    _identity,
    _load,
    _max_length,
    _replaceable,
    _tower_dir,
    _tower_embed,
    _versions,
    refusal_reason,
)
from scalingnote.models.loading import quiet_transformers
from scalingnote.models.model_card import write_model_card
from scalingnote.models.onnx_export import (
    Int8Config,
    Int8Report,
    export_onnx,
    onnx_embed,
    ort_session,
    read_onnx_meta,
    select_int8_nodes,
)

log = logging.getLogger("scalingnote.models")


def export_sentence_transformers(
    tower_or_path: Any, out: str | os.PathLike, *, check_texts: list[str] | None = None, min_cos: float = 0.99999
) -> Path:
    """Write a sentence-transformers directory for the tower (see the module docstring).

    Raises :class:`ExportRefused` for a tower sentence-transformers cannot express, or when
    the written directory, loaded with ``SentenceTransformer``, does not reach ``min_cos``
    against the tower on ``check_texts`` (default :data:`PROBE_TEXTS`).
    """
    tower = _fp32_cpu_copy(_load(tower_or_path))
    reason = refusal_reason(tower, "sentence-transformers")
    if reason:
        raise ExportRefused(f"cannot export to sentence-transformers: {reason}")
    try:
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer
    except ImportError as e:
        raise ScalingNoteError(
            f"export to sentence-transformers needs the sentence-transformers package ({e}); pip install -r "
            "requirements.txt"
        ) from None
    texts = list(check_texts) if check_texts is not None else list(PROBE_TEXTS)
    out = Path(out)
    c = tower.config
    tok = _export_tokenizer(tower)
    with (
        atomic_dir(out, replace=_replaceable(out, "modules.json")) as tmp,
        tempfile.TemporaryDirectory(prefix=".hf.", dir=tmp.parent) as work,
    ):
        hf = Path(work) / "hf"
        with quiet_transformers():
            tower.backbone.save_pretrained(hf)
            tok.save_pretrained(hf)
            from transformers import AutoTokenizer

            _check_tokenizer(tower, AutoTokenizer.from_pretrained(hf, local_files_only=True), texts)
            modules: list[nn.Module] = [
                Transformer(str(hf), max_seq_length=_max_length(tower), model_kwargs={"dtype": torch.float32}),
                Pooling(c.hidden_size, pooling_mode=tower.pooling_mode.st_mode),  # the pooling table's ST equivalent
            ]
            if tower.projection is not None:
                w = tower.projection.weight.detach().to(torch.float64)
                center = tower.center.detach().to(torch.float64)
                has_bias = bool(center.abs().max() > 0)
                dense = Dense(c.hidden_size, c.out_dim, bias=has_bias, activation_function=nn.Identity())
                with torch.no_grad():
                    dense.linear.weight.copy_(w.to(torch.float32))
                    if has_bias:
                        dense.linear.bias.copy_((-(w @ center)).to(torch.float32))  # W (h - c) = W h - W c
                modules.append(dense)
            modules.append(Normalize())
            model = SentenceTransformer(modules=modules, device="cpu", prompts={"query": "", "document": ""})
            model.save(str(tmp))
        meta: dict[str, Any] = {
            "format": "sentence-transformers",
            "tower": _identity(tower),
            "input": "query text" if c.role == "query" else "Document.text (title, topic and content joined by spaces)",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": _versions(),
        }
        # self-check: load what was written, offline, and compare with the tower
        with quiet_transformers():
            st = SentenceTransformer(str(tmp), device="cpu", local_files_only=True)
            got = st.encode(
                texts, batch_size=16, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
            )
        ref = _tower_embed(tower, texts)
        cos = (np.asarray(got, dtype=np.float64) * ref.astype(np.float64)).sum(1)
        meta["check"] = {"texts": len(texts), "min_cos": float(cos.min())}
        if float(cos.min()) < min_cos:
            raise ExportRefused(
                f"the sentence-transformers export does not embed like the tower (min cosine {cos.min():.6f} < "
                f"{min_cos} on {len(texts)} probe texts, worst {texts[int(cos.argmin())]!r}); nothing was written"
            )
        (tmp / ST_META).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        write_model_card(
            tmp, meta["tower"], "sentence-transformers", out, _tower_dir(tower_or_path), meta["versions"]
        )  # replaces ST's generic card
    return out


def export_tower(
    tower_or_path: Any,
    out: str | os.PathLike,
    fmt: str = "sentence-transformers",
    *,
    quantize: str | None = None,
    validation_texts: list[str] | None = None,
    validation_name: str = "validation",
    int8: Int8Config | None = None,
) -> Path:
    """``scalingnote models export``: dispatch on ``fmt`` (one of :data:`FORMATS`)."""
    if fmt not in FORMATS:
        raise ConfigError(None, None, "format", f"must be one of {FORMATS}, got {fmt!r}")
    if fmt == "sentence-transformers":
        if quantize:
            raise ConfigError(None, None, "quantize", "int8 quantization applies to --format onnx only")
        return export_sentence_transformers(tower_or_path, out)
    return export_onnx(
        tower_or_path,
        out,
        quantize=quantize,
        validation_texts=validation_texts,
        validation_name=validation_name,
        int8=int8,
    )


__all__ = [
    "FORMATS",
    "ONNX_INT8",
    "ONNX_META",
    "QUANTIZE",
    "ExportRefused",
    "Int8Config",
    "Int8Report",
    "export_onnx",
    "export_sentence_transformers",
    "export_tower",
    "onnx_embed",
    "ort_session",
    "read_onnx_meta",
    "refusal_reason",
    "select_int8_nodes",
]
