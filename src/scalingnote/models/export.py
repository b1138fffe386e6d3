"""Export a tower for other stacks: a sentence-transformers directory or an ONNX model.

Two formats (``scalingnote models export <tower> --format ... --out DIR``):

* **sentence-transformers** — ``SentenceTransformer(DIR)`` loads it offline and embeds like
  scalingnote's own encoder: ``modules.json`` with the transformer (saved in the directory
  root), ``Pooling`` (mean / cls / lasttoken), the trained head as a ``Dense`` module
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

import copy
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
from scalingnote.models.loading import quiet_transformers

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
    from scalingnote.models.towers import Tower, load_tower

    if isinstance(tower_or_path, Tower):
        return tower_or_path
    return load_tower(str(tower_or_path), device="cpu", dtype="float32")


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
    from scalingnote.utils import run_metadata

    return run_metadata()["versions"]


# ====================================================================== what can be expressed


def refusal_reason(tower, fmt: str = "sentence-transformers") -> str | None:
    """Why ``tower`` cannot be exported to ``fmt`` (None when it can)."""
    c = tower.config
    if c.kind == "llm" and c.role == "document":
        return (
            "an LLM document tower embeds the ScalingNote §3.2 prompt: the title, topic and content are filled into a "
            "template with per-field token budgets, and each view is pooled at the hidden state just before a placeholder "
            f"in the middle of the prompt ([TITLE_QUERY], [CONTENT_QUERY], [EMB]; pooling {c.pooling!r}). "
            f"{'sentence-transformers embeds one text with at most a prefix prompt' if fmt != 'onnx' else 'the ONNX graph takes one token sequence'}"
            ", so no export would embed like the tower. Encode documents with `scalingnote index encode` and export the "
            "query tower (or a BERT document tower) instead"
        )
    if c.kind == "bert" and c.pooling == "cls":
        cls_id = tower.tokenizer.cls_token_id
        probe = list(tower.tokenizer("probe", add_special_tokens=True)["input_ids"])
        if cls_id is None or not probe or probe[0] != cls_id:
            return (
                "this BERT tower pools [CLS] but its tokenizer does not put [CLS] first: the tower inserts it itself (§3.3), "
                "which a sentence-transformers Transformer module does not; use a tokenizer with a [CLS] post-processor or mean pooling"
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
            raise ExportRefused("the LLM tower's tokenizer is not a fast (tokenizers) tokenizer: cannot make it append EOS")
        eos, eos_id = tok.eos_token, int(tok.eos_token_id)
        append = processors.TemplateProcessing(single=f"$A {eos}", pair=f"$A $B {eos}", special_tokens=[(eos, eos_id)])
        old = backend.post_processor
        backend.post_processor = processors.Sequence([old, append]) if old is not None else append
    return tok


def _check_tokenizer(tower, tok, texts: list[str]) -> None:
    """The export tokenizer must give the tower's own ids (after a save/reload cycle)."""
    want = tower.query_ids(texts) if tower.role == "query" else [e.input_ids for e in tower.document_encodings(_as_documents(texts))]
    got = [list(x) for x in tok(texts, add_special_tokens=True, truncation=True, max_length=_max_length(tower))["input_ids"]]
    bad = [i for i, (a, b) in enumerate(zip(want, got, strict=True)) if list(a) != b]
    if bad:
        i = bad[0]
        raise ExportRefused(
            f"the exported tokenizer does not reproduce the tower's token ids (text {texts[i]!r}: tower {list(want[i])[:12]}..., "
            f"exported {got[i][:12]}...): the export would embed differently"
        )


def _as_documents(texts: list[str]) -> list[Any]:
    """BERT document towers embed ``Document.text``; a document with only ``content`` has ``text == content``."""
    from scalingnote.data import Document

    return [Document(id=str(i), title="", content=t) for i, t in enumerate(texts)]


def _tower_embed(tower, texts: list[str]) -> np.ndarray:
    if tower.role == "query":
        return tower.encode_queries(texts, batch_size=16, show_progress=False)
    return tower.encode_documents(_as_documents(texts), batch_size=16, show_progress=False)


# ====================================================================== sentence-transformers


