"""A saved FAISS dense index opened for search (:class:`DenseIndex`): optional exact re-rank of
the ANN candidates (TMJ §6), semantic IDs, titles and snippets with the results.

The directory layout is described in :mod:`scalingnote.index.build`; similarity is the inner
product of L2-normalised vectors (cosine), as in ScalingNote §3 and TMJ §6.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.docstore import read_document_store
from scalingnote.index.engine_files import is_engine, read_structure
from scalingnote.index.faiss.faiss_utils import _search_params, find_hnsw, find_ivf
from scalingnote.index.layout import DOC_IDS_FILE, INDEX_FILE, MANIFEST, VECTORS_FILE, check_query_tower, read_manifest
from scalingnote.index.searcher import Queries, SearchResult, VectorSearcher, gather_rows
from scalingnote.index.semantic_ids import ResidualKMeans

# --------------------------------------------------------------------------- search


class DenseIndex(VectorSearcher):
    """A saved FAISS index opened for search (the :class:`~scalingnote.index.searcher.Searcher`
    interface). Use :meth:`open`."""

    def __init__(
        self,
        root: Path,
        manifest: dict[str, Any],
        index,
        vectors: np.ndarray,
        doc_ids: list[str],
        semantic_ids: np.ndarray | None,
        query_tower=None,
        titles: list[str] | None = None,
        snippets: list[str] | None = None,
    ):
        self.root = root
        self.manifest = manifest
        self.index = index
        self.vectors = vectors
        self.doc_ids = doc_ids
        self.semantic_ids = semantic_ids
        self.query_tower = query_tower
        self.titles = titles  # per FAISS row, from docs.jsonl (None: the index stores no documents)
        self.snippets = snippets
        # a top-level graph ef_search widens (FAISS HNSW, not an IVF's HNSW quantiser; or SVS's Vamana)
        self._hnsw_graph = find_hnsw(index) is not None or (is_engine(index) and index.graph)
        #: a FAISS IDSelector of the rows a search may return (the live index's tombstones on HNSW / Flat); None: all
        self.selector: Any = None

    # ------------------------------------------------------------------ open
    @classmethod
    def open(cls, root: str | Path, query_tower=None, *, mmap: bool = True) -> DenseIndex:
        """Open an index directory. With ``query_tower``, check it is compatible with the
        document tower the index was built with (compat id) and that its output dim is
        the index dim or the document tower's full dim (Matryoshka prefix).

        The FAISS index is read into memory; the full-precision vectors and semantic IDs
        are memory-mapped (``mmap=False`` reads them into memory too)."""
        root = Path(root)
        manifest = read_manifest(root)
        if query_tower is not None:
            check_query_tower(manifest, query_tower, root / MANIFEST)
        files = manifest.get("files", {})
        index = read_structure(root / files.get("index", INDEX_FILE))
        vpath = root / files.get("vectors", VECTORS_FILE)
        try:
            vectors = np.load(vpath, mmap_mode="r" if mmap else None)
        except (OSError, ValueError) as e:
            raise ScalingNoteError(f"{vpath}: cannot read full-precision vectors ({e})") from None
        dpath = root / files.get("doc_ids", DOC_IDS_FILE)
        try:
            doc_ids = json.loads(dpath.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ScalingNoteError(f"{dpath}: cannot read document ids ({e})") from None
        n, dim = int(manifest["n_vectors"]), int(manifest["dim"])
        if index.ntotal != n or vectors.shape != (n, dim) or len(doc_ids) != n or index.d != dim:
            raise ScalingNoteError(
                f"{root}: inconsistent index files (manifest n={n} dim={dim}; index ntotal={index.ntotal} d={index.d}; "
                f"vectors {vectors.shape}; {len(doc_ids)} doc ids)"
            )
        sem = None
        if manifest.get("semantic_ids"):
            spath = root / manifest["semantic_ids"]["file"]
            try:
                sem = np.load(spath, mmap_mode="r" if mmap else None)
            except (OSError, ValueError) as e:
                raise ScalingNoteError(f"{spath}: cannot read semantic IDs ({e})") from None
            if sem.shape[0] != n:
                raise ScalingNoteError(f"{spath}: {sem.shape[0]} rows for {n} documents")
        titles = snippets = None
        if files.get("docs"):
            titles, snippets = read_document_store(root / files["docs"], doc_ids)
        return cls(root, manifest, index, vectors, doc_ids, sem, query_tower, titles, snippets)

    # ------------------------------------------------------------------ props
    supports_rerank = True  # capability flags (SearcherBase); upsert / delete: scalingnote.live.LiveIndex

    @property
    def local_dir(self) -> Path:
        return self.root

    @property
    def has_ivf(self) -> bool:
        """Partitions ``nprobe`` applies to: a FAISS IVF, or ScaNN's tree (``partitioned``)."""
        return find_ivf(self.index) is not None or (is_engine(self.index) and self.index.partitioned)

    @property
    def has_hnsw(self) -> bool:
        """An HNSW graph ``ef_search`` applies to: the index itself or its IVF's coarse quantiser."""
        if self._hnsw_graph:
            return True
        ivf = find_ivf(self.index)
        if ivf is None:
            return False
        import faiss

        return isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexHNSW)

    def semantic_id_model(self) -> ResidualKMeans | None:
        """The residual-K-means codebooks, to assign semantic IDs to new documents."""
        sem = self.manifest.get("semantic_ids")
        return ResidualKMeans.load(self.root / sem["codebooks"]) if sem else None

    def search(
        self,
        queries: Queries,
        k: int = 10,
        *,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rerank: int | None = None,
    ) -> SearchResult:
        """Top-``k`` documents per query.

        ``queries``: query texts (encoded with the query tower) or vectors ``(nq, dim)``
        (or the document tower's full dim, cut to the indexed prefix).
        ``nprobe`` / ``ef_search``: per-call IVF probes / HNSW beam (default: the
        index's ``search_defaults``; on an HNSW graph efSearch is raised to at least the
        number of candidates, since a beam of width ef returns at most ~ef results).
        ``rerank=N``: fetch ``max(N, k)`` candidates from
        the ANN index and re-score them exactly with the full-precision vectors
        (TMJ §6); scores are then exact inner products. ``rerank=None``: the index's
        default (set by :func:`scalingnote.index.tune.tune_search`; none unless tuned),
        ``rerank=0``: no re-rank.
        """
        defaults = self.manifest.get("search_defaults", {})
        rerank = rerank if rerank is not None else defaults.get("rerank")
        q, n_cand = self.prepare_search(queries, k, rerank)
        ef = ef_search if ef_search is not None else defaults.get("ef_search")
        if ef is not None and self._hnsw_graph:
            # an HNSW beam of width ef returns at most ~ef results: widen it to the candidates asked for
            ef = max(ef, n_cand)
        params, _keep = _search_params(
            self.index,
            nprobe if nprobe is not None else defaults.get("nprobe"),
            ef,
            self.factory,
            self.selector,
        )
        if q.shape[0] == 0:
            scores = np.zeros((0, n_cand), np.float32)
            indices = np.zeros((0, n_cand), np.int64)
        else:
            scores, indices = self.index.search(q, n_cand, params=params)
        if self.manifest.get("faiss_metric") == "l2":
            scores = 1.0 - scores / 2.0  # unit vectors: ||q - x||^2 = 2 - 2 q.x
        scores = np.where(indices >= 0, scores, -np.inf).astype(np.float32)
        if rerank:
            scores, indices = self._rerank(q, indices)
        scores, indices = scores[:, :k], indices[:, :k]
        if indices.shape[1] < k:  # fewer documents than k
            pad = k - indices.shape[1]
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
            indices = np.pad(indices, ((0, 0), (0, pad)), constant_values=-1)
        doc_ids = [[self.doc_ids[i] for i in row if i >= 0] for row in indices]
        sem = None
        if self.semantic_ids is not None:
            L = self.semantic_ids.shape[1]
            sem = np.full((indices.shape[0], k, L), -1, dtype=np.int32)
            valid = indices >= 0
            if valid.any():
                sem[valid] = gather_rows(self.semantic_ids, indices[valid])
        return self.attach_documents(SearchResult(scores, doc_ids, sem, indices))

    def attach_documents(self, res: SearchResult) -> SearchResult:
        """Fill ``res.titles`` / ``res.snippets`` from the document store (rows of ``res.indices``)."""
        if self.titles is not None and self.snippets is not None:
            res.titles = [[self.titles[i] for i in row if i >= 0] for row in res.indices]
            res.snippets = [[self.snippets[i] for i in row if i >= 0] for row in res.indices]
        return res

    def _rerank(self, q: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact inner products of the candidates (full-precision, memory-mapped vectors)."""
        valid = cand >= 0
        uniq = np.unique(cand[valid])
        vecs = np.asarray(self.vectors[uniq], dtype=np.float32)  # sorted rows: sequential mmap reads
        pos = np.searchsorted(uniq, np.where(valid, cand, uniq[0] if len(uniq) else 0))
        scores = np.matmul(vecs[pos], q[:, :, None])[:, :, 0] if len(uniq) else np.zeros(cand.shape, np.float32)
        scores = np.where(valid, scores, -np.inf).astype(np.float32)
        order = np.argsort(-scores, axis=1, kind="stable")
        return np.take_along_axis(scores, order, axis=1), np.take_along_axis(cand, order, axis=1)
