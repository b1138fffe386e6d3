"""Loading backbones from local disk: Hugging Face directories, GGUF files, packaged models.

Everything is loaded with ``local_files_only=True``: nothing is ever downloaded.

GGUF files are parsed and de-quantized by transformers (``gguf_file=``), which takes
~25 s for SmolLM2-135M, so a GGUF file is converted **once** into a plain safetensors
Hugging Face directory in the model cache and reloaded from there afterwards
(:func:`convert_gguf`). The cache directory is

``cache_dir`` argument  >  ``$SCALINGNOTE_CACHE/models``  >  ``~/.cache/scalingnote/models``

and each converted model lives in ``<cache>/<stem>-<sha256 of the file, 16 hex>/``,
written into a temporary directory and renamed into place, so a crash never leaves a
half-written cache entry.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scalingnote.errors import ConfigError
from scalingnote.models._fs import atomic_dir
from scalingnote.models.layers import check_layer_list, is_bottom, select_layers
from scalingnote.models.layers import layer_list as _layer_list
from scalingnote.models.registry import canonical_name, packaged_model_path
from scalingnote.models.st_import import declared_pooling

log = logging.getLogger("scalingnote.models")

#: Marker written last into a converted cache entry; its presence means "complete".
CACHE_MARKER = "scalingnote_cache.json"
#: File that identifies a saved tower directory (see :mod:`scalingnote.models.towers`).
TOWER_FILE = "tower.json"

KINDS = ("llm", "bert")


# ----------------------------------------------------------------------------- helpers


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """fp32 on CPU, bf16 on GPU."""
    dev = torch.device(device) if device is not None else default_device()
    return torch.bfloat16 if dev.type == "cuda" else torch.float32


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def parse_dtype(dtype: torch.dtype | str | None, device: torch.device | str | None = None) -> torch.dtype:
    """``None`` -> :func:`default_dtype`; accepts torch dtypes and names like ``"bf16"``."""
    if dtype is None:
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().replace("torch.", "")
    if key not in _DTYPES:
        raise ConfigError(None, None, "dtype", f"unknown dtype {dtype!r} (use one of {sorted(_DTYPES)})")
    return _DTYPES[key]


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' per-load progress bars and load reports (we check loading info ourselves)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def count_non_embedding_params(model: nn.Module) -> int:
    """Number of parameters excluding token/position/type embedding matrices.

    The scaling-laws paper (and Kaplan et al.) define model size N as the number of
    non-embedding parameters. Every ``nn.Embedding`` (token, absolute position,
    token-type) and the model's output embedding (an untied LM head) are excluded;
    everything else (attention, MLP, norms, projection heads) is counted. Tied
    parameters are counted once.
    """
    excluded: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, nn.Embedding):
            excluded.update(id(p) for p in mod.parameters(recurse=False))
    get_out = getattr(model, "get_output_embeddings", None)
    if callable(get_out):
        with contextlib.suppress(Exception):
            out = get_out()
            if out is not None:
                excluded.update(id(p) for p in out.parameters(recurse=False))
    return sum(p.numel() for p in model.parameters() if id(p) not in excluded)


# ----------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from.

    ``form`` is ``"gguf"`` (a .gguf file), ``"hf"`` (a Hugging Face directory),
    ``"tower"`` (a directory written by :meth:`Tower.save`) or ``"tower_backbone"`` (the backbone of a
    saved tower that stores only its trained parts: ``<tower>/backbone``; ``path`` is the tower).
    """

    form: str
    path: Path
    name: str  #: what the user passed (packaged name or path), recorded in tower configs


