"""Query encoding with ONNX Runtime for the service (``scalingnote serve --query-backend onnx``).

ScalingNote's premise is the online cost of the query tower (§3.3, Table 6). Eager PyTorch
in fp32 runs MiniLM near the fp32 compute roof of a small CPU; ONNX Runtime's fused
kernels, and int8 MatMuls on CPUs with VNNI, are the next factor
(``benchmarks/results/export.json``).

:class:`OnnxQueryTower` stands in for the torch :class:`~scalingnote.models.QueryTower` in
the service: tokenization, identity (``fingerprint``, ``compat_id``, ``config``) and the
index compatibility check come from the torch tower, ``encode_queries`` runs the exported
graph (``scalingnote models export --format onnx``). An export made from a different tower
(another fingerprint) is refused. Without an export directory, the fp32 graph is exported
once into the cache (``~/.cache/scalingnote/onnx/<fingerprint>``); an int8 model needs
validation queries to choose its layers, so it comes only from an export directory.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ConfigError, ScalingNoteError
from scalingnote.models.export import ONNX_META, export_onnx, ort_session, read_onnx_meta
from scalingnote.models.loading import model_cache_root

log = logging.getLogger("scalingnote.serve")

QUERY_BACKENDS = ("torch", "onnx")
#: ONNX Runtime intra-op threads when none is set: one per core of the 2-core development
#: machine (capped at the core count). ``benchmarks/export.py`` measures 1 vs 2 threads
#: (``config.ort_threads_sweep``) to confirm it; that run had not completed when this default
#: was set (the shared CPU was saturated), so it is not yet a measured value.
DEFAULT_ORT_THREADS = 2


def default_ort_threads() -> int:
    return max(1, min(DEFAULT_ORT_THREADS, os.cpu_count() or 1))


class OnnxQueryTower:
    """A query tower whose ``encode_queries`` runs an exported ONNX graph (see the module docstring)."""

    def __init__(
        self, tower: Any, export_dir: str | os.PathLike, *, model: str | None = None, threads: int | None = None
    ):
        if getattr(tower, "role", None) != "query":
            raise ScalingNoteError("the ONNX query backend needs a query tower")
        self.tower = tower
        self.export_dir = Path(export_dir)
        meta = read_onnx_meta(self.export_dir)
        want, have = str(tower.fingerprint), str(meta["tower"].get("fingerprint"))
        if want != have:
            raise ConfigError(
                self.export_dir / "scalingnote_onnx.json",
                None,
                "tower.fingerprint",
                f"{have}: exported from another tower than the query tower being served ({want}); export this tower "
                "again",
            )
        models = meta["models"]
        name = model or meta["default_model"]
        if name in models:  # "fp32" / "int8"
            name = models[name]
        if name not in models.values():
            raise ConfigError(
                self.export_dir / "scalingnote_onnx.json", None, "models", f"no model {model!r} (have {sorted(models)})"
            )
        self.model_file = name
        self.precision = next(k for k, v in models.items() if v == name)
        self.threads = int(threads) if threads else default_ort_threads()
        self.session = ort_session(self.export_dir / name, self.threads)
        self.out_dim_onnx = int(self.session.get_outputs()[0].shape[-1])

    def __getattr__(self, name: str) -> Any:  # identity, config, tokenizer... from the torch tower
        if name == "tower":
            raise AttributeError(name)
        return getattr(self.tower, name)

    def encode_queries(
        self,
        texts: list[str],
        *,
        batch_size: int = 64,
        dim: int | None = None,
        normalize: bool = True,
        show_progress: bool = False,
        max_length: int | None = None,
    ) -> np.ndarray:
        """float32 ``[N, dim]`` L2-normalised embeddings (like ``QueryTower.encode_queries``).

        The graph returns unit vectors, so ``normalize=False`` gives the prefix of the unit
        full-size embedding (same direction as the torch tower's, not the same norm).
        """
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        tower = self.tower
        d = tower.out_dim if dim is None else int(dim)
        if not 1 <= d <= tower.out_dim:
            raise ValueError(f"dim must be in 1..{tower.out_dim}, got {dim}")
        seqs = tower.query_ids(texts, max_length)
        n = len(seqs)
        out = np.zeros((n, d), dtype=np.float32)
        order = sorted(range(n), key=lambda i: (-len(seqs[i]), i))
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            ids, mask, _ = tower._pad([seqs[i] for i in idx])
            y = self.session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0][:, :d]
            if normalize and d != self.out_dim_onnx:
                y = y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
            out[idx] = y
        return out


def onnx_cache_dir(tower: Any, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the fp32 export of ``tower`` is cached (keyed by its fingerprint)."""
    root = Path(cache_dir) if cache_dir is not None else model_cache_root().parent / "onnx"
    return root / str(tower.fingerprint)


def onnx_query_tower(
    tower: Any,
    export_dir: str | os.PathLike | None = None,
    *,
    model: str | None = None,
    threads: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> OnnxQueryTower:
    """Wrap ``tower`` with ONNX Runtime; exports (fp32) into the cache when ``export_dir`` is None."""
    if export_dir is None:
        export_dir = onnx_cache_dir(tower, cache_dir)
        if not (Path(export_dir) / ONNX_META).is_file():
            log.info("exporting the query tower to ONNX (fp32) once into %s", export_dir)
            export_onnx(tower, export_dir)
    return OnnxQueryTower(tower, export_dir, model=model, threads=threads)


def wrap_query_tower(tower: Any, settings: Any) -> Any:
    """The service's query encoder for ``settings.query_backend`` (the torch tower itself for "torch")."""
    backend = getattr(settings, "query_backend", "torch")
    if backend == "torch":
        return tower
    if backend != "onnx":
        raise ConfigError(None, None, "query_backend", f"must be one of {QUERY_BACKENDS}, got {backend!r}")
    return onnx_query_tower(
        tower, getattr(settings, "onnx_model", None), threads=getattr(settings, "onnx_threads", None)
    )
