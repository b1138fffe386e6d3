"""``svs_vamana``: Intel SVS's dynamic Vamana graph (package ``scalable-vs``), searched by inner
product over float32 vectors, documents added and deleted in place.

Vamana (Subramanya et al., NeurIPS 2019: the DiskANN graph) prunes each node's neighbours with a
factor ``alpha`` that keeps long edges, so a greedy beam of width ``ef_search`` (SVS's search
window) reaches a query's neighbours in few hops; SVS's kernels score a float32 vector in a few
SIMD instructions. SVS's compressed layouts (LVQ, LeanVec / LeanVec-OOD, whose projections are
learnt from query samples) run only on Intel CPUs — on any other CPU the library ends the process —
so this method keeps float32 vectors (memory about 1.25 of them at 128 dimensions, graph
included): an index-step candidate only where no memory bound applies (corpora up to 100k
documents); at a million it is measured, not chosen.

:class:`SvsVamanaIndex` is an :class:`~scalingnote.index.engine_index.EngineIndex` (the surface of a
FAISS index the rest of the package calls), so :class:`~scalingnote.index.DenseIndex`, the live index (in-place
add and delete: SVS's soft delete), compaction and the method choice serve it as the FAISS
methods. It is saved as a directory (``index.svs/``: SVS's config, graph and data directories).
SVS reports no distance count: the share scanned is estimated as ``window x degree`` distances a
query (at most the corpus).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.engine_index import EngineIndex, EngineParams

#: the directory an index directory keeps the SVS index in (files.index of the manifest)
SVS_INDEX_DIR = "index.svs"
_PARTS = ("config", "graph", "data")
#: SVS's construction default for inner product (its pruning factor below 1 for MIP)
DEFAULT_ALPHA = 0.95


def _svs() -> Any:
    try:
        import svs  # why: an optional engine (package scalable-vs), imported when used
    except ImportError as e:
        raise ScalingNoteError(
            f"method svs_vamana needs the package scalable-vs (pip install scalable-vs==0.5.0): {e}"
        ) from None
    return svs


def _threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


@dataclass
class VamanaShape:
    """How the graph is built: ``degree`` (graph_max_degree), construction ``window``, ``alpha``."""

    degree: int = 32
    window: int = 64
    alpha: float = DEFAULT_ALPHA

    def check(self) -> VamanaShape:
        if self.degree < 4 or self.window < self.degree // 2 or not 0 < self.alpha <= 2:
            raise ScalingNoteError(
                f"svs_vamana: svs_degree >= 4, svs_window >= degree / 2 and 0 < svs_alpha <= 2 needed, got "
                f"degree={self.degree}, window={self.window}, alpha={self.alpha}"
            )
        return self


class SvsVamanaIndex(EngineIndex):
    """A dynamic Vamana graph over float32 unit vectors (inner product), FAISS-shaped (module doc)."""

    engine = "svs_vamana"
    knob = "ef_search"  #: the search window

    def __init__(self, d: int, shape: VamanaShape, impl: Any = None, window: int = 64):
        self.d = int(d)
        self.shape = shape.check()
        self.impl = impl
        self.window = int(window)  #: the default search window (``ef_search`` when a call sets none)

    # ------------------------------------------------------------------ build / fill
    @classmethod
    def build(cls, docs: np.ndarray, shape: VamanaShape, ids: np.ndarray | None = None) -> SvsVamanaIndex:
        """A graph over ``docs`` [N, d] (ids: rows 0..N-1 unless given), built on every core."""
        out = cls(docs.shape[1], shape)
        out.add_with_ids(docs, np.arange(len(docs)) if ids is None else ids)
        return out

    def _params(self) -> Any:
        s = self.shape
        return _svs().VamanaBuildParameters(
            graph_max_degree=int(s.degree), window_size=int(s.window), alpha=float(s.alpha)
        )

    @property
    def ntotal(self) -> int:
        return 0 if self.impl is None else int(self.impl.size)

    def add_with_ids(self, x: np.ndarray, ids: np.ndarray) -> None:
        """Insert rows ``x`` under ids ``ids`` (unique, never used before); the first add builds the graph."""
        x = self.rows(x)
        if not len(x):
            return
        uid = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).astype(np.uint64))
        svs = _svs()
        try:
            if self.impl is None:
                self.impl = svs.DynamicVamana.build(self._params(), x, uid, svs.DistanceType.MIP, _threads())
            else:
                self.impl.add(x, uid)
        except RuntimeError as e:
            raise ScalingNoteError(f"svs_vamana: adding {len(x)} vectors failed: {e}") from None

    def remove_ids(self, ids: Any) -> int:
        """Delete rows by id (ids not in the index are skipped); returns how many were deleted."""
        if self.impl is None:
            return 0
        rows = [int(i) for i in np.asarray(ids, dtype=np.int64).ravel() if self.impl.has_id(int(i))]
        if rows:
            self.impl.delete(np.asarray(sorted(set(rows)), dtype=np.uint64))
        return len(set(rows))

    def reset(self) -> None:
        """Empty the index (its build shape kept): compaction fills it again."""
        self.impl = None

    def sa_code_size(self) -> int:
        """Bytes of one stored vector (float32)."""
        return 4 * self.d

    # ------------------------------------------------------------------ search
    def _search(self, q: np.ndarray, k: int, value: int | None) -> tuple[np.ndarray, np.ndarray]:
        """At most ``k`` hits a query (fewer when fewer rows are live) in a beam of ``value`` (the
        default window when None; at least the hits asked for)."""
        kk = min(k, self.ntotal)
        self.impl.search_window_size = max(int(value if value is not None else self.window), kk)
        found, dist = self.impl.search(q, kk)
        return np.asarray(dist, dtype=np.float32), np.asarray(found, dtype=np.int64)

    def distances_estimate(self, nq: int, window: int) -> int:
        """Distances ``nq`` queries compute at beam ``window`` (estimated: SVS reports none)."""
        return int(nq * min(self.ntotal, max(1, window) * self.shape.degree))

    # ------------------------------------------------------------------ save / load
    def save(self, path: str | Path) -> None:
        """Write the index into the directory ``path`` (created; its parent must exist)."""
        if self.impl is None:
            raise ScalingNoteError("svs_vamana: an empty index cannot be saved")
        root = Path(path)
        root.mkdir()
        self.impl.save(*(str(root / p) for p in _PARTS))
        _write_shape(root, self)

    @classmethod
    def load(cls, path: str | Path) -> SvsVamanaIndex:
        """The index saved at ``path`` (:meth:`save`), its search threads the cores this process may use."""
        import json

        root = Path(path)
        try:
            meta = json.loads((root / "shape.json").read_text(encoding="utf-8"))
            svs = _svs()
            impl = svs.DynamicVamana(
                str(root / "config"),
                svs.GraphLoader(str(root / "graph")),
                svs.VectorDataLoader(str(root / "data"), svs.DataType.float32),
                svs.DistanceType.MIP,
                num_threads=_threads(),
            )
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise ScalingNoteError(f"{root}: cannot read the SVS Vamana index ({e})") from None
        shape = VamanaShape(int(meta["degree"]), int(meta["window"]), float(meta["alpha"]))
        return cls(int(meta["d"]), shape, impl, int(meta.get("search_window", 64)))

    def memory_bytes(self) -> int:
        """Bytes of what SVS serialises (graph, vectors, id map)."""
        tmp = Path(tempfile.mkdtemp(prefix="scalingnote-svs-"))
        try:
            self.save(tmp / "i")
            return dir_bytes(tmp / "i")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _write_shape(root: Path, index: SvsVamanaIndex) -> None:
    import json

    s = index.shape
    meta = {"d": index.d, "degree": s.degree, "window": s.window, "alpha": s.alpha, "search_window": index.window}
    (root / "shape.json").write_text(json.dumps(meta) + "\n", encoding="utf-8")


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def svs_label(index: SvsVamanaIndex) -> str:
    """The structure, e.g. ``Vamana32,Flat``."""
    return f"Vamana{index.shape.degree},Flat"


def search_svs_counted(
    index: SvsVamanaIndex, q: np.ndarray, depth: int, ef_search: int
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(scores, ids, coarse distances (0), distances (estimated))`` of a ``depth``-deep search at
    beam ``ef_search``."""
    window = max(int(ef_search), depth)
    scores, ids = index.search(q, depth, EngineParams(window))
    return scores, ids, 0, index.distances_estimate(len(q), window)


__all__ = [
    "SVS_INDEX_DIR",
    "SvsVamanaIndex",
    "VamanaShape",
    "dir_bytes",
    "search_svs_counted",
    "svs_label",
]