def export_sentence_transformers(tower_or_path: Any, out: str | os.PathLike, *, check_texts: list[str] | None = None, min_cos: float = 0.99999) -> Path:
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
        raise ScalingNoteError(f"export to sentence-transformers needs the sentence-transformers package ({e}); pip install -r requirements.txt") from None
    texts = list(check_texts) if check_texts is not None else list(PROBE_TEXTS)
    out = Path(out)
    c = tower.config
    tok = _export_tokenizer(tower)
    pool_mode = {"cls": "cls", "mean": "mean", "last": "lasttoken"}[c.pooling]
    with atomic_dir(out, replace=_replaceable(out, "modules.json")) as tmp, tempfile.TemporaryDirectory(prefix=".hf.", dir=tmp.parent) as work:
        hf = Path(work) / "hf"
        with quiet_transformers():
            tower.backbone.save_pretrained(hf)
            tok.save_pretrained(hf)
            from transformers import AutoTokenizer

            _check_tokenizer(tower, AutoTokenizer.from_pretrained(hf, local_files_only=True), texts)
            modules: list[nn.Module] = [
                Transformer(str(hf), max_seq_length=_max_length(tower), model_kwargs={"dtype": torch.float32}),
                Pooling(c.hidden_size, pooling_mode=pool_mode),
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
        meta = {
            "format": "sentence-transformers",
            "tower": _identity(tower),
            "input": "query text" if c.role == "query" else "Document.text (title, topic and content joined by spaces)",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": _versions(),
        }
        # self-check: load what was written, offline, and compare with the tower
        with quiet_transformers():
            st = SentenceTransformer(str(tmp), device="cpu", local_files_only=True)
            got = st.encode(texts, batch_size=16, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
        ref = _tower_embed(tower, texts)
        cos = (np.asarray(got, dtype=np.float64) * ref.astype(np.float64)).sum(1)
        meta["check"] = {"texts": len(texts), "min_cos": float(cos.min())}
        if float(cos.min()) < min_cos:
            raise ExportRefused(
                f"the sentence-transformers export does not embed like the tower (min cosine {cos.min():.6f} < {min_cos} on "
                f"{len(texts)} probe texts, worst {texts[int(cos.argmin())]!r}); nothing was written"
            )
        (tmp / ST_META).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def _replaceable(out: Path, marker: str) -> bool:
    """An existing output directory is replaced only when it is an export of the same kind (or empty)."""
    if not out.exists():
        return False
    if not out.is_dir() or (any(out.iterdir()) and not (out / marker).is_file()):
        raise ConfigError(out, None, None, f"exists and is not an export directory (no {marker}); refusing to overwrite it")
    return True


# ====================================================================== ONNX


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
        except Exception as e:  # noqa: BLE001 - report what failed, not an exporter traceback
            raise ScalingNoteError(f"torch.onnx.export failed for this tower ({c_name(tower)}): {type(e).__name__}: {str(e)[:500]}") from e
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
    return {"min": float(cos.min()), f"p{quantile * 100:g}": float(np.quantile(cos, quantile)), "mean": float(cos.mean())}


def select_int8_nodes(
    fp32_path: Path, int8_path: Path, tower, validation_texts: list[str], cfg: Int8Config, validation_name: str = "validation"
) -> Int8Report:
    """Quantize ``fp32_path`` into ``int8_path``, choosing the MatMuls to keep in fp32 (see :class:`Int8Config`)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    texts = list(validation_texts)
    if len(texts) < 10:
        raise ConfigError(None, None, "validation_queries", f"need at least 10 validation texts to choose the int8 layers, got {len(texts)}")
    if len(texts) > cfg.max_validation:
        rng = np.random.default_rng(cfg.seed)
        texts = [texts[i] for i in sorted(rng.choice(len(texts), cfg.max_validation, replace=False))]
    ref = onnx_embed(ort_session(fp32_path), tower, texts)
    nodes = _weight_matmuls(fp32_path)
    label = dict(nodes)
    qkey = f"p{cfg.quantile * 100:g}"
    report = Int8Report(validation=validation_name, n_validation=len(texts))
    import logging as _logging

    qlog = _logging.getLogger()
    level = qlog.level

    n_sens = max(1, min(cfg.sensitivity_texts, len(texts)))

    def build(quantize_nodes: list[str], path: Path, n: int | None = None) -> dict[str, float]:
        qlog.setLevel(_logging.ERROR)  # the quantizer logs a "consider pre-processing" warning per call
        try:
            quantize_dynamic(
                str(fp32_path), str(path), weight_type=QuantType.QInt8, per_channel=cfg.per_channel,
                op_types_to_quantize=["MatMul"], nodes_to_quantize=quantize_nodes,
            )
        finally:
            qlog.setLevel(level)
        sub = texts if n is None else texts[:n]
        return _cos_stats(onnx_embed(ort_session(path), tower, sub), ref[: len(sub)], cfg.quantile)

    names = [n for n, _ in nodes]
    excluded: list[str] = []
    stats = build(names, int8_path)
    report.steps.append({"excluded": 0, **stats})
    if stats[qkey] < cfg.min_cos:
        # Sensitivity, coarse to fine (each probe quantizes only the MatMuls it names, on a
        # subset of the validation texts): first per kind of MatMul across layers (query, key,
        # value, attention output, FFN in, FFN out, head), then per layer within the kinds in
        # that order; the most sensitive MatMuls are kept in fp32 one at a time.
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(re.sub(r"\.\d+\.", ".*.", label[n]), []).append(n)
        with tempfile.TemporaryDirectory(prefix=".int8.", dir=int8_path.parent) as work:
            probe = Path(work) / "probe.onnx"
            gsens = sorted(((1.0 - build(members, probe, n_sens)["mean"], g) for g, members in groups.items()), reverse=True)
            report.steps.append({"group_sensitivity": {g: round(v, 6) for v, g in gsens}})
            done = False
            for _, g in gsens:
                members = groups[g]
                order = [n for _, n in sorted(((1.0 - build([n], probe, n_sens)["mean"], n) for n in members), reverse=True)] if len(members) > 1 else members
                for n in order:
                    if len(excluded) >= cfg.max_excluded:
                        done = True
                        break
                    excluded.append(n)
                    stats = build([x for x in names if x not in excluded], int8_path)
                    report.steps.append({"excluded": len(excluded), "kept_fp32": label[n], **stats})
                    if stats[qkey] >= cfg.min_cos:
                        done = True
                        break
                if done:
                    break
    report.quantized = [label[n] for n in names if n not in excluded]
    report.excluded = [label[n] for n in excluded]
    report.final = stats
    report.met = stats[qkey] >= cfg.min_cos
    if not report.met:
        log.warning("int8: %s cosine %.5f < %.5f with %d MatMuls kept in fp32 (the limit)", qkey, stats[qkey], cfg.min_cos, len(excluded))
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
        raise ConfigError(None, None, "quantize", f"must be one of {[q for q in QUANTIZE if q]} or none, got {quantize!r}")
    if quantize == "int8" and not validation_texts:
        raise ConfigError(None, None, "validation_queries", "int8 export needs validation queries to choose which layers to quantize (e.g. a train split)")
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        raise ScalingNoteError(f"ONNX export needs onnx, onnxscript and onnxruntime ({e}); pip install -r requirements.txt") from None
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
            raise ExportRefused(f"the ONNX export does not agree with the tower (max |diff| {diff:.2e} > {atol:g}); nothing was written")
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
                {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "sequence"], "note": "1 = token, 0 = padding"},
            ],
            "outputs": [{"name": OUTPUT_NAME, "dtype": "float32", "shape": ["batch", tower.out_dim], "note": "L2-normalised"}],
            "tokenizer": "tokenizer.json (Hugging Face tokenizers; adds the special tokens the tower uses"
            + (", EOS appended" if tower.kind == "llm" else "") + f"; truncate to {_max_length(tower)} tokens)",
            "matryoshka": f"a prefix of m in {list(tower.config.matryoshka_dims)} dims, re-normalised, is the m-dim embedding",
            "input_text": "query text" if tower.role == "query" else "Document.text (title, topic and content joined by spaces)",
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
    return out


def read_onnx_meta(path: str | os.PathLike) -> dict[str, Any]:
    """``scalingnote_onnx.json`` of an ONNX export directory (clear errors on a bad one)."""
    f = Path(path) / ONNX_META
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f, None, None, f"cannot read ({e.strerror or e}): not an ONNX export of `scalingnote models export --format onnx`") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f, e.lineno, None, f"invalid JSON: {e.msg}") from None
    for key in ("format", "models", "default_model", "tower"):
        if key not in doc:
            raise ConfigError(f, None, key, "missing")
    return doc


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
    return export_onnx(tower_or_path, out, quantize=quantize, validation_texts=validation_texts, validation_name=validation_name, int8=int8)
