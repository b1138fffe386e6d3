"""FAISS helpers: index construction from a factory string, finding the IVF / HNSW layers of a
composite index, code sizes, training preparation and per-call search parameters."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from scalingnote.errors import ScalingNoteError

# --------------------------------------------------------------------------- FAISS helpers


def trained_ivf(
    docs: np.ndarray,
    factory: str,
    *,
    seed: int,
    train_size: int,
    kmeans_iters: int,
    attrs: dict[str, Any] | None = None,
) -> Any:
    """A trained and filled inner-product FAISS IVF index of ``factory`` (e.g. ``IVF4000,PQ128x4fs``)
    over ``docs`` [N, d]: k-means seeded with ``seed`` for ``kmeans_iters`` iterations on at most
    ``train_size`` sampled rows; ``attrs`` set on the index before training (e.g. RaBitQ's ``qb``)."""
    import faiss  # why: FAISS loads with the index package's searchers, not at import

    n, d = docs.shape
    # untyped SWIG objects: faiss's stub has no ``thisown`` and types downcast_index as the base Index
    made: Any = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    index: Any = faiss.downcast_index(made)
    made.thisown, index.thisown = False, True  # one owner: the typed wrapper
    index.cp.seed = int(seed)
    index.cp.niter = int(kmeans_iters)
    for key, value in (attrs or {}).items():
        setattr(index, key, value)
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(n, train_size, replace=False)) if n > train_size else np.arange(n)
    index.train(np.ascontiguousarray(docs[sample]))
    index.add(docs)
    return index


