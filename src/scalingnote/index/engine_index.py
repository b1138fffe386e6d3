"""The contract a search engine that is not FAISS meets to live in an index directory.

The index directory (:class:`~scalingnote.index.DenseIndex`), the live index (adds, deletes) and
compaction call a handful of methods of the structure they search — the FAISS ``Index`` surface.
An engine of another library is wrapped in a subclass of :class:`EngineIndex`, which supplies that
surface from a few engine-specific methods:

* ``ntotal`` (rows held), ``add_with_ids(x, ids)`` (the first add into an empty index builds it),
  ``remove_ids(ids)`` (in place; ids not held are skipped), ``reset()`` (empty, shape kept: compaction
  adds the live rows again), ``sa_code_size()`` (bytes stored a row);
* ``_search(q, k, value)``: ``(scores, ids)`` of at most ``k`` hits a query at the search knob's
  ``value`` (None: the engine's default), row ids, ``-1`` past the hits;
* ``save(path)`` / ``load(path)`` (a directory), ``memory_bytes()``.

``knob`` names the one per-call search option the engine declares: ``"nprobe"`` (partitions
searched; :attr:`partitioned`) or ``"ef_search"`` (a graph's beam; :attr:`graph`); the other one is
refused, as is a FAISS ID selector (deletes are in place, so the live index keeps no tombstones).
:mod:`scalingnote.index.engine_files` reads and writes the engines' directories; the implementations
are :class:`~scalingnote.index.svs.vamana.SvsVamanaIndex` and :class:`~scalingnote.index.scann.soar.ScannSoar`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError

#: what a request lacking each knob's structure is told
_LACKS = {"nprobe": "has no IVF layer", "ef_search": "has no HNSW graph"}


@dataclass
class EngineParams:
    """Per-call search settings (FAISS's ``SearchParameters`` role): the engine's knob, or None."""

    value: int | None = None


class EngineIndex:
    """A FAISS-shaped structure of another engine (module doc). Subclasses set ``engine``, ``knob``
    and ``d`` and implement the engine-specific methods."""

    engine = ""
    knob = "nprobe"
    d: int
    supports_remove = True  #: deletes in place: no tombstones to filter
    metric_type = 0  #: faiss.METRIC_INNER_PRODUCT
    is_trained = True

    @property
    def graph(self) -> bool:
        """``ef_search`` applies (a graph's beam)."""
        return self.knob == "ef_search"

    @property
    def partitioned(self) -> bool:
        """``nprobe`` applies (partitions searched)."""
        return self.knob == "nprobe"

    @property
    def ntotal(self) -> int:
        raise NotImplementedError

    def add_with_ids(self, x: np.ndarray, ids: np.ndarray) -> None:
        raise NotImplementedError

    def _search(self, q: np.ndarray, k: int, value: int | None) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def rows(self, x: np.ndarray) -> np.ndarray:
        """``x`` as contiguous float32 rows of this index's width, or a clear error."""
        a = np.ascontiguousarray(x, dtype=np.float32)
        if a.ndim != 2 or a.shape[1] != self.d:
            raise ScalingNoteError(f"{self.engine}: expected vectors of shape (n, {self.d}), got {a.shape}")
        return a

    def add(self, x: np.ndarray) -> None:
        """Insert rows under the next ids (``ntotal`` ...): a build's fill."""
        self.add_with_ids(x, np.arange(self.ntotal, self.ntotal + len(x)))

    def search_params(self, nprobe: int | None, ef_search: int | None, label: str, sel: Any = None) -> EngineParams:
        """Per-call parameters: the engine's knob checked, the other knob and an ID selector refused."""
        given = {"nprobe": nprobe, "ef_search": ef_search}
        for name, value in given.items():
            if value is not None and name != self.knob:
                raise ScalingNoteError(f"{name}={value} given, but index {label!r} {_LACKS[name]}")
        if sel is not None:
            raise ScalingNoteError(f"index {label!r} deletes in place: it takes no ID selector")
        value = given[self.knob]
        if value is not None and value < 1:
            raise ScalingNoteError(f"{self.knob} must be >= 1, got {value}")
        return EngineParams(value)

    def search(self, x: np.ndarray, k: int, params: EngineParams | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, ids)`` [nq, k], ``-1`` / ``-inf`` padding past the hits (FAISS's convention)."""
        q = np.ascontiguousarray(x, dtype=np.float32)
        nq, k = len(q), int(k)
        scores = np.full((nq, k), -np.inf, dtype=np.float32)
        ids = np.full((nq, k), -1, dtype=np.int64)
        if not self.ntotal or not nq or not k:
            return scores, ids
        got_s, got_i = self._search(q, k, None if params is None else params.value)
        w = got_i.shape[1]
        ids[:, :w] = got_i
        scores[:, :w] = np.where(got_i >= 0, got_s, -np.inf)
        return scores, ids


__all__ = ["EngineIndex", "EngineParams"]
