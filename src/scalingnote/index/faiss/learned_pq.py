"""Export adapters: write a learned product quantizer (trained by :mod:`scalingnote.pq`) into
FAISS indexes served by :class:`~scalingnote.index.DenseIndex`.

The index layer sits below the PQ stage, so it takes the quantizer by its shape
(:class:`Codebooks`: ``dim``, ``m``, ``nbits``, ``codebooks``, ``rotation``, ``describe()``),
never by importing :class:`scalingnote.pq.LearnedPQ`.

Three structures (inner-product metric, cosine on unit vectors, except HNSW — see below):

* ``"PQ"`` — ``faiss.IndexPQ``: the learned centroids are copied into ``pq.centroids``
  (``faiss.copy_array_to_vector``); ``add`` recomputes every document's code as its
  nearest learned centroid per sub-space (Eq. 2), so the index scores ``<q, x̂>`` exactly as
  :class:`~scalingnote.pq.LearnedPQ` does (tested to 1e-5).
* ``"IVF{nlist},PQ"`` — ``faiss.IndexIVFPQ`` with ``by_residual = False``. The learned
  codebooks quantize the document vectors themselves (TMJ learns them on ``d``, not on
  residuals to coarse centroids), so the PQ codes and ADC scores of every document are
  exactly those of ``IndexPQ``; the IVF layer (spherical k-means on the documents, seeded)
  only restricts the scan to the ``nprobe`` nearest lists. Residual encoding would need
  codebooks trained on residuals, i.e. not the learned ones — that approximation is not made.
* ``"HNSW{M},PQ"`` — ``faiss.IndexHNSWPQ``: an HNSW graph over the learned PQ codes,
  the serving structure of TMJ §4/§6 ("the index is built using the compressed document
  embeddings ... as well as the PQ centroids from the trained model"); add ``rerank=N`` at
  search time for TMJ §6's dense re-rank of the top candidates. It uses FAISS's L2 metric
  (FAISS builds the graph with symmetric L2 code distances and degrades it under the
  inner-product metric); on unit vectors its score ``1 - ||q - x̂||²/2`` ranks like
  ``<q, x̂>`` up to the ``||x̂||²`` term (an approximation of the trained score, documented).

A learned OPQ rotation ``R`` becomes a fixed ``faiss.LinearTransform`` in an
``IndexPreTransform`` in front of the index, so queries and documents are rotated as in
training. The index directory is written by :func:`scalingnote.index.build_index`
(``index=`` a prebuilt index), so it has the standard manifest, full-precision vectors for
re-ranking and optional semantic IDs, and :meth:`DenseIndex.open` serves it unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from scalingnote.errors import ScalingNoteError
from scalingnote.index.build import build_index
from scalingnote.index.embeddings import l2_normalize
from scalingnote.index.layout import MANIFEST
from scalingnote.utils import write_json


class Codebooks(Protocol):
    """What the adapters read from a learned PQ (:class:`scalingnote.pq.LearnedPQ` has it):
    ``codebooks`` ``(m, 2**nbits, dim/m)`` and an optional orthogonal ``rotation`` (torch tensors)."""

    dim: int
    m: int
    nbits: int
    codebooks: Any
    rotation: Any

    def describe(self) -> dict[str, Any]: ...


_KIND_RE = re.compile(r"^(?:(?P<ivf>IVF(?P<nlist>\d+))|(?P<hnsw>HNSW(?P<hm>\d+)))?(?:,)?PQ$")


def parse_kind(kind: str) -> tuple[str, int | None]:
    """``"PQ"`` -> ("pq", None); ``"IVF64,PQ"`` -> ("ivf", 64); ``"HNSW32,PQ"`` -> ("hnsw", 32)."""
    k = kind.replace(" ", "")
    m = _KIND_RE.match(k)
    if not m or (k != "PQ" and "," not in k):
        raise ScalingNoteError(f"index kind {kind!r}: expected 'PQ', 'IVF<nlist>,PQ' or 'HNSW<M>,PQ'")
    if m.group("ivf"):
        n = int(m.group("nlist"))
        if n < 1:
            raise ScalingNoteError(f"index kind {kind!r}: nlist must be >= 1")
        return "ivf", n
    if m.group("hnsw"):
        n = int(m.group("hm"))
        if n < 2:
            raise ScalingNoteError(f"index kind {kind!r}: HNSW M must be >= 2")
        return "hnsw", n
    return "pq", None


def factory_label(pq: Codebooks, kind: str) -> str:
    """A FAISS-factory-like description stored in the manifest, e.g. ``learned:OPQ16,IVF64,PQ16x8``."""
    base, n = parse_kind(kind)
    parts = [f"OPQ{pq.m}"] if pq.rotation is not None else []
    if base == "ivf":
        parts.append(f"IVF{n}")
        parts.append(f"PQ{pq.m}x{pq.nbits}(flat codes)")
    elif base == "hnsw":
        parts.append(f"HNSW{n}_PQ{pq.m}x{pq.nbits}")
    else:
        parts.append(f"PQ{pq.m}x{pq.nbits}")
    return "learned:" + ",".join(parts)


def _set_centroids(faiss_pq, pq: Codebooks) -> None:
    import faiss

    if (faiss_pq.M, faiss_pq.nbits, faiss_pq.d) != (pq.m, pq.nbits, pq.dim):
        raise ScalingNoteError(
            f"FAISS PQ is M={faiss_pq.M} nbits={faiss_pq.nbits} d={faiss_pq.d}, learned PQ is {pq.describe()}"
        )
    cb = np.ascontiguousarray(pq.codebooks.detach().cpu().numpy().astype(np.float32).ravel())
    faiss.copy_array_to_vector(cb, faiss_pq.centroids)


def faiss_index(
    pq: Codebooks, kind: str = "PQ", *, train_vectors: np.ndarray | None = None, seed: int = 0, kmeans_iter: int = 20
):
    """A trained, empty FAISS index (inner product) holding the learned centroids (and rotation).

    ``train_vectors``: document vectors for the IVF coarse quantizer (``IVF*`` kinds only).
    """
    import faiss

    base, n = parse_kind(kind)
    d = pq.dim
    metric = faiss.METRIC_INNER_PRODUCT
    # faiss's stub types the SWIG classes loosely (no IndexHNSWPQ(d, pq_m, M, nbits, metric), no
    # ``this`` / ``own_fields``): the index objects below are used as untyped SWIG objects
    inner: Any
    if base == "pq":
        inner = faiss.IndexPQ(d, pq.m, pq.nbits, metric)
        _set_centroids(inner.pq, pq)
        inner.is_trained = True
    elif base == "ivf":
        assert n is not None  # parse_kind gives IVF kinds their nlist
        if train_vectors is None:
            raise ScalingNoteError(f"index kind {kind!r}: the IVF coarse quantizer needs training vectors")
        x = np.ascontiguousarray(np.asarray(train_vectors, dtype=np.float32))
        if x.shape[0] < n:
            raise ScalingNoteError(f"index kind {kind!r}: {x.shape[0]} vectors < nlist={n}")
        if pq.rotation is not None:
            x = np.ascontiguousarray(x @ pq.rotation.detach().cpu().numpy().T)
        # spherical k-means, as FAISS trains an inner-product IVF coarse quantizer
        km = faiss.Kmeans(d, n, niter=kmeans_iter, seed=seed, spherical=True, verbose=False, min_points_per_centroid=1)
        km.train(x)
        quantizer: Any = faiss.IndexFlatIP(d)
        quantizer.add(km.centroids)
        inner = faiss.IndexIVFPQ(quantizer, d, n, pq.m, pq.nbits, metric)
        inner.by_residual = False  # the learned codebooks quantize the vectors, not residuals
        _set_centroids(inner.pq, pq)
        inner.is_trained = True
        inner.own_fields = True
        quantizer.this.disown()
    else:
        # L2, as FAISS's factory builds HNSW_PQ: the graph is built with symmetric L2 code
        # distances, which FAISS 1.15 negates under METRIC_INNER_PRODUCT (measured recall@10
        # of the PQ ranking 0.73 vs 1.0 at efSearch 128). On unit vectors the L2 score is
        # 1 - ||q - x̂||²/2 = <q, x̂> - (||x̂||² - 1)/2 (DenseIndex reports it so): the same
        # ranking as IndexPQ up to the small ||x̂||² term; rerank=N re-scores exactly.
        assert n is not None  # parse_kind gives HNSW kinds their M
        inner = faiss.IndexHNSWPQ(d, pq.m, n, pq.nbits, faiss.METRIC_L2)  # type: ignore[call-arg,arg-type]
        storage: Any = faiss.downcast_index(inner.storage)
        _set_centroids(storage.pq, pq)
        storage.pq.compute_sdc_table()  # the graph is built with symmetric code-to-code distances
        storage.is_trained = True
        inner.is_trained = True
    if pq.rotation is None:
        return inner
    lt: Any = faiss.LinearTransform(d, d, False)
    faiss.copy_array_to_vector(
        np.ascontiguousarray(pq.rotation.detach().cpu().numpy().astype(np.float32).ravel()), lt.A
    )
    lt.is_trained = True
    index = faiss.IndexPreTransform(lt, inner)
    index.own_fields = True
    inner.this.disown()
    lt.this.disown()
    return index


def export_index(
    pq: Codebooks,
    doc_vectors: np.ndarray,
    doc_ids: Sequence[str],
    out_dir: str | Path,
    kind: str = "PQ",
    *,
    tower_info: dict[str, Any] | None = None,
    seed: int = 0,
    nprobe: int | None = None,
    ef_search: int | None = None,
    semantic_ids_layers: int = 0,
    codebook_size: int = 256,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Build an index directory (``scalingnote-index/1``) with the learned codebooks.

    ``doc_vectors``: the documents' embeddings from the (trained) document tower, ``(n, dim)``
    (normalised here as by :func:`~scalingnote.index.build_index`); every code is the
    nearest learned centroid. ``tower_info``: :func:`~scalingnote.index.tower_identity` of
    the document tower, so :meth:`DenseIndex.open` can check the query tower. ``nprobe`` /
    ``ef_search``: stored search defaults, used by the kinds they apply to (IVF / HNSW). The
    manifest gets a ``learned_pq`` entry (shape, rotation, kind).
    """
    x = np.asarray(doc_vectors, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != pq.dim:
        raise ScalingNoteError(f"doc_vectors: expected shape (n, {pq.dim}), got {x.shape}")
    x = l2_normalize(x)
    base, _ = parse_kind(kind)
    index = faiss_index(pq, kind, train_vectors=x, seed=seed)
    path = build_index(
        x,
        out_dir,
        factory_label(pq, kind),
        doc_ids=doc_ids,
        tower_info=tower_info,
        seed=seed,
        semantic_ids_layers=semantic_ids_layers,
        codebook_size=codebook_size,
        nprobe=nprobe if base == "ivf" else None,
        ef_search=ef_search if base == "hnsw" else None,
        overwrite=overwrite,
        progress=progress,
        index=index,
    )
    man = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    man["learned_pq"] = {**pq.describe(), "kind": kind, "by_residual": False if base == "ivf" else None}
    write_json(path / MANIFEST, man)
    return path


def faiss_codes(index, x: np.ndarray) -> np.ndarray:
    """PQ codes FAISS computes for ``x`` (``sa_encode``) with an ``IndexPQ`` / ``IndexHNSWPQ``
    storage, behind an optional pre-transform: ``uint8 (n, code_size)``."""
    import faiss

    idx = faiss.downcast_index(index)
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if isinstance(idx, faiss.IndexPreTransform):
        chain: Any = idx.chain  # a SWIG vector (the stub types it as a list)
        for i in range(chain.size()):
            x = faiss.downcast_VectorTransform(chain.at(i)).apply(x)
        idx = faiss.downcast_index(idx.index)
    if isinstance(idx, faiss.IndexHNSW):
        idx = faiss.downcast_index(idx.storage)
    if not isinstance(idx, faiss.IndexPQ):
        raise ScalingNoteError(f"faiss_codes: expected an IndexPQ, got {type(idx).__name__}")
    return idx.sa_encode(x)
