"""Measure the false-negative guard (:mod:`scalingnote.training.guard`) on judged data.

For the training queries with several judged positives, a seeded fraction of their positives is
hidden from the known-positive filter (each such query keeps at least one labelled positive); the
windows are mined as training would mine them; :func:`~scalingnote.training.guard.guard_counts`
then counts the hidden positives the unguarded window offers as negatives, those the guard
removes, and the true negatives (documents judged for no grade > 0) it removes too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.data import Document
from scalingnote.training.config import DataSpec
from scalingnote.training.guard import guard_counts
from scalingnote.training.mining import mine_windows


def hide_positives(
    positives: Mapping[str, Sequence[str]], fraction: float, seed: int
) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """(known positives, hidden positives): for every query with >= 2 positives, hide
    ``round(fraction * n)`` of them (at least 1, at most n - 1), chosen with a seeded draw."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    rng = np.random.default_rng(seed)
    known: dict[str, list[str]] = {}
    hidden: dict[str, set[str]] = {}
    for qid in sorted(positives):
        pos = sorted(positives[qid])
        if len(pos) < 2:
            continue
        k = min(len(pos) - 1, max(1, int(round(fraction * len(pos)))))
        gone = set(rng.choice(pos, size=k, replace=False).tolist())
        known[qid] = [p for p in pos if p not in gone]
        hidden[qid] = gone
    return known, hidden


def measure_guard(
    spec: DataSpec,
    corpus: Mapping[str, Document],
    queries: Mapping[str, str],
    positives: Mapping[str, Sequence[str]],
    qt,
    dt,
    *,
    fraction: float = 0.5,
    seed: int = 0,
    show_progress: bool = False,
    tower_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Hide ``fraction`` of the positives of multi-positive queries, mine with ``spec`` (its guard),
    and count (see :func:`~scalingnote.training.guard.guard_counts`). ``spec.mining.guard`` empty
    measures the unguarded window alone. ``tower_dir``: the towers' Stage I run (its stored corpus
    embeddings are used, see :func:`~scalingnote.training.mining.stored_doc_embeddings`)."""
    known, hidden = hide_positives(positives, fraction, seed)
    if not known:
        return {"queries_measured": 0}
    mined, seconds, source = mine_windows(spec, corpus, queries, known, qt, dt, show_progress, tower_dir)
    out = guard_counts(mined, hidden, {q: set(p) for q, p in positives.items()})
    return {
        "queries_measured": len(known),
        "guard": list(spec.mining.guard),
        "mining_seconds": round(seconds, 2),
        "document_embeddings": source,
        **out,
    }


__all__ = ["hide_positives", "measure_guard"]