def resolve_source(name_or_path: str | os.PathLike) -> ModelSource:
    """Classify ``name_or_path``: packaged model name, .gguf file, HF directory or saved tower."""
    raw = os.fspath(name_or_path)
    p = Path(raw).expanduser()
    if not p.exists() and p.name == "backbone" and (p.parent / TOWER_FILE).is_file():
        # the backbone of a saved tower that stores only what it trained (it has no backbone/ directory)
        return ModelSource("tower_backbone", p.parent.resolve(), raw)
    if not p.exists():
        canon = canonical_name(raw)
        if canon is not None:
            p = packaged_model_path(canon)
            raw = canon
        else:
            raise ConfigError(
                raw, None, "model", "no such file or directory, and not a packaged model name (smollm2-135m, minilm-l6)"
            )
    if p.is_file():
        if p.suffix.lower() == ".gguf":
            return ModelSource("gguf", p.resolve(), raw)
        raise ConfigError(
            p, None, "model", "a model file must be a .gguf file; otherwise pass a Hugging Face directory"
        )
    if (p / TOWER_FILE).is_file():
        return ModelSource("tower", p.resolve(), raw)
    if (p / "config.json").is_file():
        return ModelSource("hf", p.resolve(), raw)
    ggufs = sorted(p.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource("gguf", ggufs[0].resolve(), raw)
    hint = f" (it holds {len(ggufs)} .gguf files: pass one of them)" if ggufs else ""
    raise ConfigError(p, None, "model", f"not a Hugging Face model directory: no config.json{hint}")


# ----------------------------------------------------------------------------- GGUF cache


def model_cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` > ``$SCALINGNOTE_CACHE/models`` > ``~/.cache/scalingnote/models``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SCALINGNOTE_CACHE")
    if env:
        return Path(env).expanduser() / "models"
    return Path.home() / ".cache" / "scalingnote" / "models"


_SHA_MEMO: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's content (memoised per path, size and mtime within the process)."""
    st = path.stat()
    memo_key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo_key not in _SHA_MEMO:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        _SHA_MEMO[memo_key] = h.hexdigest()
    return _SHA_MEMO[memo_key]


def gguf_cache_key(gguf_path: str | os.PathLike) -> str:
    """Cache entry name for a GGUF file: ``<stem>-<first 16 hex of its SHA-256>``."""
    p = Path(gguf_path)
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in p.stem)
    return f"{stem}-{file_sha256(p)[:16]}"


def cached_gguf_dir(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The converted directory for ``gguf_path`` if it is already in the cache, else None."""
    target = model_cache_root(cache_dir) / gguf_cache_key(gguf_path)
    return target if (target / CACHE_MARKER).is_file() else None


def convert_gguf(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Convert a GGUF file once into a de-quantized safetensors HF directory in the cache.

    Returns the cache directory (``config.json``, ``model.safetensors``, tokenizer files and
    the :data:`CACHE_MARKER`). An existing complete entry is reused unless ``force``.
    The conversion is written to a temporary directory and renamed into place.
    """
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import GgufConfig

    src = Path(gguf_path).expanduser().resolve()
    if not src.is_file():
        raise ConfigError(src, None, "model", "GGUF file not found")
    target = model_cache_root(cache_dir) / gguf_cache_key(src)
    if not force and (target / CACHE_MARKER).is_file():
        return target
    if target.exists() and not (target / CACHE_MARKER).is_file():
        force = True  # incomplete entry from an older, non-atomic writer: replace it
    log.info("converting %s to safetensors in %s (once; GGUF parsing is slow)", src, target)
    t0 = time.perf_counter()
    kw: dict[str, Any] = {"gguf_file": src.name, "local_files_only": True}
    with atomic_dir(target, replace=force) as tmp, quiet_transformers():
        try:
            tok = AutoTokenizer.from_pretrained(src.parent, **kw)
        except Exception as e:  # report which file failed, not a library traceback
            raise ConfigError(src, None, "tokenizer", f"cannot build a tokenizer from this GGUF file: {e}") from e
        model = None
        errors = []
        for cls in (AutoModelForCausalLM, AutoModel):
            try:
                model = cls.from_pretrained(
                    src.parent, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True), **kw
                )
                break
            except Exception as e:  # noqa: BLE001
                errors.append(f"{cls.__name__}: {e}")
        if model is None:
            raise ConfigError(src, None, "model", "cannot load this GGUF file: " + " | ".join(errors))
        packed = [n for n, m in model.named_modules() if type(m).__name__.lower().startswith("gguf")]
        if packed:
            raise ConfigError(src, None, "model", f"weights stayed GGUF-packed after de-quantization: {packed[:3]}")
        # The de-quantized model is a plain dense model: drop the GGUF quantizer so it can be saved.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        marker = {
            "source": str(src),
            "source_sha256": file_sha256(src),
            "source_bytes": src.stat().st_size,
            "model_class": type(model).__name__,
            "convert_s": round(time.perf_counter() - t0, 2),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        with contextlib.suppress(Exception):
            import transformers

            marker["transformers"] = transformers.__version__
        (tmp / CACHE_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        del model
    return target


# ----------------------------------------------------------------------------- backbones


@dataclass
class Backbone:
    """A loaded base model (no LM head) with its tokenizer.

    ``model`` is the bare transformer returning ``last_hidden_state`` (``AutoModel``),
    in fp32 on CPU, in eval mode.
    """

    model: Any
    tokenizer: Any
    kind: str  #: "llm" or "bert"
    source: ModelSource
    hf_dir: Path  #: the HF directory actually read (the cache entry for GGUF sources)
    base_num_layers: int  #: layers in the checkpoint before truncation
    kept_layers: list[int] | None = None  #: the checkpoint's layers kept, in order (None = the first ``num_layers``)
    native_pooling: str | None = None  #: the sentence-transformers pooling mode the directory declares (``1_Pooling``)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)


def detect_kind(config: Any) -> str:
    """``"bert"`` for bidirectional encoders (masked-LM families), ``"llm"`` for decoder-only models."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    mt = getattr(config, "model_type", None)
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(None, None, "model", f"encoder-decoder models ({mt}) are not supported as towers")
    if mt in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        return "bert"
    if mt in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "llm"
    raise ConfigError(None, None, "model", f"cannot tell whether model_type {mt!r} is a decoder LLM or a BERT encoder")


def truncate_layers(model: nn.Module, num_layers: int) -> nn.Module:
    """Keep the first ``num_layers`` transformer layers of a loaded model (in place)."""
    layers = _layer_list(model)
    if not 1 <= num_layers <= len(layers):
        raise ConfigError(None, None, "num_layers", f"must be in 1..{len(layers)}, got {num_layers}")
    del layers[num_layers:]
    _truncate_config(model.config, num_layers)
    return model


def _truncate_config(config: Any, num_layers: int) -> None:
    config.num_hidden_layers = num_layers
    lt = getattr(config, "layer_types", None)
    if isinstance(lt, (list, tuple)) and len(lt) > num_layers:
        config.layer_types = list(lt[:num_layers])


_TRUNCATED_KEY_PARTS = ("layers.", "layer.", "h.")


def _benign_unexpected(key: str, num_layers: int | None) -> bool:
    """Checkpoint keys we expect to ignore: LM/MLM heads, BERT pooler, truncated layers."""
    head = key.split(".", 1)[0]
    if head in {"lm_head", "cls", "pooler", "qa_outputs", "classifier", "score"} or ".pooler." in key:
        return True
    if num_layers is not None:
        for part in _TRUNCATED_KEY_PARTS:
            idx = key.find(part)
            if idx == 0 or (idx > 0 and key[idx - 1] == "."):
                rest = key[idx + len(part) :].split(".", 1)[0]
                if rest.isdigit() and int(rest) >= num_layers:
                    return True
    return False


def load_hf_backbone(
    hf_dir: str | os.PathLike,
    *,
    num_layers: int | None = None,
    kind: str | None = None,
    source: ModelSource | None = None,
    layers: Sequence[int] | None = None,
) -> Backbone:
    """Load a Hugging Face directory as a bare fp32 CPU backbone + tokenizer (offline).

    ``num_layers`` truncates the model to its first N layers before the weights are
    loaded (the config's ``num_hidden_layers`` is fixed, so only N layers are built);
    ``layers`` keeps those layers instead (:func:`select_layers`; ``num_layers``, when also
    given, must be their count).
    Missing weights are an error (they would be silently random); checkpoint heads and
    truncated layers are ignored.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    hf_dir = Path(hf_dir)
    with quiet_transformers():
        try:
            config = AutoConfig.from_pretrained(hf_dir, local_files_only=True)
        except Exception as e:
            raise ConfigError(hf_dir / "config.json", None, "config", f"cannot read model config: {e}") from e
        detected = detect_kind(config)
        if kind is not None and kind != detected:
            raise ConfigError(hf_dir / "config.json", None, "model_type", f"is a {detected} model, not {kind}")
        base_layers = int(config.num_hidden_layers)
        if layers is not None:
            layers = check_layer_list(list(layers), base_layers, hf_dir)
            if num_layers is not None and num_layers != len(layers):
                raise ConfigError(
                    hf_dir, None, "num_layers", f"is {num_layers}, but layers {layers} lists {len(layers)}"
                )
            num_layers = layers[-1] + 1  # built up to the last layer kept
            layers = None if is_bottom(layers) else layers  # the bottom ones: plain truncation
        if num_layers is not None:
            if not isinstance(num_layers, int) or not 1 <= num_layers <= base_layers:
                raise ConfigError(
                    hf_dir, None, "num_layers", f"must be an integer in 1..{base_layers}, got {num_layers!r}"
                )
            _truncate_config(config, num_layers)
        model_kwargs: dict[str, Any] = {}
        if detected == "bert" and config.model_type in {"bert", "roberta", "xlm-roberta", "camembert"}:
            model_kwargs["add_pooling_layer"] = False
        try:
            model, info = AutoModel.from_pretrained(
                hf_dir,
                config=config,
                dtype=torch.float32,
                local_files_only=True,
                output_loading_info=True,
                **model_kwargs,
            )
        except Exception as e:
            raise ConfigError(hf_dir, None, "model", f"cannot load model weights: {e}") from e
        try:
            tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
        except Exception as e:
            raise ConfigError(hf_dir, None, "tokenizer", f"cannot load tokenizer: {e}") from e
    missing = [k for k in info.get("missing_keys", []) if not k.startswith("pooler.")]
    if missing:
        raise ConfigError(
            hf_dir, None, "weights", f"checkpoint lacks {len(missing)} weights, e.g. {sorted(missing)[:5]}"
        )
    unexpected = [k for k in info.get("unexpected_keys", []) if not _benign_unexpected(k, num_layers)]
    if unexpected:
        log.warning("%s: ignoring %d unexpected weights, e.g. %s", hf_dir, len(unexpected), sorted(unexpected)[:5])
    if getattr(model, "pooler", None) is not None:
        model.pooler = None  # towers pool themselves; an unused pooler would only add weights
    if num_layers is not None and len(_layer_list(model)) != num_layers:
        truncate_layers(model, num_layers)
    if layers is not None:
        select_layers(model, layers)
    model.eval()
    return Backbone(
        model=model,
        tokenizer=tokenizer,
        kind=detected,
        source=source or ModelSource("hf", hf_dir.resolve(), str(hf_dir)),
        hf_dir=hf_dir,
        base_num_layers=base_layers,
        native_pooling=declared_pooling(hf_dir),
        kept_layers=layers,
    )


def load_backbone(
    name_or_path: str | os.PathLike,
    *,
    num_layers: int | None = None,
    kind: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    layers: Sequence[int] | None = None,
) -> Backbone:
    """Load a packaged model name, HF directory or .gguf file as a bare fp32 CPU backbone
    (``num_layers`` / ``layers``: :func:`load_hf_backbone`).

    GGUF files go through the conversion cache (:func:`convert_gguf`).
    """
    src = resolve_source(name_or_path)
    if src.form == "tower":
        raise ConfigError(src.path, None, "model", "is a saved tower directory: use scalingnote.models.load_tower")
    if src.form == "tower_backbone":
        raise ConfigError(
            src.path,
            None,
            "model",
            "stores only what it trained over its base: load its backbone with "
            "scalingnote.models.load_tower(<tower>/backbone, ...) (scalingnote.models.towers.store.load_base)",
        )
    hf_dir = convert_gguf(src.path, cache_dir=cache_dir) if src.form == "gguf" else src.path
    return load_hf_backbone(hf_dir, num_layers=num_layers, kind=kind, source=src, layers=layers)
