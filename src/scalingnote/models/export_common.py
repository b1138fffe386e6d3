"""Shared pieces of the tower exports (:mod:`scalingnote.models.export`): formats, the refusal
rules, the export tokenizer and its check, the tower-side reference embeddings, the probe texts."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalingnote.data.types import Document
from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.models.towers.base import Tower
from scalingnote.models.towers.io import load_tower
from scalingnote.utils import run_metadata

log = logging.getLogger("scalingnote.models")

FORMATS = ("sentence-transformers", "onnx")
QUANTIZE = (None, "int8")
ST_META = "scalingnote_export.json"
ONNX_META = "scalingnote_onnx.json"
ONNX_FP32 = "model.onnx"
ONNX_INT8 = "model_int8.onnx"
INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "sentence_embedding"
ONNX_OPSET = 18

#: Probe texts of the export self-check: English and Chinese, short and long, punctuation.
PROBE_TEXTS: tuple[str, ...] = (
    "what causes bone fractures in older adults",
    "Vitamin D deficiency is associated with an increased risk of fractures.",
    "糖尿病患者可以吃什么水果",
    "高血压 头晕 怎么办",
    "a",
    "COVID-19 vaccine efficacy against the Omicron variant (BA.2), 2022 cohort study",
    "儿童发烧38.5度需要去医院吗？",
    "Dense retrieval maps queries and documents into one vector space; product quantization compresses them.",
    "0.5 mg/kg q8h — dosing “rules” for naïve patients",
    "感冒了 吃 阿莫西林 有用吗 antibiotics for a cold",
    # longer than any tower's query length: the export must truncate where the tower does
    " ".join(["Statins lower LDL cholesterol and the risk of myocardial infarction in adults with diabetes."] * 14),
    "慢性胃炎的症状有哪些，" * 40,
)


class ExportRefused(ScalingNoteError):
    """The tower cannot be expressed in the asked format; the message says why and what to do."""


def _load(tower_or_path: Any):
    if isinstance(tower_or_path, Tower):
        return tower_or_path
    return load_tower(str(tower_or_path), device="cpu", dtype="float32")


def _tower_dir(tower_or_path: Any) -> Path | None:
    """The saved tower directory an export reads (None for a tower object: its run is not known)."""
    return None if isinstance(tower_or_path, Tower) else Path(str(tower_or_path))


def _fp32_cpu_copy(tower):
    """The tower on CPU in fp32 (a copy when it is elsewhere; identity carried over)."""
    if tower.device.type == "cpu" and tower.dtype == torch.float32:
        return tower
    ids, explicit = tower._ids, tower._compat_explicit
    t = copy.deepcopy(tower).to("cpu", torch.float32)
    t._ids, t._compat_explicit = ids, explicit
    return t


def _identity(tower) -> dict[str, Any]:
    c = tower.config
    return {
        "fingerprint": tower.fingerprint,
        "compat_id": tower.compat_id,
        "kind": c.kind,
        "role": c.role,
        "pooling": c.pooling,
        "base_model": c.base_model,
        "num_layers": c.num_layers,
        "out_dim": c.out_dim,
        "matryoshka_dims": list(c.matryoshka_dims),
        "max_length": _max_length(tower),
    }


def _max_length(tower) -> int:
    c = tower.config
    return int(c.max_query_length if c.role == "query" else c.max_doc_length)


def _versions() -> dict[str, str]:
    return run_metadata()["versions"]


# ====================================================================== what can be expressed


def refusal_reason(tower, fmt: str = "sentence-transformers") -> str | None:
    """Why ``tower`` cannot be exported to ``fmt`` (None when it can)."""
    c = tower.config
    if c.kind == "llm" and c.role == "document":
        one_sequence = (
            "sentence-transformers embeds one text with at most a prefix prompt"
            if fmt != "onnx"
            else "the ONNX graph takes one token sequence"
        )
        return (
            "an LLM document tower embeds the ScalingNote §3.2 prompt: the title, topic and content are filled into a "
            "template with per-field token budgets, and each view is pooled at the hidden state just before a "
            f"placeholder in the middle of the prompt ([TITLE_QUERY], [CONTENT_QUERY], [EMB]; pooling {c.pooling!r}). "
            f"{one_sequence}"
            ", so no export would embed like the tower. Encode documents with `scalingnote index encode` and export "
            "the query tower (or a BERT document tower) instead"
        )
    mode = tower.pooling_mode  # what the export needs to know about the pooling: see models.towers.pooling
    if fmt == "sentence-transformers" and mode.st_mode is None:
        return (
            f"pooling {c.pooling!r} has no sentence-transformers Pooling mode that computes the same vector (its "
            "st_mode is None in the pooling table); export to onnx instead, or register the mode with the st_mode "
            "that matches it"
        )
    if mode.reads == "first":
        cls_id = tower.tokenizer.cls_token_id
        probe = list(tower.tokenizer("probe", add_special_tokens=True)["input_ids"])
        if cls_id is None or not probe or probe[0] != cls_id:
            return (
                f"this tower pools the first token ({c.pooling!r}) but its tokenizer does not put [CLS] first: the "
                "tower inserts it itself (§3.3), which a sentence-transformers Transformer module does not; use a "
                "tokenizer with a [CLS] post-processor or mean pooling"
            )
    return None


# ====================================================================== tokenizer for export


def _export_tokenizer(tower) -> Any:
    """A copy of the tower's tokenizer that tokenizes exactly like the tower.

    LLM towers: right padding, and a post-processor that appends EOS after the text (the
    tower's ``text + [EOS]``, §3.2), so truncation keeps ``max_length - 1`` text tokens + EOS.
    ``model_max_length`` is the tower's maximum length for its role.
    """
    tok = copy.deepcopy(tower.tokenizer)
    tok.model_max_length = _max_length(tower)
    if tower.kind == "llm":
        from tokenizers import processors

        tok.padding_side = "right"
        backend = getattr(tok, "backend_tokenizer", None) or getattr(tok, "_tokenizer", None)
        if backend is None:
            raise ExportRefused(
                "the LLM tower's tokenizer is not a fast (tokenizers) tokenizer: cannot make it append EOS"
            )
        eos, eos_id = tok.eos_token, int(tok.eos_token_id)
        append = processors.TemplateProcessing(single=f"$A {eos}", pair=f"$A $B {eos}", special_tokens=[(eos, eos_id)])
        old = backend.post_processor
        backend.post_processor = processors.Sequence([old, append]) if old is not None else append
    return tok


def _check_tokenizer(tower, tok, texts: list[str]) -> None:
    """The export tokenizer must give the tower's own ids (after a save/reload cycle)."""
    want = (
        tower.query_ids(texts)
        if tower.role == "query"
        else [e.input_ids for e in tower.document_encodings(_as_documents(texts))]
    )
    got = [
        list(x)
        for x in tok(texts, add_special_tokens=True, truncation=True, max_length=_max_length(tower))["input_ids"]
    ]
    bad = [i for i, (a, b) in enumerate(zip(want, got, strict=True)) if list(a) != b]
    if bad:
        i = bad[0]
        raise ExportRefused(
            f"the exported tokenizer does not reproduce the tower's token ids (text {texts[i]!r}: tower "
            f"{list(want[i])[:12]}..., exported {got[i][:12]}...): the export would embed differently"
        )


def _as_documents(texts: list[str]) -> list[Any]:
    """BERT document towers embed ``Document.text``; a document with only ``content`` has ``text == content``."""

    return [Document(id=str(i), title="", content=t) for i, t in enumerate(texts)]


def _tower_embed(tower, texts: list[str]) -> np.ndarray:
    if tower.role == "query":
        return tower.encode_queries(texts, batch_size=16, show_progress=False)
    return tower.encode_documents(_as_documents(texts), batch_size=16, show_progress=False)


# ====================================================================== sentence-transformers


def _replaceable(out: Path, marker: str) -> bool:
    """An existing output directory is replaced only when it is an export of the same kind (or empty)."""
    if not out.exists():
        return False
    if not out.is_dir() or (any(out.iterdir()) and not (out / marker).is_file()):
        raise ConfigError(
            out, None, None, f"exists and is not an export directory (no {marker}); refusing to overwrite it"
        )
    return True


# ====================================================================== ONNX
