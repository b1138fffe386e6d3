"""Build a FAISS dense index from document embeddings and save it with a manifest (searched by
:class:`~scalingnote.index.faiss.dense.DenseIndex`).

Index directory layout (``scalingnote-index/1``), built in a temporary directory and
renamed into place, so a reader never sees a half-built index::

    <dir>/manifest.json      settings, identity of the document tower, sizes, timings
    <dir>/index.faiss        the FAISS index (faiss.write_index); method svs_vamana: the
                             directory index.svs/ (SVS's graph), scann_soar: index.scann/
                             (ScaNN's searcher); the manifest's files.index names it
    <dir>/vectors.npy        full-precision float32 (n, dim) vectors, L2-normalised,
                             memory-mapped at search time for the exact re-rank
    <dir>/doc_ids.json       JSON list: FAISS row i <-> document id doc_ids[i]
    <dir>/semantic_ids.npy   int32 (n, L) residual-K-means semantic IDs (if enabled)
    <dir>/semantic_ids.npz   the residual-K-means codebooks (assign new documents)
    <dir>/docs.jsonl         (when the corpus is known) one line per FAISS row:
                             {"id", "title", "snippet"}; search results carry them
    <dir>/bm25/              (optional) the BM25 index over the same documents, for
                             hybrid search (:mod:`scalingnote.sparse.bm25`, :mod:`scalingnote.index.hybrid`)

The full-precision vectors are *copied* into the index directory (not referenced
from the embeddings directory): an index is self-contained and survives deletion or
re-encoding of the embeddings, at the cost of ``4 * dim`` bytes per document on disk.
They are the Matryoshka prefix actually indexed (first ``dim`` components of the
document embedding, re-normalised).

Similarity is the inner product of L2-normalised vectors (cosine), as in
ScalingNote §3 and TMJ §6. ``faiss.index_factory(d, factory,
faiss.METRIC_INNER_PRODUCT)`` is used; a few FAISS index types ignore the metric
argument (``HNSW{m}_PQ{M}`` is built with L2); for those the L2 distance of unit
vectors is converted back to a similarity ``1 - d/2`` (same ranking as cosine when
the stored codes have unit norm) and the manifest records ``faiss_metric: "l2"``.

Re-rank (TMJ §6, "post-processing"): retrieve the top ``N`` candidates from the
compressed index, re-score them exactly with the full-precision vectors and keep
the top ``k`` — TMJ's "Recall 2@20" is ``k=2, rerank=20``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.config import cli_meta
from scalingnote.data.types import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index.build_files import write_index_files
from scalingnote.index.build_source import BuildSource, build_inputs, resolve_source, write_vectors
from scalingnote.index.embeddings import Embeddings
from scalingnote.index.engine_files import is_engine
from scalingnote.index.faiss import methods
from scalingnote.index.faiss.faiss_utils import (
    _faiss_message,
    _prepare_training,
    find_hnsw,
    find_ivf,
    make_index,
)
from scalingnote.index.layout import (
    DEFAULT_EF_SEARCH,
    DEFAULT_NPROBE,
    MANIFEST,
    SEMANTIC_CODEBOOKS_FILE,
    SEMANTIC_IDS_FILE,
    VECTORS_FILE,
    _replace_dir,
)
from scalingnote.index.settings import IndexBuildSettings
from scalingnote.utils.steps import describe_changes, input_digest

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class IndexConfig(IndexBuildSettings):
    """Index-building settings: the ones a Milvus export shares (:class:`IndexBuildSettings`) plus
    the FAISS factory, the stored search defaults and what to do with an existing directory.
    ``scalingnote index build`` generates its options from these fields, and :func:`build_index`
    takes them as keywords (``build_index(src, out, **cfg.kwargs())``)."""

    factory: str = field(
        default="Flat",
        metadata=cli_meta("FAISS factory string, e.g. Flat, IVF256,PQ48x8, HNSW32, HNSW32_PQ48, OPQ48,IVF256,PQ48."),
    )
    nprobe: int | None = field(default=None, metadata=cli_meta("Default IVF probes stored in the index.", min=1))
    ef_search: int | None = field(default=None, metadata=cli_meta("Default HNSW efSearch stored in the index.", min=1))
    overwrite: bool = field(default=False, metadata=cli_meta("Replace an existing index directory."))
    reuse: bool = field(
        default=False,
        metadata=cli_meta(
            "Keep an existing index directory built from the same inputs (refuse one built from others)."
        ),
    )
    method: str | None = field(
        default=None,
        metadata=cli_meta(
            "Routed structure instead of --factory: ivf, ivf_qmetric, ivf_rabitq, ivf_pqfs, hnsw, hnsw_pq, hnsw_sq, "
            "hnsw_sq_qg, hnsw_lean, svs_vamana or scann_soar, sizes from the corpus (scalingnote.index.faiss.methods)."
        ),
    )
    train_queries: str | None = field(
        default=None,
        metadata=cli_meta(
            "(--method ivf_qmetric / hnsw_sq_qg / hnsw_lean) .npy of training/pseudo-query vectors of the served "
            "query tower: lists cut in their metric / query-guided edges (and hnsw_lean's projection)."
        ),
    )

    def kwargs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- build


def build_index(
    source: str | Path | Embeddings | np.ndarray,
    out_dir: str | Path,
    factory: str = "Flat",
    *,
    settings: IndexBuildSettings | None = None,
    doc_ids: Sequence[str] | None = None,
    tower_info: dict[str, Any] | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
    add_batch_size: int = 65_536,
    polysemous_training: bool = False,
    index: Any = None,
    documents: str | Path | Mapping[str, Document] | Iterable[Document] | None = None,
    overwrite: bool = False,
    reuse: bool = False,
    progress: bool = True,
    method: str | None = None,
    routing: Any = None,
    train_queries: str | Path | np.ndarray | None = None,
    routing_state: dict[str, np.ndarray] | None = None,
    **options: Any,
) -> Path:
    """Build a FAISS index over document embeddings and save it to ``out_dir``.

    ``source``: an embeddings directory (:func:`~scalingnote.index.encode_corpus`), a
    loaded :class:`~scalingnote.index.Embeddings`, or a float array ``(n, d)`` with
    ``doc_ids`` (then ``tower_info`` may name the document tower).
    ``settings`` (:class:`~scalingnote.index.settings.IndexBuildSettings`), or its fields as
    keywords (``options``: ``dim``, ``train_size``, ``seed``, ``semantic_ids_layers``,
    ``codebook_size``): ``dim`` is the Matryoshka prefix to index (default: all components;
    vectors are cut to the first ``dim`` components and re-normalised); ``train_size`` the size
    of the seeded random training sample (FAISS training and semantic-ID codebooks);
    ``semantic_ids_layers=0`` disables semantic IDs.
    ``nprobe`` / ``ef_search``: defaults stored for searches that do not pass them.
    ``polysemous_training``: keep FAISS's polysemous PQ training (off by default, see
    :func:`_prepare_training`). ``index``: an already trained, empty FAISS index to fill
    instead of building one from ``factory`` (then only a label in the manifest), e.g. a
    learned PQ (:mod:`scalingnote.index.faiss.learned_pq`). ``documents``: the corpus (BEIR
    directory, corpus.jsonl, or Documents) whose titles + snippets are stored with the index
    and returned by search; default: the corpus recorded by the embeddings directory, if any.
    The manifest records the build's inputs (:func:`build_inputs`); an existing ``out_dir`` is
    replaced (``overwrite``), kept (``reuse``) when built from the same inputs, else refused
    naming the inputs that differ. Returns ``out_dir``.

    ``method`` (one of :data:`scalingnote.index.faiss.methods.SERVABLE`) builds that routed structure instead of
    ``factory`` (``routing``: a :class:`~scalingnote.index.routing.routing.RoutingConfig` or its dict, default sizes
    from :func:`~scalingnote.index.faiss.methods.default_routing`; ``train_queries``: query-tower vectors
    of training queries, or a ``.npy`` file of them, for ``ivf_qmetric`` / ``hnsw_sq_qg`` / ``hnsw_lean``;
    ``routing_state``: the stored rule of an earlier build, for compaction and rebuild). ``factory`` is then the label
    ``<method>:<structure>`` and the manifest's ``routing`` names the method and its parameters.
    """
    t_start = time.perf_counter()
    s = IndexBuildSettings.resolve(settings, options, "build_index")
    out_dir = Path(out_dir)
    src = resolve_source(source, doc_ids, tower_info)
    dim = s.prefix_dim(src.dim)
    routed, tq = None, None
    if method is not None:
        routed = methods.routing_from(routing, method, len(src.ids), dim, s.seed, s.train_size)
        tq = methods.train_query_vectors(train_queries, dim)
        factory = method
    settings_in = _input_settings(factory, s, nprobe, ef_search, polysemous_training, routed, tq, routing_state)
    inputs = build_inputs(src, settings_in, documents, prebuilt=index is not None)
    if out_dir.exists() and _keep_existing(out_dir, inputs, overwrite=overwrite, reuse=reuse):
        return out_dir
    if s.train_size < 1:
        raise ScalingNoteError(f"train_size must be >= 1, got {s.train_size}")
    if routed is None:
        index = _empty_index(index, dim, factory, s.seed, polysemous_training)
        search_defaults = _search_defaults(index, factory, nprobe, ef_search)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        extra: dict[str, Any] = {}
        if routed is not None:
            index, extra = _fill_routed(tmp_dir, routed, src, dim, s, tq, routing_state, index, add_batch_size)
            factory = extra["factory"]
            search_defaults = _search_defaults(index, factory, nprobe, ef_search)
            n_train, sem_info, timings = extra.pop("n_train"), extra.pop("semantic_ids"), extra.pop("timings")
        else:
            n_train, sem_info, timings = _fill_index(tmp_dir, index, factory, src, dim, s, add_batch_size, progress)
        sampling = {
            "train_size": int(s.train_size),
            "n_train": n_train,
            "seed": int(s.seed),
            "search_defaults": search_defaults,
            "semantic_ids": sem_info,
            "inputs": inputs,
            "inputs_sha256": input_digest(inputs),
            **{k: v for k, v in extra.items() if k != "factory"},
        }
        write_index_files(tmp_dir, index, factory, src, dim, documents, sampling, timings, t_start)
        _replace_dir(tmp_dir, out_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return out_dir


def _input_settings(
    factory: str,
    s: IndexBuildSettings,
    nprobe: int | None,
    ef_search: int | None,
    polysemous_training: bool,
    routed: Any,
    tq: np.ndarray | None,
    routing_state: dict[str, np.ndarray] | None,
) -> dict[str, Any]:
    """The build settings recorded among the index's inputs (:func:`build_inputs`)."""
    settings_in: dict[str, Any] = dict(
        factory=factory.strip(),
        dim=s.dim,
        train_size=s.train_size,
        seed=s.seed,
        semantic_ids_layers=s.semantic_ids_layers,
        codebook_size=s.codebook_size,
        nprobe=nprobe,
        ef_search=ef_search,
        polysemous_training=polysemous_training,
    )
    if routed is not None:  # only routed builds add these keys: older indexes keep their input digests
        settings_in.update(
            routing=dataclasses.asdict(routed),
            train_queries=None if tq is None else hashlib.sha256(tq.tobytes()).hexdigest(),
            routing_state=None if not routing_state else sorted(routing_state),
        )
    return settings_in


