"""The sweep results table: a CSV whose first columns are ``N,D,loss``.

``N`` = non-embedding parameters, ``D`` = training pairs, ``loss`` = contrastive
perplexity on the sweep's fixed validation set. Further columns (layers, steps,
seconds, ...) follow and are carried along untouched. A table that only studies one
axis may omit the other column (``N,loss`` or ``D,loss``).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import DataError, ScalingNoteError
from scalingnote.utils.io import atomic_write

LEAD_COLUMNS = ("N", "D", "loss")


def write_table(path: str | Path, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> Path:
    """Atomically write ``rows`` as CSV with ``N,D,loss`` first, then the other keys in first-seen order."""
    cols = list(LEAD_COLUMNS)
    for c in columns or ():
        if c not in cols:
            cols.append(c)
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as fh:
        w = csv.DictWriter(fh, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})
    return path


def _number(value: str, path: Path, line: int, field: str, positive: bool) -> float:
    try:
        x = float(value)
    except ValueError:
        raise DataError(path, line, field, f"expected a number, got {value!r}") from None
    if not math.isfinite(x):
        raise DataError(path, line, field, f"must be finite, got {value!r}")
    if positive and x <= 0:
        raise DataError(path, line, field, f"must be > 0, got {value!r}")
    return x


def read_table(path: str | Path, required: Sequence[str] = ("loss",)) -> list[dict[str, Any]]:
    """Rows of a results CSV. ``N``, ``D`` (> 0) and ``loss`` (> 0, finite) are parsed as floats
    when present; ``required`` columns must exist. Errors name the file, line and column."""
    path = Path(path)
    try:
        fh = open(path, newline="", encoding="utf-8")
    except OSError as e:
        raise ScalingNoteError(f"{path}: cannot read results table: {e.strerror or e}") from None
    with fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        for col in required:
            if col not in header:
                raise DataError(path, 1, col, f"missing column (header has {header})")
        rows = []
        for rec in reader:
            line = reader.line_num
            row: dict[str, Any] = dict(rec)
            if None in row:
                raise DataError(path, line, None, "more values than header columns")
            for col in ("N", "D", "loss"):
                if col in header:
                    v = rec.get(col)
                    if v is None or v == "":
                        raise DataError(path, line, col, "empty value")
                    row[col] = _number(v, path, line, col, positive=True)
            rows.append(row)
    if not rows:
        raise DataError(path, None, None, "no data rows")
    return rows


def select_rows(
    rows: Sequence[dict[str, Any]], law: str, at: float | None = None
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Rows a one-variable law is fitted on.

    The model-size law L(N) (Fang et al. §4.1) is measured with the most data, the data-size
    law L(D) (§4.2) with the largest model: when the table has several values of the other
    variable, keep the rows where it equals ``at`` (default: its maximum). Returns the
    rows and ``{"D": value}`` / ``{"N": value}`` naming what was held fixed (empty if nothing).
    The joint law uses every row.
    """
    if law == "joint":
        return list(rows), {}
    other = "D" if law == "model" else "N"
    if not rows or other not in rows[0]:
        return list(rows), {}
    values = sorted({r[other] for r in rows})
    if len(values) == 1 and at is None:
        return list(rows), {other: values[0]}
    target = values[-1] if at is None else float(at)
    kept = [r for r in rows if r[other] == target]
    if not kept:
        raise ScalingNoteError(f"no rows with {other} = {at:g} (values: {', '.join(f'{v:g}' for v in values)})")
    return kept, {other: target}


def holdout_mask(
    rows: Sequence[dict[str, Any]],
    by: str,
    largest: int | None = None,
    frac: float | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Boolean mask of held-out rows.

    ``largest=k``: rows whose ``by`` value is among the k largest distinct values (an
    extrapolation test: fit on small models / little data, predict the big ones).
    ``frac=f``: a seeded random fraction of the rows (at least one, never all).
    """
    n = len(rows)
    mask = np.zeros(n, dtype=bool)
    if largest is not None and frac is not None:
        raise ScalingNoteError("give either holdout_largest or holdout_frac, not both")
    if largest is not None:
        if largest < 1:
            raise ScalingNoteError(f"holdout_largest must be >= 1, got {largest}")
        if by not in rows[0]:
            raise ScalingNoteError(f"holdout by {by!r}: the table has no {by} column")
        distinct = sorted({r[by] for r in rows})
        if largest >= len(distinct):
            raise ScalingNoteError(
                f"holdout_largest={largest} would hold out every {by} value ({len(distinct)} distinct)"
            )
        cut = set(distinct[-largest:])
        mask = np.array([r[by] in cut for r in rows])
    elif frac is not None:
        if not 0 < frac < 1:
            raise ScalingNoteError(f"holdout_frac must be in (0, 1), got {frac}")
        k = min(n - 1, max(1, int(round(frac * n))))
        idx = np.random.default_rng(seed).choice(n, size=k, replace=False)
        mask[idx] = True
    return mask


__all__ = ["LEAD_COLUMNS", "holdout_mask", "read_table", "select_rows", "write_table"]
