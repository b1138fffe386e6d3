"""ONNX export of a tower (graph, int8 dynamic quantization with node selection against a
cosine budget, ONNX Runtime sessions and embedding)."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.models._fs import atomic_dir
from scalingnote.models.export_common import (
    INPUT_NAMES,
    ONNX_FP32,
    ONNX_INT8,
    ONNX_META,
    ONNX_OPSET,
    OUTPUT_NAME,
    PROBE_TEXTS,
    QUANTIZE,
    ExportRefused,
    _as_documents,
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
from scalingnote.utils.io import read_json

log = logging.getLogger("scalingnote.models")


class _EmbeddingGraph(nn.Module):
    """``(input_ids, attention_mask) -> normalised embedding``: the tower's forward + L2 norm."""

    def __init__(self, tower):
        super().__init__()
        self.tower = tower

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        y = self.tower({"input_ids": input_ids, "attention_mask": attention_mask})
        if isinstance(y, dict):  # a BERT document tower: all views are the same tensor
            y = y["emb"]
        return nn.functional.normalize(y.float(), dim=-1)


def _onnx_export_graph(tower, path: Path) -> None:
    import onnx
    from torch.export import Dim

    texts = ["export probe text number one", "a"]
    batch = tower.tokenize_queries(texts) if tower.role == "query" else tower.tokenize_documents(_as_documents(texts))
    graph = _EmbeddingGraph(tower).eval()
    b, s = Dim("batch"), Dim("sequence")
    import warnings

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                graph,
                (batch["input_ids"], batch["attention_mask"]),
                str(path),
                input_names=list(INPUT_NAMES),
                output_names=[OUTPUT_NAME],
                dynamic_shapes={"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}},
                dynamo=True,
                opset_version=ONNX_OPSET,
                external_data=False,
                verbose=False,
            )
        except Exception as e:  # report what failed, not an exporter traceback
            raise ScalingNoteError(
                f"torch.onnx.export failed for this tower ({c_name(tower)}): {type(e).__name__}: {str(e)[:500]}"
            ) from e
    # the dynamo exporter leaves intermediate shape annotations that ONNX's shape inference
    # (run by the quantizer) rejects; shapes are re-inferred from the graph itself
    m = onnx.load(str(path))
    del m.graph.value_info[:]
    onnx.save(m, str(path))


def c_name(tower) -> str:
    c = tower.config
    return f"{c.kind} {c.role} tower, {c.num_layers} layers, pooling {c.pooling}"


def ort_session(path: str | os.PathLike, threads: int | None = None) -> Any:
    """An ONNX Runtime CPU session with ``threads`` intra-op threads (None: ORT's default)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def onnx_embed(session: Any, tower, texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Embeddings of ``texts`` from an exported model, tokenized by the tower (sorted by length)."""
    n = len(texts)
    if tower.role == "query":
        seqs = tower.query_ids(texts)
    else:
        seqs = [e.input_ids for e in tower.document_encodings(_as_documents(texts))]
    out = np.zeros((n, tower.out_dim), dtype=np.float32)
    order = sorted(range(n), key=lambda i: (-len(seqs[i]), i))
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        ids, mask, _ = tower._pad([seqs[i] for i in idx])
        out[idx] = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    return out


@dataclass
class Int8Config:
    """How the int8 model is chosen (on validation queries, never test queries).

    All weight MatMuls are quantized dynamically (int8 weights, per output channel when
    ``per_channel``; uint8 activations). If the ``quantile`` (default the 1st percentile) of
    the cosine between int8 and fp32 embeddings of the validation texts is below ``min_cos``,
    the MatMuls are ranked by how much quantizing them *alone* lowers the mean cosine (kinds
    of MatMul first, then layers within a kind), and the most sensitive are kept in fp32 one
    at a time until the criterion holds (at most ``max_excluded``).
    """

    min_cos: float = 0.99
    quantile: float = 0.01
    per_channel: bool = True
    max_excluded: int = 12
    max_validation: int = 400
    sensitivity_texts: int = 96  #: validation texts the per-MatMul ranking uses (the criterion uses all)
    seed: int = 0


@dataclass
class Int8Report:
    validation: str
    n_validation: int
    quantized: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, float] = field(default_factory=dict)
    met: bool = False


def _weight_matmuls(model_path: Path) -> list[tuple[str, str]]:
    """``(node name, module path)`` of every MatMul whose second input is a weight (initializer)."""
    import onnx

    m = onnx.load(str(model_path))
    inits = {i.name for i in m.graph.initializer}
    out = []
    for n in m.graph.node:
        if n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in inits:
            label = n.name
            for p in n.metadata_props:
                if p.key == "namespace":
                    # ": a.G/tower: ...QueryTower/tower.backbone.encoder.layer.0.attention.self.query: Linear"
                    parts = [x.split(":")[0].strip() for x in p.value.split("/")]
                    label = parts[-1] or label
            out.append((n.name, label))
    return out