def _fill_routed(
    tmp_dir: Path,
    cfg: Any,
    src: BuildSource,
    dim: int,
    s: IndexBuildSettings,
    tq: np.ndarray | None,
    state: dict | None,
    empty: Any,
    chunk: int,
) -> tuple[Any, dict[str, Any]]:
    """Write the vectors and build the routed structure of ``cfg.method`` over them
    (:func:`scalingnote.index.faiss.methods.fill_routed`); the semantic IDs as :func:`_fill_index` fits them."""
    vectors = write_vectors(tmp_dir / VECTORS_FILE, src, dim, chunk)
    t0 = time.perf_counter()
    try:
        index, new_state = methods.fill_routed(np.asarray(vectors), cfg, train_queries=tq, state=state, empty=empty)
    except RuntimeError as e:
        raise ScalingNoteError(
            f"method {cfg.method!r}: building over {len(src.ids)} vectors failed: {_faiss_message(e)}"
        ) from None
    timings = {"train_seconds": 0.0, "add_seconds": time.perf_counter() - t0}
    if index.ntotal != len(src.ids):
        raise ScalingNoteError(f"FAISS index holds {index.ntotal} vectors after adding {len(src.ids)}")
    train_rows = s.training_rows(len(src.ids))
    t0 = time.perf_counter()
    sem_info = _semantic_ids(tmp_dir, vectors, np.ascontiguousarray(vectors[train_rows]), s, chunk)
    timings["semantic_ids_seconds"] = time.perf_counter() - t0
    del vectors
    file = methods.save_state(tmp_dir, new_state)
    entry = methods.manifest_entry(cfg, file, None if tq is None else int(len(tq)))
    return index, {
        "factory": methods.structure_label(index, cfg),
        "routing": entry,
        "n_train": len(train_rows),
        "semantic_ids": sem_info,
        "timings": timings,
    }


