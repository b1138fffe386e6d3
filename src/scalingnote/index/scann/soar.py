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
searched leaves' share of the assignments (documents x (1 + spill)).

:class:`ScannSoar` is an :class:`~scalingnote.index.engine_index.EngineIndex` (the surface of a FAISS
index the rest of the package calls, plus ``nlist``), so the index directory (``index.scann/``: ScaNN's
own serialisation), the live index and compaction serve it as the FAISS methods. Each document is a
ScaNN docid (its row number as a string): rows are added with ScaNN's ``upsert`` (assigned to leaves
by the trained tree, with their SOAR spill) and deleted in place with its ``delete``; compaction
trains a new tree over the live rows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.engine_index import EngineIndex, EngineParams

#: the directory an index directory keeps the ScaNN searcher in (files.index of the manifest)
SCANN_INDEX_DIR = "index.scann"
#: AH trains 16 centres a block: fewer rows cannot be encoded
MIN_ROWS = 16


def _scann() -> Any:
    try:
        from scann import scann_ops_pybind  # why: an optional engine (package scann-core), imported when used
    except ImportError as e:
        raise ScalingNoteError(
            f"method scann_soar needs the package scann-core (pip install scann-core==0.2.1): {e}"
        ) from None
    return scann_ops_pybind


@dataclass
class SoarShape:
    """How the tree and codes are built: leaves, SOAR's lambda (0: no spill), AH block and threshold."""

    nlist: int
    soar_lambda: float = 1.5
    dims_per_block: int = 2
    aq_threshold: float = 0.2
    train_size: int = 131_072

    def check(self) -> SoarShape:
        if self.dims_per_block not in (1, 2, 4):
            raise ScalingNoteError(f"scann_dims_per_block must be 1, 2 or 4, got {self.dims_per_block!r}")
        if self.soar_lambda < 0:
            raise ScalingNoteError(f"scann_soar_lambda must be >= 0, got {self.soar_lambda!r}")
        return self


