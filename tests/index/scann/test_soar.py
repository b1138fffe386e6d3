"""``scann_soar`` (ScaNN partition tree + SOAR spilling over AH codes, exact re-rank) as a routed
method: built, searched with the partitions knob, measured, its refusals. Real ScaNN (scann-core)."""

from __future__ import annotations

import numpy as np
import pytest

from scalingnote.errors import ScalingNoteError
from scalingnote.index.routing.routing import RoutedIndex, RoutingConfig
from scalingnote.index.tune import exact_topk, recall_vs_exact

pytest.importorskip("scann", reason="the scann-core package")

N, D = 4000, 64


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    c = rng.standard_normal((40, D)).astype(np.float32)
    x = c[rng.integers(0, 40, N)] + 0.6 * rng.standard_normal((N, D)).astype(np.float32)
    q = 0.3 * c[rng.integers(0, 40, 50)] + rng.standard_normal((50, D)).astype(
        np.float32
    )  # queries off the documents' clusters
    return x / np.linalg.norm(x, axis=1, keepdims=True), q / np.linalg.norm(q, axis=1, keepdims=True)


def test_leaves_knob_spill_and_refine(data):
    x, q = data
    soar = RoutedIndex.build(x, RoutingConfig(method="scann_soar", nlist=64, seed=0))
    plain = RoutedIndex.build(x, RoutingConfig(method="scann_soar", nlist=64, scann_soar_lambda=0.0, seed=0))
    exact = exact_topk(x, q, 10)
    runs = [soar.search(q, 10, nprobe=p) for p in (2, 8, 64)]
    recalls = [recall_vs_exact(r.ids, exact) for r in runs]
    assert recalls[0] < recalls[2] and recalls[0] <= recalls[1], recalls
    assert runs[0].codes < runs[1].codes < runs[2].codes and runs[2].coarse == 64 * len(q)
    assert soar.index.spill > 0.9 and plain.index.spill == 0.0  # one spilled copy a document with SOAR, none without
    assert recall_vs_exact(soar.search(q, 10, nprobe=64, rerank=200).ids, exact) >= 0.99  # every leaf + exact re-rank
    # SOAR: at the same leaves, the spilled assignments find more of the exact top 10
    assert recall_vs_exact(soar.search(q, 10, nprobe=4).ids, exact) > recall_vs_exact(
        plain.search(q, 10, nprobe=4).ids, exact
    )
    ratio = soar.memory_bytes() / (N * D * 4)
    assert 0 < ratio < 0.5 and plain.memory_bytes() < soar.memory_bytes()


def test_refusals_are_clear(data):
    x, q = data
    r = RoutedIndex.build(x[:500], RoutingConfig(method="scann_soar", nlist=8, seed=0))
    with pytest.raises(ScalingNoteError, match="scann_soar: deleting is not supported"):
        r.remove_ids(np.array([1, 2]))
    with pytest.raises(ScalingNoteError, match="scann_dims_per_block must be 1, 2 or 4"):
        RoutedIndex.build(x[:500], RoutingConfig(method="scann_soar", nlist=8, scann_dims_per_block=3))