def search_ivf_counted(
    index: Any, q: np.ndarray, depth: int, nprobe: int, params: Any = None
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(scores, ids, coarse distances, codes scanned)`` of a ``depth``-deep search of a FAISS IVF
    index probing ``nprobe`` lists (per-call ``params``, default ``SearchParametersIVF``: the index is
    not mutated; the codes from FAISS's IVF statistics, as the other IVF methods count them)."""
    import faiss

    if params is None:
        params = faiss.SearchParametersIVF()
    params.nprobe = int(min(max(1, nprobe), index.nlist))
    stats: Any = faiss.cvar  # FAISS's global counters; its stub lists none of them
    stats.indexIVF_stats.reset()
    scores, ids = index.search(q, depth, params=params)
    return scores, ids, int(index.nlist) * len(q), int(stats.indexIVF_stats.ndis)


def _faiss_message(e: BaseException) -> str:
    """The useful part of a FAISS C++ error message."""
    msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    for marker in ("failed: ", "Error: "):
        if marker in msg:
            msg = msg.rsplit(marker, 1)[1]
            break
    return msg.strip()


def make_index(dim: int, factory: str):
    """``faiss.index_factory(dim, factory, METRIC_INNER_PRODUCT)`` with a clear error on a bad string."""
    import faiss

    if not factory or not factory.strip():
        raise ScalingNoteError("factory: empty FAISS factory string")
    try:
        return faiss.index_factory(int(dim), factory.strip(), faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ScalingNoteError(f"factory {factory!r} (dim {dim}): FAISS cannot build it: {_faiss_message(e)}") from None


def _layers(index) -> Iterator[Any]:
    """Walk the wrapper chain: PreTransform -> IVF / HNSW (-> storage / quantizer). Another engine's
    structure shaped as a FAISS index (it names its ``engine``) is one layer."""
    import faiss

    if getattr(index, "engine", None) is not None:
        yield index
        return
    idx = faiss.downcast_index(index)
    yield idx
    if isinstance(idx, faiss.IndexPreTransform):
        yield from _layers(idx.index)
    elif isinstance(idx, faiss.IndexHNSW):
        yield from _layers(idx.storage)
    elif isinstance(idx, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        yield from _layers(idx.index)


def find_ivf(index):
    """The IVF layer of ``index`` (through OPQ/pre-transform wrappers), or None."""
    import faiss

    for layer in _layers(index):
        if isinstance(layer, faiss.IndexIVF):
            return layer
    return None


def find_hnsw(index):
    """The top-level HNSW graph index of ``index`` (through wrappers), or None."""
    import faiss

    for layer in _layers(index):
        if isinstance(layer, faiss.IndexHNSW):
            return layer
    return None


def code_bytes_per_vector(index) -> int | None:
    """Bytes of the stored code of one vector (PQ/SQ/flat codes; not ids or graph links)."""
    import faiss

    ivf = find_ivf(index)
    if ivf is not None:
        return int(ivf.code_size)
    for layer in _layers(index):
        if isinstance(layer, (faiss.IndexPreTransform, faiss.IndexHNSW)):
            continue
        try:
            return int(layer.sa_code_size())
        except RuntimeError:
            continue
    return None


def _prepare_training(index, seed: int, polysemous_training: bool) -> None:
    """Seed the K-means of IVF coarse quantisers and PQ codebooks (FAISS default: a fixed
    1234) and switch off polysemous training unless asked for.

    FAISS's factory enables polysemous training for ``PQ{M}`` (``PQ{M}np`` disables it):
    it permutes PQ centroids so Hamming distances between codes approximate L2, which
    only matters for polysemous (Hamming-filtered) search, which this package does not
    use; it costs seconds to minutes per index and does not change ADC search results.
    """
    import faiss

    for layer in _layers(index):
        with contextlib.suppress(AttributeError):
            if isinstance(layer, faiss.IndexIVF):
                layer.cp.seed = int(seed)
            if hasattr(layer, "pq") and hasattr(layer.pq, "cp"):
                layer.pq.cp.seed = int(seed) + 1
            if hasattr(layer, "do_polysemous_training") and not polysemous_training:
                layer.do_polysemous_training = False


def _search_params(index, nprobe: int | None, ef_search: int | None, factory: str, sel: Any = None):
    """Per-call FAISS SearchParameters (thread-safe, no global index mutation).

    Returns ``(params_or_None, keepalive)``; ``keepalive`` holds nested parameter
    objects that the C++ side only references. ``sel``: a FAISS ``IDSelector`` applied by a
    top-level HNSW or Flat index (the live index's tombstones: FAISS HNSW has no ``remove_ids``).
    """
    import faiss

    if getattr(index, "engine", None) is not None:  # another engine's structure checks its own options
        return index.search_params(nprobe, ef_search, factory, sel), []
    keep: list[Any] = []
    used = {"nprobe": False, "ef_search": False}

    def build(idx):
        idx = faiss.downcast_index(idx)
        if isinstance(idx, faiss.IndexPreTransform):
            inner = build(idx.index)
            if inner is None:
                return None
            keep.append(inner)
            return faiss.SearchParametersPreTransform(index_params=inner)
        if isinstance(idx, faiss.IndexIVF):
            kw: dict[str, Any] = {}
            if nprobe is not None:
                if nprobe < 1:
                    raise ScalingNoteError(f"nprobe must be >= 1, got {nprobe}")
                kw["nprobe"] = int(min(nprobe, idx.nlist))
                used["nprobe"] = True
            q = faiss.downcast_index(idx.quantizer)
            if ef_search is not None and isinstance(q, faiss.IndexHNSW):
                qp = faiss.SearchParametersHNSW(efSearch=int(ef_search))
                keep.append(qp)
                kw["quantizer_params"] = qp
                used["ef_search"] = True
            return faiss.SearchParametersIVF(**kw) if kw else None
        if isinstance(idx, faiss.IndexHNSW):
            if ef_search is not None:
                if ef_search < 1:
                    raise ScalingNoteError(f"ef_search must be >= 1, got {ef_search}")
                used["ef_search"] = True
            if ef_search is None and sel is None:
                return None
            return faiss.SearchParametersHNSW(
                efSearch=int(ef_search if ef_search is not None else idx.hnsw.efSearch), sel=sel
            )
        if sel is not None and isinstance(idx, faiss.IndexFlat):
            return faiss.SearchParameters(sel=sel)
        return None

    params = build(index)
    if nprobe is not None and not used["nprobe"]:
        raise ScalingNoteError(f"nprobe={nprobe} given, but index {factory!r} has no IVF layer")
    if ef_search is not None and not used["ef_search"]:
        raise ScalingNoteError(f"ef_search={ef_search} given, but index {factory!r} has no HNSW graph")
    return params, keep