def _empty_index(index: Any, dim: int, factory: str, seed: int, polysemous_training: bool) -> Any:
    """A new untrained FAISS index from ``factory``, or ``index`` checked to be trained, empty and ``dim``-d."""
    if index is None:
        index = make_index(dim, factory)
        _prepare_training(index, seed, polysemous_training)
    elif not index.is_trained or index.ntotal != 0 or index.d != dim:
        raise ScalingNoteError(
            f"index: a prebuilt index must be trained, empty and {dim}-d (is_trained={index.is_trained}, "
            f"ntotal={index.ntotal}, d={index.d})"
        )
    return index


def _fill_index(
    tmp_dir: Path,
    index: Any,
    factory: str,
    src: BuildSource,
    dim: int,
    s: IndexBuildSettings,
    chunk: int,
    progress: bool,
) -> tuple[int, dict[str, Any] | None, dict[str, float]]:
    """Write the vectors, train and fill ``index`` and fit the semantic IDs on one seeded sample;
    returns the sample size, the semantic IDs' manifest entry and the timings."""
    # 1. full-precision (Matryoshka prefix, re-normalised) vectors, memory-mapped
    vectors = write_vectors(tmp_dir / VECTORS_FILE, src, dim, chunk)
    # 2. seeded training sample; train and fill the FAISS index
    train_rows = s.training_rows(len(src.ids))
    train_x = np.ascontiguousarray(vectors[train_rows])
    timings = _train_and_add(index, factory, vectors, train_x, chunk, progress)
    # 3. semantic IDs (ScalingNote §3.5): residual K-means fitted on the same sample
    t0 = time.perf_counter()
    sem_info = _semantic_ids(tmp_dir, vectors, train_x, s, chunk)
    timings["semantic_ids_seconds"] = time.perf_counter() - t0
    del vectors
    return len(train_rows), sem_info, timings


