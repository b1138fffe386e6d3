"""Read a run's TensorBoard event files back with TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path

import pytest


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every scalar under ``log_dir`` (one TensorBoard run),
    as TensorBoard shows them (events purged by a resumed run left out)."""
    acc = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="tensorboard is not installed (pinned in requirements.lock; bash scripts/setup.sh installs it)",
    )
    ea = acc.EventAccumulator(str(log_dir), size_guidance={acc.SCALARS: 0})  # 0: keep every event
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def steps(curve: list[tuple[int, float]]) -> list[int]:
    return [s for s, _ in curve]
