"""Export to sentence-transformers and ONNX: the exported artefacts embed like the tower."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("sentence_transformers")
pytest.importorskip("onnxruntime")

from scalingnote.models import load_tower
from scalingnote.models.export import (
    ONNX_INT8,
    ONNX_META,
    ExportRefused,
    Int8Config,
    export_onnx,
    export_sentence_transformers,
    ort_session,
)

_EN = [
    "what causes bone fractures in older adults",
    "vitamin d deficiency and the risk of fractures",
    "dense retrieval maps queries and documents into one space",
    "the quick brown fox jumps over the lazy dog",
    "does aspirin reduce the risk of heart attack",
    "product quantization compresses embeddings into short codes",
    "how long does a cold last in children",
    "scaling laws relate model size, data size and quality",
    "COVID-19 vaccine efficacy (BA.2) in a 2022 cohort",
    "0.5 mg/kg every 8 hours: dosing rules",
]
_ZH = [
    "糖尿病患者可以吃什么水果",
    "高血压 头晕 怎么办",
    "儿童发烧38.5度需要去医院吗",
    "感冒了 吃 阿莫西林 有用吗",
    "慢性胃炎的症状有哪些",
    "孕妇可以喝咖啡吗",
    "失眠 多梦 中药调理",
    "颈椎病 手麻 如何治疗",
    "小孩 咳嗽 有痰 吃什么药",
    "乙肝 疫苗 打 几针",
]


def mixed_texts(n: int = 50) -> list[str]:
    """``n`` English, Chinese and mixed texts (short, long, over the query length)."""
    out = []
    for i in range(n):
        en, zh = _EN[i % len(_EN)], _ZH[(i * 3) % len(_ZH)]
        kind = i % 5
        out.append([en, zh, f"{en} {zh}", f"{zh}，{en}？", " ".join([en] * (20 + i))][kind])
    return out


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _with_head(tower, seed: int = 0):
    """A trained-looking head: the projection plus a non-zero centre (exported as the Dense bias)."""
    g = torch.Generator().manual_seed(seed)
    tower.set_center(torch.randn(tower.config.hidden_size, generator=g) * 0.2)
    tower.refresh_fingerprint()
    return tower


def _st_embed(path, texts):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(path), device="cpu", local_files_only=True)
    return st.encode(texts, batch_size=16, convert_to_numpy=True, show_progress_bar=False)


def _onnx_embed(path, tower, texts, model="model.onnx"):
    sess = ort_session(path / model, threads=1)
    out = []
    for t in texts:  # one text per call: no padding effects at all
        b = tower.tokenize_queries([t]) if tower.role == "query" else None
        if b is None:
            from scalingnote.data import Document

            b = tower.tokenize_documents([Document(id="x", content=t)])
        out.append(
            sess.run(None, {"input_ids": b["input_ids"].numpy(), "attention_mask": b["attention_mask"].numpy()})[0][0]
        )
    return np.stack(out)


def _tower_embed(tower, texts):
    if tower.role == "query":
        return tower.encode_queries(texts, show_progress=False)
    from scalingnote.data import Document

    return tower.encode_documents([Document(id=str(i), content=t) for i, t in enumerate(texts)], show_progress=False)


@pytest.mark.parametrize(
    "arch,role,pooling,dim",
    [
        ("bert", "query", "mean", 16),
        ("bert", "query", "cls", None),
        ("bert", "document", "mean", 16),
        ("llama", "query", "last", 16),
        ("qwen2", "query", "mean", None),
    ],
)
def test_sentence_transformers_export_matches_tower(tiny_dirs, tmp_path, arch, role, pooling, dim):
    tower = load_tower(
        tiny_dirs[arch], role=role, pooling=pooling, dim=dim, max_query_length=24, device="cpu", dtype="float32"
    )
    if dim is not None:
        _with_head(tower)
    out = export_sentence_transformers(tower, tmp_path / "st")
    mods = [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())]
    assert mods == ["Transformer", "Pooling"] + (["Dense"] if dim else []) + ["Normalize"]
    prompts = json.loads((out / "config_sentence_transformers.json").read_text())["prompts"]
    assert prompts == {"query": "", "document": ""}
    texts = mixed_texts(50)
    cos = _cos(_st_embed(out, texts), _tower_embed(tower, texts))
    assert cos.min() >= 0.99999, (cos.min(), texts[int(cos.argmin())])
    meta = json.loads((out / "scalingnote_export.json").read_text())
    assert meta["tower"]["fingerprint"] == tower.fingerprint


def test_llm_document_tower_is_refused_with_the_reason(tiny_dirs, tmp_path):
    tower = load_tower(tiny_dirs["llama"], role="document", device="cpu", dtype="float32")
    for fn in (export_sentence_transformers, export_onnx):
        with pytest.raises(ExportRefused) as e:
            fn(tower, tmp_path / "out")
        msg = str(e.value)
        assert "placeholder" in msg and "[EMB]" in msg and "instead" in msg
        assert not (tmp_path / "out").exists()  # nothing half-written


def test_export_refuses_to_overwrite_a_foreign_directory(tiny_dirs, tmp_path):
    from scalingnote.errors import ConfigError

    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    tower = load_tower(tiny_dirs["bert"], role="query", device="cpu", dtype="float32")
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        export_sentence_transformers(tower, tmp_path / "precious")
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("arch,pooling", [("bert", "mean"), ("bert", "cls"), ("llama", "last"), ("qwen2", "mean")])
def test_onnx_fp32_agrees_with_the_tower(tiny_dirs, tmp_path, arch, pooling):
    tower = _with_head(
        load_tower(
            tiny_dirs[arch], role="query", pooling=pooling, dim=16, max_query_length=24, device="cpu", dtype="float32"
        )
    )
    out = export_onnx(tower, tmp_path / "onnx")
    meta = json.loads((out / ONNX_META).read_text())
    assert [i["name"] for i in meta["inputs"]] == ["input_ids", "attention_mask"]
    assert meta["outputs"][0]["name"] == "sentence_embedding" and meta["outputs"][0]["shape"] == ["batch", 16]
    texts = mixed_texts(50)
    ref = _tower_embed(tower, texts)
    got = _onnx_embed(out, tower, texts)
    assert np.abs(got - ref).max() <= 1e-4
    # padded batches too (the service encodes many queries per call)
    from scalingnote.models.export import onnx_embed

    assert np.abs(onnx_embed(ort_session(out / "model.onnx"), tower, texts, batch_size=16) - ref).max() <= 1e-4
    # the exported tokenizer (tokenizer.json, for other languages) gives the tower's ids
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(out / "tokenizer.json"))
    tk.enable_truncation(24)
    assert [tk.encode(t).ids for t in texts] == tower.query_ids(texts)


def test_int8_layer_choice_runs_on_validation_texts_only(tiny_dirs, tmp_path):
    tower = load_tower(tiny_dirs["bert"], role="query", dim=16, device="cpu", dtype="float32")
    val = mixed_texts(30)
    # an unreachable target: the search keeps the most sensitive MatMuls in fp32 up to the limit, and says so
    out = export_onnx(
        tower,
        tmp_path / "onnx",
        quantize="int8",
        validation_texts=val,
        int8=Int8Config(min_cos=1.0, max_excluded=2, sensitivity_texts=10),
    )
    meta = json.loads((out / ONNX_META).read_text())
    rep = meta["int8"]["report"]
    assert meta["default_model"] == ONNX_INT8 and (out / ONNX_INT8).is_file()
    assert rep["n_validation"] == 30 and rep["met"] is False
    assert len(rep["excluded"]) == 2 and len([s for s in rep["steps"] if "kept_fp32" in s]) == 2
    assert "group_sensitivity" in rep["steps"][1]  # kinds of MatMul ranked before single layers
    assert all(x not in rep["quantized"] for x in rep["excluded"])
    # a reachable one stops early
    out2 = export_onnx(tower, tmp_path / "onnx2", quantize="int8", validation_texts=val, int8=Int8Config(min_cos=0.0))
    rep2 = json.loads((out2 / ONNX_META).read_text())["int8"]["report"]
    assert rep2["met"] is True and rep2["excluded"] == []
    got = _onnx_embed(out2, tower, val[:10], model=ONNX_INT8)
    assert got.shape == (10, 16) and np.isfinite(got).all()


def test_int8_without_validation_queries_is_refused(tiny_dirs, tmp_path):
    from scalingnote.errors import ConfigError

    tower = load_tower(tiny_dirs["bert"], role="query", device="cpu", dtype="float32")
    with pytest.raises(ConfigError, match="validation"):
        export_onnx(tower, tmp_path / "o", quantize="int8")


def test_cli_models_export(tiny_dirs, tmp_path):
    from typer.testing import CliRunner

    from scalingnote.cli import app

    tower = load_tower(tiny_dirs["bert"], role="query", dim=16, device="cpu", dtype="float32")
    tower.save(tmp_path / "tower")
    r = CliRunner().invoke(
        app,
        [
            "models",
            "export",
            str(tmp_path / "tower"),
            "--format",
            "sentence-transformers",
            "--out",
            str(tmp_path / "st"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "st" / "modules.json").is_file()
    r = CliRunner().invoke(
        app,
        [
            "models",
            "export",
            str(tmp_path / "tower"),
            "--format",
            "onnx",
            "--quantize",
            "int8",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    # user errors reach scalingnote.cli.main as ScalingNoteError (printed there as one line)
    assert r.exit_code != 0 and "validation" in str(r.exception)
    r = CliRunner().invoke(
        app, ["models", "export", str(tmp_path / "tower"), "--format", "parquet", "--out", str(tmp_path / "x")]
    )
    assert r.exit_code != 0 and "format" in str(r.exception)


@pytest.mark.real_model
def test_real_minilm_exports_match(tmp_path):
    try:
        tower = load_tower("minilm-l6", role="query", dim=128, device="cpu", dtype="float32")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"packaged MiniLM not installed: {e}")
    _with_head(tower)
    texts = mixed_texts(50)
    ref = _tower_embed(tower, texts)
    st = export_sentence_transformers(tower, tmp_path / "st")
    cos = _cos(_st_embed(st, texts), ref)
    assert cos.min() >= 0.99999, cos.min()
    ox = export_onnx(tower, tmp_path / "onnx")
    from scalingnote.models.export import onnx_embed

    assert np.abs(onnx_embed(ort_session(ox / "model.onnx"), tower, texts, batch_size=16) - ref).max() <= 1e-4
