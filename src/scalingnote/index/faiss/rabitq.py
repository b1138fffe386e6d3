"""``ivf_rabitq``: FAISS IVF RaBitQ FastScan (``IndexIVFRaBitQFastScan``, factory ``IVF<n>,RaBitQfs<b>``)
with an exact re-rank of its top candidates over the full-precision vectors (the refine step).

RaBitQ (Gao & Long, SIGMOD 2024; multi-bit codes: Gao et al., SIGMOD 2025) stores each vector's
residual to its list centroid as a randomly rotated ``b``-bit code plus two correction factors,
``d * b / 8 + ~20`` bytes a vector, and estimates inner products with an error bound that does not
assume the query comes from the documents' distribution: an out-of-distribution query tower loses
recall to quantisation no faster than an in-distribution one. FastScan lays the 1-bit part of the
codes out in blocks of 32 vectors scanned with SIMD lookup tables, so a list scan costs a few
cycles a vector; the remaining ``b - 1`` bits refine the candidates' estimates.

The index is a plain FAISS IVF index: ``nprobe`` is its probe knob, ``remove_ids`` deletes, the
live index adds rows to the list the quantiser assigns (:func:`scalingnote.index.faiss.methods.add_rows`)
and compaction refills an emptied copy. ``qb`` (bits of the query's lookup tables, 1-8) is fixed at
build time and saved with the index.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.faiss.faiss_utils import search_ivf_counted, trained_ivf

#: bits per component of the codes FAISS accepts (``RaBitQfs1`` ... ``RaBitQfs9``)
RABITQ_BITS: tuple[int, ...] = tuple(range(1, 10))
#: bytes a vector beyond its code bits: the correction factors and FAISS's id (FAISS 1.15 layout)
RABITQ_OVERHEAD_BYTES = 20 + 8


def rabitq_code_bytes(dim: int, bits: int) -> float:
    """Bytes a vector of a ``bits``-bit RaBitQ index keeps in memory: ``dim * bits / 8`` + factors + id."""
    return dim * bits / 8 + RABITQ_OVERHEAD_BYTES


def rabitq_bits_within(dim: int, bound: float = 0.25, most: int = 4) -> int:
    """The most code bits (at most ``most``) whose index stays within ``bound`` of the float32
    vectors (:func:`rabitq_code_bytes`); 1 when none does. More bits: a closer estimate, so a
    shorter re-rank; past ~4 bits the scan costs more than the re-rank it saves."""
    for b in range(min(most, RABITQ_BITS[-1]), 0, -1):
        if rabitq_code_bytes(dim, b) <= bound * 4 * dim:
            return b
    return 1


def rabitq_label(nlist: int, bits: int, qb: int) -> str:
    """The FAISS structure, e.g. ``IVF4000,RaBitQfs4,qb8``."""
    return f"IVF{nlist},RaBitQfs{bits},qb{qb}"


def build_ivf_rabitq(
    docs: np.ndarray, nlist: int, *, bits: int, qb: int, seed: int, train_size: int, kmeans_iters: int
) -> Any:
    """A trained and filled ``IndexIVFRaBitQFastScan`` (inner product) over ``docs`` [N, d]: ``nlist``
    lists trained on at most ``train_size`` sampled rows, ``bits``-bit codes, ``qb``-bit query tables."""
    import faiss  # why: FAISS loads with the index package's searchers, not at import

    if bits not in RABITQ_BITS:
        raise ScalingNoteError(f"rabitq_bits must be one of {RABITQ_BITS[0]}..{RABITQ_BITS[-1]}, got {bits!r}")
    if not 1 <= qb <= 8:
        raise ScalingNoteError(f"rabitq_qb must be in 1..8, got {qb!r}")
    if not hasattr(faiss, "IndexIVFRaBitQFastScan"):
        raise ScalingNoteError(
            f"ivf_rabitq needs faiss-cpu >= 1.15 (IndexIVFRaBitQFastScan); this is faiss {faiss.__version__}"
        )
    nlist = max(1, min(int(nlist), len(docs)))
    return trained_ivf(
        docs,
        f"IVF{nlist},RaBitQfs{bits}",
        seed=seed,
        train_size=train_size,
        kmeans_iters=kmeans_iters,
        attrs={"qb": int(qb)},
    )


def search_ivf_rabitq(index: Any, q: np.ndarray, depth: int, nprobe: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(scores, ids, coarse distances, codes scanned)`` of a ``depth``-deep search probing
    ``nprobe`` lists with the index's own query-table bits (:func:`search_ivf_counted`)."""
    import faiss

    params = faiss.IVFRaBitQSearchParameters()
    params.qb = int(index.qb)
    return search_ivf_counted(index, q, depth, nprobe, params)


__all__ = [
    "RABITQ_BITS",
    "build_ivf_rabitq",
    "rabitq_bits_within",
    "rabitq_code_bytes",
    "rabitq_label",
    "search_ivf_rabitq",
]