def _cos_stats(a: np.ndarray, b: np.ndarray, quantile: float) -> dict[str, float]:
    cos = (a.astype(np.float64) * b.astype(np.float64)).sum(1)
    return {
        "min": float(cos.min()),
        f"p{quantile * 100:g}": float(np.quantile(cos, quantile)),
        "mean": float(cos.mean()),
    }


@dataclass
class _Int8Probe:
    """Quantizes the named weight MatMuls of the fp32 model into ``path`` and scores the result:
    cosine statistics of its embeddings against the fp32 ones on the validation texts."""

    fp32_path: Path
    tower: Any
    texts: list[str]
    ref: np.ndarray
    cfg: Int8Config

    def __call__(self, quantize_nodes: list[str], path: Path, n: int | None = None) -> dict[str, float]:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # the quantizer logs a "consider pre-processing" warning per call
        try:
            quantize_dynamic(
                str(self.fp32_path),
                str(path),
                weight_type=QuantType.QInt8,
                per_channel=self.cfg.per_channel,
                op_types_to_quantize=["MatMul"],
                nodes_to_quantize=quantize_nodes,
            )
        finally:
            root.setLevel(level)
        sub = self.texts if n is None else self.texts[:n]
        return _cos_stats(onnx_embed(ort_session(path), self.tower, sub), self.ref[: len(sub)], self.cfg.quantile)


def _keep_sensitive_in_fp32(
    build: _Int8Probe,
    names: list[str],
    label: dict[str, str],
    int8_path: Path,
    report: Int8Report,
    stats: dict[str, float],
) -> tuple[list[str], dict[str, float]]:
    """The MatMuls kept in fp32 and the final model's statistics.

    Sensitivity, coarse to fine (each probe quantizes only the MatMuls it names, on a subset of
    the validation texts): first per kind of MatMul across layers (query, key, value, attention
    output, FFN in, FFN out, head), then per layer within the kinds in that order; the most
    sensitive MatMuls are kept in fp32 one at a time until the cosine budget is met."""
    cfg = build.cfg
    qkey = f"p{cfg.quantile * 100:g}"
    n_sens = max(1, min(cfg.sensitivity_texts, len(build.texts)))
    excluded: list[str] = []
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(re.sub(r"\.\d+\.", ".*.", label[n]), []).append(n)
    with tempfile.TemporaryDirectory(prefix=".int8.", dir=int8_path.parent) as work:
        probe = Path(work) / "probe.onnx"
        gsens = sorted(
            ((1.0 - build(members, probe, n_sens)["mean"], g) for g, members in groups.items()), reverse=True
        )
        report.steps.append({"group_sensitivity": {g: round(v, 6) for v, g in gsens}})
        for _, g in gsens:
            members = groups[g]
            order = (
                [n for _, n in sorted(((1.0 - build([n], probe, n_sens)["mean"], n) for n in members), reverse=True)]
                if len(members) > 1
                else members
            )
            for n in order:
                if len(excluded) >= cfg.max_excluded:
                    return excluded, stats
                excluded.append(n)
                stats = build([x for x in names if x not in excluded], int8_path)
                report.steps.append({"excluded": len(excluded), "kept_fp32": label[n], **stats})
                if stats[qkey] >= cfg.min_cos:
                    return excluded, stats
    return excluded, stats


def select_int8_nodes(
    fp32_path: Path,
    int8_path: Path,
    tower,
    validation_texts: list[str],
    cfg: Int8Config,
    validation_name: str = "validation",
) -> Int8Report:
    """Quantize ``fp32_path`` into ``int8_path``, choosing the MatMuls to keep in fp32 (see :class:`Int8Config`)."""
    texts = list(validation_texts)
    if len(texts) < 10:
        raise ConfigError(
            None,
            None,
            "validation_queries",
            f"need at least 10 validation texts to choose the int8 layers, got {len(texts)}",
        )
    if len(texts) > cfg.max_validation:
        rng = np.random.default_rng(cfg.seed)
        texts = [texts[i] for i in sorted(rng.choice(len(texts), cfg.max_validation, replace=False))]
    ref = onnx_embed(ort_session(fp32_path), tower, texts)
    nodes = _weight_matmuls(fp32_path)
    label = dict(nodes)
    qkey = f"p{cfg.quantile * 100:g}"
    report = Int8Report(validation=validation_name, n_validation=len(texts))
    build = _Int8Probe(fp32_path, tower, texts, ref, cfg)
    names = [n for n, _ in nodes]
    excluded: list[str] = []
    stats = build(names, int8_path)
    report.steps.append({"excluded": 0, **stats})
    if stats[qkey] < cfg.min_cos:
        excluded, stats = _keep_sensitive_in_fp32(build, names, label, int8_path, report, stats)
    report.quantized = [label[n] for n in names if n not in excluded]
    report.excluded = [label[n] for n in excluded]
    report.final = stats
    report.met = stats[qkey] >= cfg.min_cos
    if not report.met:
        log.warning(
            "int8: %s cosine %.5f < %.5f with %d MatMuls kept in fp32 (the limit)",
            qkey,
            stats[qkey],
            cfg.min_cos,
            len(excluded),
        )
    return report


