"""``scann_soar``: ScaNN's partition tree with SOAR spilling, scored with anisotropic vector
quantisation (AH), re-ranked exactly over the full-precision vectors.

SOAR (Sun et al., NeurIPS 2023) assigns each document to a second partition whose centroid
residual is near-orthogonal to the first one's, so a query whose inner product with a document is
badly estimated from the first partition finds it in the second: the recall an out-of-distribution
query loses to partitioning is won back at the cost of one more code a document. Anisotropic
quantisation (Guo et al., ICML 2020) weighs the quantisation error parallel to the datapoint
(which changes inner products most) above the orthogonal error. Codes: 16 centres per block of
``dims_per_block`` dimensions (4 bits a block), one copy per assignment.

The searcher is built without ScaNN's own re-order step (which keeps a float32 copy in memory): the
re-rank reads the memory-mapped vectors as every other method's. ``nprobe`` is the number of
leaves searched. ScaNN does not report the codes it scores: the share scanned is estimated as the
searched leaves' share of the assignments (documents x (1 + spill)). Deleting is refused (rebuild).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError


def _scann() -> Any:
    try:
        from scann import scann_ops_pybind  # why: an optional engine (package scann-core), imported when used
    except ImportError as e:
        raise ScalingNoteError(
            f"method scann_soar needs the package scann-core (pip install scann-core==0.2.1): {e}"
        ) from None
    return scann_ops_pybind


@dataclass
class ScannSoar:
    """A built ScaNN searcher and its sizes: ``nlist`` leaves, ``spill`` = extra assignments a document."""

    searcher: Any
    nlist: int
    ntotal: int
    d: int
    _sizes: dict[str, int] | None = None

    @classmethod
    def build(
        cls,
        docs: np.ndarray,
        *,
        nlist: int,
        soar_lambda: float,
        dims_per_block: int,
        aq_threshold: float,
        train_size: int,
    ) -> ScannSoar:
        """Train the tree on at most ``train_size`` rows, assign every row (+ its SOAR spill) and
        encode it; ``soar_lambda`` 0 turns spilling off."""
        if dims_per_block not in (1, 2, 4):
            raise ScalingNoteError(f"scann_dims_per_block must be 1, 2 or 4, got {dims_per_block!r}")
        if soar_lambda < 0:
            raise ScalingNoteError(f"scann_soar_lambda must be >= 0, got {soar_lambda!r}")
        n, d = docs.shape
        nlist = max(1, min(int(nlist), n))
        tree: dict[str, Any] = {
            "num_leaves": nlist,
            "num_leaves_to_search": min(nlist, 16),
            "training_sample_size": min(n, int(train_size)),
        }
        if soar_lambda > 0:
            tree.update(soar_lambda=float(soar_lambda), overretrieve_factor=2.0)
        builder = _scann().builder(np.ascontiguousarray(docs, dtype=np.float32), 10, "dot_product")
        searcher = (
            builder.tree(**tree)
            .score_ah(int(dims_per_block), anisotropic_quantization_threshold=float(aq_threshold))
            .build()
        )
        return cls(searcher, nlist, n, d)

    def _files(self) -> dict[str, int]:
        """The sizes of the files ScaNN serialises (measured once: the searcher is not changed)."""
        if self._sizes is None:
            with tempfile.TemporaryDirectory(prefix="scalingnote-scann-") as tmp:
                self.searcher.serialize(tmp)
                self._sizes = {f: os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp)}
        return self._sizes

    @property
    def spill(self) -> float:
        """Spilled assignments a document (SOAR: its codes are stored once more)."""
        files = self._files()
        main, soar = files.get("hashed_dataset.npy", 0), files.get("hashed_dataset_soar.npy", 0)
        return float(soar) / main if main else 0.0

    def memory_bytes(self) -> int:
        """Bytes of what ScaNN serialises (codes, spilled codes, tree, codebooks, assignments)."""
        return int(sum(self._files().values()))

    def search(self, q: np.ndarray, depth: int, nprobe: int) -> tuple[np.ndarray, np.ndarray, int, int]:
        """``(scores, ids, coarse distances, codes scored (estimated))`` of a ``depth``-deep search of
        ``nprobe`` leaves."""
        leaves = int(min(max(1, nprobe), self.nlist))
        ids, scores = self.searcher.search_batched(
            q, final_num_neighbors=depth, pre_reorder_num_neighbors=depth, leaves_to_search=leaves
        )
        ids = np.asarray(ids, dtype=np.int64)
        scores = np.asarray(scores, dtype=np.float32)
        if ids.shape[1] < depth:  # fewer candidates than asked: pad as FAISS does (-1)
            pad = depth - ids.shape[1]
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        codes = int(round(len(q) * self.ntotal * (1 + self.spill) * leaves / self.nlist))
        return scores, ids, self.nlist * len(q), codes

    def remove_ids(self, ids: np.ndarray) -> int:
        raise ScalingNoteError(
            "scann_soar: deleting is not supported (the searcher keeps no document ids): filter deleted ids at "
            "search time and rebuild"
        )


__all__ = ["ScannSoar"]