def _keep_existing(out_dir: Path, inputs: dict[str, Any], *, overwrite: bool, reuse: bool) -> bool:
    """True: ``out_dir`` was built from ``inputs`` and ``reuse`` keeps it. False: rebuild it
    (``overwrite``). Otherwise refused, naming the inputs that differ."""
    try:
        old = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = {}
    same = (
        old.get("inputs_sha256") == input_digest(inputs)
        and not inputs.get("prebuilt_index")
        and inputs.get("documents") != "<iterable>"
    )
    what = (
        describe_changes(old["inputs"], inputs) if isinstance(old.get("inputs"), dict) else "it records no build inputs"
    )
    if not (overwrite or reuse):
        raise ScalingNoteError(
            f"{out_dir}: already exists (built from {'the same' if same else 'other'} inputs); "
            "pass overwrite=True / --overwrite to replace it, reuse=True / --reuse to keep one built from the "
            "same inputs"
        )
    if same and reuse:
        log.info("%s: built from the same inputs; reused", out_dir)
        return True
    if overwrite:
        if not same:
            log.warning("%s: replacing an index built from other inputs (%s)", out_dir, what)
        return False
    raise ScalingNoteError(
        f"{out_dir}: already exists, built from other inputs ({what}); pass overwrite=True / --overwrite to replace it"
    )


