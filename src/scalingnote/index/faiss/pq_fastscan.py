"""``ivf_pqfs``: FAISS IVF with 4-bit product-quantisation codes scanned by FastScan
(``IndexIVFPQFastScan``, factory ``IVF<n>,PQ<m>x4fs``), re-ranked exactly over the full-precision
vectors (the refine step).

Why it is here beside ``ivf`` (8-bit PQ, ``d/8`` bytes a vector): FastScan keeps each query's lookup
tables (16 entries a sub-quantiser) in SIMD registers and scores 32 codes per instruction, where
8-bit PQ reads a 256-entry table from cache per code. With inner products the tables depend on the
query only (the list's part is ``<q, centroid>``), so a probe costs no table rebuild — unlike
RaBitQ, whose query is rotated against every probed list's centroid. The default spends the codes on
accuracy: one 16-level quantiser per component (``m = d``: ``d/2`` bytes, 1/8 of the float32
vectors), which an out-of-distribution query's re-rank needs. On 1M simulated 128-d documents
searched by a distilled student's queries, that reached recall@10 0.99 at ~4x the single-query QPS
of 8-bit PQ, which never reached it (``benchmarks/results/ood_routing_quickstart.json``).

Milvus's SCANN index is this structure (IVF lists, 4-bit FastScan PQ, a re-rank of the raw vectors):
``index export --to milvus`` carries it there. Adds go through FAISS's own ``add`` (the lists the
quantiser assigns: :func:`scalingnote.index.faiss.methods.add_rows`); ``remove_ids`` deletes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.faiss.faiss_utils import trained_ivf

#: bits per PQ code FastScan accepts
PQFS_BITS = 4


def pqfs_m(dim: int, m: int | None) -> int:
    """The sub-quantisers of an ``ivf_pqfs`` index over ``dim`` components: ``m`` or ``dim`` (one a
    component), refused unless it divides ``dim`` (FAISS pads an odd count to an even one itself)."""
    m = int(m or dim)
    if m < 1 or dim % m:
        raise ScalingNoteError(f"ivf_pqfs: pq_m={m} must divide the dimension {dim}")
    return m


def pqfs_label(nlist: int, m: int) -> str:
    """The FAISS structure, e.g. ``IVF4000,PQ128x4fs``."""
    return f"IVF{nlist},PQ{m}x{PQFS_BITS}fs"


def build_ivf_pqfs(
    docs: np.ndarray, nlist: int, *, m: int | None, seed: int, train_size: int, kmeans_iters: int
) -> Any:
    """A trained and filled ``IndexIVFPQFastScan`` (inner product) over ``docs`` [N, d]: ``nlist``
    lists and the PQ codebooks (always 4-bit: the routing config's ``pq_bits`` is 8-bit PQ's, not
    read here) trained on at most ``train_size`` sampled rows."""
    n, d = docs.shape
    m = pqfs_m(d, m)
    nlist = max(1, min(int(nlist), n))
    return trained_ivf(docs, pqfs_label(nlist, m), seed=seed, train_size=train_size, kmeans_iters=kmeans_iters)


__all__ = ["PQFS_BITS", "build_ivf_pqfs", "pqfs_label", "pqfs_m"]
