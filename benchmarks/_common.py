"""Shared helper for benchmark scripts: one results-file format for all of them.

``benchmarks/results/<name>.json`` = {"rows": [...], "config": {...},
"versions": {...}, "machine": "...", "created": "..."}.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from scalingnote.utils import run_metadata, write_json

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    """``../shared/data`` beside the repository (override with SCALINGNOTE_SHARED_DATA)."""
    env = os.environ.get("SCALINGNOTE_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def write_results(name: str, rows: list[dict[str, Any]], config: dict[str, Any] | None = None) -> Path:
    """Atomically write ``benchmarks/results/<name>.json`` and return its path."""
    for r in rows:
        for k, v in r.items():
            if isinstance(v, (dict, list)):
                raise ValueError(f"results rows must be flat: key {k!r} holds a {type(v).__name__}")
    meta = run_metadata(config or {})
    out = {"rows": rows, "config": meta["config"], "versions": meta["versions"], "machine": meta["machine"], "created": meta["created"]}
    path = RESULTS_DIR / f"{name}.json"
    write_json(path, out)
    return path