def _search_defaults(index, factory: str, nprobe: int | None, ef_search: int | None) -> dict[str, int]:
    """The ``search_defaults`` manifest entry; refuses nprobe / ef_search on an index without IVF / HNSW."""
    import faiss

    ivf, hnsw = find_ivf(index), find_hnsw(index)
    out: dict[str, int] = {}
    parts = ivf if ivf is not None else (index if is_engine(index) and index.partitioned else None)  # ScaNN's tree
    if parts is not None:
        out["nprobe"] = int(min(parts.nlist, nprobe if nprobe is not None else DEFAULT_NPROBE))
    elif nprobe is not None:
        raise ScalingNoteError(f"nprobe={nprobe} given, but index {factory!r} has no IVF layer")
    graph = hnsw is not None or (is_engine(index) and index.graph)  # FAISS HNSW or SVS's Vamana
    if graph or (ivf is not None and isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexHNSW)):
        out["ef_search"] = int(ef_search if ef_search is not None else DEFAULT_EF_SEARCH)
    elif ef_search is not None:
        raise ScalingNoteError(f"ef_search={ef_search} given, but index {factory!r} has no HNSW graph")
    return out


def _train_and_add(
    index, factory: str, vectors: np.ndarray, train_x: np.ndarray, chunk: int, progress: bool
) -> dict[str, float]:
    from tqdm.auto import tqdm

    n = vectors.shape[0]
    t0 = time.perf_counter()
    if not index.is_trained:
        try:
            index.train(train_x)
        except RuntimeError as e:
            raise ScalingNoteError(
                f"factory {factory!r}: training on {len(train_x)} vectors failed: {_faiss_message(e)} "
                "(use a smaller IVF/PQ size or a larger --train-size)"
            ) from None
    train_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    with tqdm(total=n, unit="vec", desc=f"add {factory}", disable=not progress, dynamic_ncols=True) as bar:
        for s in range(0, n, chunk):
            block = np.ascontiguousarray(vectors[s : s + chunk])
            index.add(block)
            bar.update(len(block))
    add_seconds = time.perf_counter() - t0
    if index.ntotal != n:
        raise ScalingNoteError(f"FAISS index holds {index.ntotal} vectors after adding {n}")
    return {"train_seconds": train_seconds, "add_seconds": add_seconds}


def _semantic_ids(
    tmp_dir: Path, vectors: np.ndarray, train_x: np.ndarray, s: IndexBuildSettings, chunk: int
) -> dict[str, Any] | None:
    """Residual-K-means semantic IDs of every document (``semantic_ids.npy``) + codebooks."""
    rkm = s.fit_semantic_ids(train_x)
    if rkm is None:
        return None
    n = vectors.shape[0]
    codes = np.lib.format.open_memmap(tmp_dir / SEMANTIC_IDS_FILE, mode="w+", dtype=np.int32, shape=(n, rkm.n_layers))
    for start in range(0, n, chunk):
        codes[start : start + chunk] = rkm.assign(vectors[start : start + chunk])
    codes.flush()
    del codes
    rkm.save(tmp_dir / SEMANTIC_CODEBOOKS_FILE)
    return {"file": SEMANTIC_IDS_FILE, "codebooks": SEMANTIC_CODEBOOKS_FILE, **rkm.describe()}