@dataclass
class ScannSoar(EngineIndex):
    """A ScaNN searcher with docids (FAISS-shaped: module doc); ``searcher`` None = emptied (compaction)."""

    searcher: Any
    shape: SoarShape
    d: int
    nprobe: int = 16  #: the default leaves searched when a call sets none
    _sizes: dict[str, int] | None = field(default=None, repr=False)
    _ids: np.ndarray | None = field(default=None, repr=False)  #: ScaNN's datapoint index -> row id

    engine = "scann_soar"
    knob = "nprobe"  #: the leaves searched

    @classmethod
    def build(cls, docs: np.ndarray, shape: SoarShape, ids: np.ndarray | None = None) -> ScannSoar:
        """Train the tree on at most ``shape.train_size`` rows, assign every row (+ its SOAR spill) and
        encode it; rows are ids 0..N-1 unless ``ids`` are given."""
        out = cls(None, shape.check(), int(docs.shape[1]))
        out.add_with_ids(docs, np.arange(len(docs)) if ids is None else ids)
        return out

    def _build(self, x: np.ndarray, ids: np.ndarray) -> None:
        n, s = len(x), self.shape
        if n < MIN_ROWS:
            raise ScalingNoteError(f"scann_soar: at least {MIN_ROWS} documents needed to train its codes, got {n}")
        nlist = max(1, min(int(s.nlist), n))
        self.shape = s = dataclasses.replace(s, nlist=nlist)  # at most a leaf a row
        tree: dict[str, Any] = {
            "num_leaves": nlist,
            "num_leaves_to_search": min(nlist, 16),
            "training_sample_size": min(n, int(s.train_size)),
            # k-means++ from ScaNN's fixed seed: its random initialisation draws from a process-wide
            # generator, so a tree would depend on the builds made before it in the same process
            "random_init": False,
            # unit centres: a document goes to a leaf by L2 (ScaNN's database rule), a query to leaves by inner
            # product; over unit vectors with unit centres the two orders agree, so a row added later is found
            "spherical": True,
        }
        if s.soar_lambda > 0:
            tree.update(soar_lambda=float(s.soar_lambda), overretrieve_factor=2.0)
        builder = _scann().builder(x, 10, "dot_product")
        self.searcher = (
            builder.tree(**tree)
            .score_ah(int(s.dims_per_block), anisotropic_quantization_threshold=float(s.aq_threshold))
            .build(docids=[str(int(i)) for i in ids])
        )
        self._changed()

    def _changed(self) -> None:
        self._sizes = None
        self._ids = None if self.searcher is None else np.asarray(self.searcher.docids, dtype=np.int64)

    # ------------------------------------------------------------------ FAISS-shaped surface
    @property
    def ntotal(self) -> int:
        return 0 if self.searcher is None else int(self.searcher.size())

    @property
    def nlist(self) -> int:
        return int(self.shape.nlist)

    def add_with_ids(self, x: np.ndarray, ids: np.ndarray) -> None:
        """Insert rows ``x`` under ids ``ids`` (never used before); into an emptied index: a new tree."""
        x = self.rows(x)
        if not len(x):
            return
        try:
            if self.searcher is None:
                self._build(x, np.asarray(ids))
            else:
                self.searcher.upsert([str(int(i)) for i in ids], x)
                self._changed()
        except (RuntimeError, ValueError) as e:
            raise ScalingNoteError(f"scann_soar: adding {len(x)} vectors failed: {e}") from None

    def remove_ids(self, ids: Any) -> int:
        """Delete rows by id (ids not in the index are skipped); returns how many were deleted."""
        if self.searcher is None:
            return 0
        known = self.searcher.docid_to_id
        gone = sorted({str(int(i)) for i in np.asarray(ids, dtype=np.int64).ravel()} & set(known))
        if gone:
            self.searcher.delete(gone)
            self._changed()
        return len(gone)

    def reset(self) -> None:
        """Empty the index (its shape kept): compaction trains a new tree over the rows it adds."""
        self.searcher = None
        self._changed()

    def sa_code_size(self) -> int:
        """Bytes of one document's codes (4 bits a block, once per assignment: with its spill)."""
        return int(round(self.d / self.shape.dims_per_block / 2 * (1 + self.spill)))

    def _search(self, q: np.ndarray, k: int, value: int | None) -> tuple[np.ndarray, np.ndarray]:
        """At most ``k`` hits a query from ``value`` leaves (the default when None), AH-estimated scores."""
        leaves = int(min(max(1, value if value is not None else self.nprobe), self.nlist))
        scores = np.full((len(q), k), -np.inf, dtype=np.float32)
        ids = np.full((len(q), k), -1, dtype=np.int64)
        assert self._ids is not None  # set with the searcher
        for r in range(len(q)):
            # one query a call: ScaNN's batched kernels score a query differently with other queries beside
            # it, so a query's answer would depend on the batch it came in. The C++ searcher returns
            # datapoint indices; _ids maps them to row ids (the wrapper's Python map is slower).
            idx, dist = self.searcher.searcher.search(q[r], k, k, leaves)
            idx, dist = np.asarray(idx, dtype=np.int64), np.asarray(dist, dtype=np.float32)
            got = ~np.isnan(dist)  # ScaNN pads a short answer with index 0 and a NaN distance
            ids[r, : len(idx)] = np.where(got, self._ids[np.where(got, idx, 0)], -1)
            scores[r, : len(idx)] = dist
        return scores, ids

    # ------------------------------------------------------------------ routing study
    def _files(self) -> dict[str, int]:
        """The sizes of the files ScaNN serialises (measured once per change)."""
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
        """Bytes of what ScaNN serialises (codes, spilled codes, tree, codebooks, assignments, docids)."""
        return int(sum(self._files().values()))

    def search_counted(self, q: np.ndarray, depth: int, nprobe: int) -> tuple[np.ndarray, np.ndarray, int, int]:
        """``(scores, ids, coarse distances, codes scored (estimated))`` of a ``depth``-deep search of
        ``nprobe`` leaves."""
        leaves = int(min(max(1, nprobe), self.nlist))
        scores, ids = self.search(q, depth, EngineParams(leaves))
        codes = int(round(len(q) * self.ntotal * (1 + self.spill) * leaves / self.nlist))
        return scores, ids, self.nlist * len(q), codes

    # ------------------------------------------------------------------ save / load
    def save(self, path: str | Path) -> None:
        """Write the searcher into the directory ``path`` (created; its parent must exist)."""
        if self.searcher is None:
            raise ScalingNoteError("scann_soar: an empty index cannot be saved")
        root = Path(path)
        root.mkdir()
        self.searcher.serialize(str(root), relative_path=True)  # the directory is renamed into place after
        meta = {"d": self.d, "nprobe": self.nprobe, **self.shape.__dict__}
        (root / "shape.json").write_text(json.dumps(meta) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> ScannSoar:
        """The searcher saved at ``path`` (:meth:`save`)."""
        root = Path(path)
        try:
            meta = json.loads((root / "shape.json").read_text(encoding="utf-8"))
            searcher = _scann().load_searcher(str(root))
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise ScalingNoteError(f"{root}: cannot read the ScaNN index ({e})") from None
        d, nprobe = int(meta.pop("d")), int(meta.pop("nprobe", 16))
        out = cls(searcher, SoarShape(**meta), d, nprobe)
        out._changed()
        return out


def soar_label(index: ScannSoar) -> str:
    """The structure, e.g. ``Tree1000,AH2,SOAR1.5``."""
    s = index.shape
    return f"Tree{s.nlist},AH{s.dims_per_block}" + (f",SOAR{s.soar_lambda:g}" if s.soar_lambda > 0 else "")


__all__ = ["MIN_ROWS", "SCANN_INDEX_DIR", "ScannSoar", "SoarShape", "soar_label"]
