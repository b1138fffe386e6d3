"""A tiny quick start (random models, one family, no comparison rows: about a minute on 2 cores),
run as a user runs it: ``scalingnote quickstart`` in its own process, every line it prints kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from scalingnote.models import build_tiny_model

#: QuickstartConfig keys of the tiny run (besides the two tiny models)
TINY: dict[str, Any] = dict(
    llm_depths=[1],
    llm_small_layers=1,
    bert_small_layers=1,
    dim=32,
    synth_docs=120,
    synth_queries=60,
    steps=3,
    batch_size=4,
    qkd_epochs=1.0,
    qkd_batch_size=16,
    qkd_max_pseudo_queries=60,
    semantic_id_layers=2,
    query_max_length=16,
    doc_max_length=64,
    show_progress=False,
    head_lrs=[1e-3],
    compare="none",
    teacher="bert",
)


def tiny_options(root: Path) -> dict[str, Any]:
    """The tiny run's QuickstartConfig keys, with two tiny random models written under ``root``."""
    bert = build_tiny_model(root / "bert", "bert", num_layers=2)
    llm = build_tiny_model(root / "llm", "llm", num_layers=1)
    return {**TINY, "bert": str(bert), "llm": str(llm)}


def run_tiny_quickstart(root: Path) -> tuple[Path, dict[str, Any], str]:
    """``scalingnote quickstart --out <root>/run --set ...`` in a subprocess; returns the output
    directory, the options and everything the command printed (stdout and stderr)."""
    root.mkdir(parents=True, exist_ok=True)
    options = tiny_options(root / "models")
    out = root / "run"
    sets = [a for k, v in options.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[2] / "src"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "scalingnote", "quickstart", "--out", str(out), *sets],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    printed = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"tiny quick start failed ({proc.returncode}):\n{printed[-4000:]}")
    return out, options, printed
