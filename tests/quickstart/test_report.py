"""The results table's retention: the student's share of its teacher, with the interval its
validation queries allow."""

from __future__ import annotations

import numpy as np
import pytest

from scalingnote.quickstart import report


def _rows(n: int = 40, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    t = rng.uniform(0.2, 1.0, n)
    s = np.clip(t - rng.normal(0.02, 0.1, n), 0, 1)
    pq = lambda v: {f"q{i}": float(x) for i, x in enumerate(v)}  # noqa: E731
    base = {"ndcg@10": 0.6, "query_qps": 100.0}
    return [
        {**base, "method": "scaling_dual", "chosen": "teacher", "query_tower": "T", "val_ndcg@10": round(t.mean(), 4),
         "_val_pq": pq(t), "_pq": {"a": 0.5, "b": 0.6}},
        {**base, "method": "scalingnote", "chosen": "student", "query_tower": "S", "val_ndcg@10": round(s.mean(), 4),
         "_val_pq": pq(s), "query_qps": 300.0, "_pq": {"a": 0.4, "b": 0.7}},
    ]  # fmt: skip


def test_retention_carries_its_validation_interval():
    rows = _rows()
    kept = report.retention(rows)
    t, s = rows
    assert kept["retention_val"] == pytest.approx(s["val_ndcg@10"] / t["val_ndcg@10"], abs=1e-4)
    assert kept["retention_val_low"] < kept["retention_val"] < kept["retention_val_high"]
    assert kept["val_queries"] == 40 and s["retention_val_high"] == kept["retention_val_high"]
    text = report.retention_text(kept)
    assert f"95% interval {100 * kept['retention_val_low']:.1f}%-{100 * kept['retention_val_high']:.1f}%" in text
    assert "over 40 queries" in text
    # the per-query scores are the table's working state: never written out
    report.vs_best_baseline(rows)
    assert all("_val_pq" not in r and "_pq" not in r for r in rows)


def test_retention_without_per_query_validation_has_no_interval():
    rows = _rows()
    for r in rows:
        r.pop("_val_pq")
    kept = report.retention(rows)
    assert kept["retention_val"] is not None and kept["retention_val_low"] is None
    assert "interval" not in report.retention_text(kept)
    rows = _rows()
    rows[1]["_val_pq"].pop("q0")  # not the same queries: no paired interval
    kept = report.retention(rows)
    assert kept["retention_val_low"] is None and "no interval over 39 queries" in report.retention_text(kept)