def export_onnx(
    tower_or_path: Any,
    out: str | os.PathLike,
    *,
    quantize: str | None = None,
    validation_texts: list[str] | None = None,
    validation_name: str = "validation",
    int8: Int8Config | None = None,
    check_texts: list[str] | None = None,
    atol: float = 1e-4,
) -> Path:
    """Write ``model.onnx`` (+ ``model_int8.onnx`` with ``quantize="int8"``), the tokenizer and
    ``scalingnote_onnx.json``. The fp32 model must agree with the tower to ``atol``."""
    if quantize not in QUANTIZE:
        raise ConfigError(
            None, None, "quantize", f"must be one of {[q for q in QUANTIZE if q]} or none, got {quantize!r}"
        )
    if quantize == "int8" and not validation_texts:
        raise ConfigError(
            None,
            None,
            "validation_queries",
            "int8 export needs validation queries to choose which layers to quantize (e.g. a train split)",
        )
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        raise ScalingNoteError(
            f"ONNX export needs onnx, onnxscript and onnxruntime ({e}); pip install -r requirements.txt"
        ) from None
    tower = _fp32_cpu_copy(_load(tower_or_path))
    reason = refusal_reason(tower, "onnx")
    if reason:
        raise ExportRefused(f"cannot export to ONNX: {reason}")
    texts = list(check_texts) if check_texts is not None else list(PROBE_TEXTS)
    out = Path(out)
    with atomic_dir(out, replace=_replaceable(out, ONNX_META)) as tmp:
        fp32 = tmp / ONNX_FP32
        t0 = time.perf_counter()
        _onnx_export_graph(tower, fp32)
        export_s = time.perf_counter() - t0
        ref = _tower_embed(tower, texts)
        got = onnx_embed(ort_session(fp32), tower, texts)
        diff = float(np.abs(got - ref).max())
        if diff > atol:
            raise ExportRefused(
                f"the ONNX export does not agree with the tower (max |diff| {diff:.2e} > {atol:g}); nothing was written"
            )
        with quiet_transformers():
            tok = _export_tokenizer(tower)
            tok.save_pretrained(tmp)
        meta: dict[str, Any] = {
            "format": "onnx",
            "exporter": f"torch.onnx (dynamo), opset {ONNX_OPSET}",
            "models": {"fp32": ONNX_FP32},
            "default_model": ONNX_FP32,
            "inputs": [
                {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
                {
                    "name": "attention_mask",
                    "dtype": "int64",
                    "shape": ["batch", "sequence"],
                    "note": "1 = token, 0 = padding",
                },
            ],
            "outputs": [
                {"name": OUTPUT_NAME, "dtype": "float32", "shape": ["batch", tower.out_dim], "note": "L2-normalised"}
            ],
            "tokenizer": "tokenizer.json (Hugging Face tokenizers; adds the special tokens the tower uses"
            + (", EOS appended" if tower.kind == "llm" else "")
            + f"; truncate to {_max_length(tower)} tokens)",
            "matryoshka": (
                f"a prefix of m in {list(tower.config.matryoshka_dims)} dims, re-normalised, is the m-dim embedding"
            ),
            "input_text": "query text"
            if tower.role == "query"
            else "Document.text (title, topic and content joined by spaces)",
            "tower": _identity(tower),
            "check": {"texts": len(texts), "fp32_max_abs_diff": diff},
            "export_seconds": round(export_s, 2),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": _versions(),
        }
        if quantize == "int8":
            cfg = int8 or Int8Config()
            rep = select_int8_nodes(fp32, tmp / ONNX_INT8, tower, list(validation_texts or []), cfg, validation_name)
            meta["models"]["int8"] = ONNX_INT8
            meta["default_model"] = ONNX_INT8
            meta["int8"] = {"config": asdict(cfg), "report": asdict(rep)}
        (tmp / ONNX_META).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        write_model_card(tmp, meta["tower"], "onnx", out, _tower_dir(tower_or_path), meta["versions"])
    return out


def read_onnx_meta(path: str | os.PathLike) -> dict[str, Any]:
    """``scalingnote_onnx.json`` of an ONNX export directory (clear errors on a bad one)."""
    f = Path(path) / ONNX_META
    doc = read_json(f, unreadable="not an ONNX export of `scalingnote models export --format onnx`")
    for key in ("format", "models", "default_model", "tower"):
        if key not in doc:
            raise ConfigError(f, None, key, "missing")
    return doc
