"""FAISS dense indexes: build from a factory string, save with a manifest, search with
optional exact re-rank, return semantic IDs with the results.

Index directory layout (``scalingnote-index/1``), built in a temporary directory and
renamed into place, so a reader never sees a half-built index::

    <dir>/manifest.json      settings, identity of the document tower, sizes, timings
    <dir>/index.faiss        the FAISS index (faiss.write_index)
    <dir>/vectors.npy        full-precision float32 (n, dim) vectors, L2-normalised,
                             memory-mapped at search time for the exact re-rank
    <dir>/doc_ids.json       JSON list: FAISS row i <-> document id doc_ids[i]
    <dir>/semantic_ids.npy   int32 (n, L) residual-K-means semantic IDs (if enabled)
    <dir>/semantic_ids.npz   the residual-K-means codebooks (assign new documents)
    <dir>/docs.jsonl         (when the corpus is known) one line per FAISS row:
                             {"id", "title", "snippet"}; search results carry them
    <dir>/bm25/              (optional) the BM25 index over the same documents, for
                             hybrid search (:mod:`scalingnote.index.bm25`, :mod:`scalingnote.index.hybrid`)

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

import contextlib
import datetime as _dt
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.data.types import Document, Run
from scalingnote.errors import ScalingNoteError
from scalingnote.index.embeddings import Embeddings, l2_normalize, load_embeddings, tower_identity
from scalingnote.index.semantic_ids import ResidualKMeans

FORMAT = "scalingnote-index/1"
MANIFEST = "manifest.json"
INDEX_FILE = "index.faiss"
VECTORS_FILE = "vectors.npy"
DOC_IDS_FILE = "doc_ids.json"
SEMANTIC_IDS_FILE = "semantic_ids.npy"
SEMANTIC_CODEBOOKS_FILE = "semantic_ids.npz"
DOCS_FILE = "docs.jsonl"
SNIPPET_CHARS = 240

DEFAULT_NPROBE = 16
DEFAULT_EF_SEARCH = 128


# --------------------------------------------------------------------------- FAISS helpers


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
    """Walk the wrapper chain: PreTransform -> IVF / HNSW (-> storage / quantizer)."""
    import faiss

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


def _search_params(index, nprobe: int | None, ef_search: int | None, factory: str):
    """Per-call FAISS SearchParameters (thread-safe, no global index mutation).

    Returns ``(params_or_None, keepalive)``; ``keepalive`` holds nested parameter
    objects that the C++ side only references.
    """
    import faiss

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
                return faiss.SearchParametersHNSW(efSearch=int(ef_search))
            return None
        return None

    params = build(index)
    if nprobe is not None and not used["nprobe"]:
        raise ScalingNoteError(f"nprobe={nprobe} given, but index {factory!r} has no IVF layer")
    if ef_search is not None and not used["ef_search"]:
        raise ScalingNoteError(f"ef_search={ef_search} given, but index {factory!r} has no HNSW graph")
    return params, keep


# --------------------------------------------------------------------------- document store


def make_snippet(text: str, max_chars: int = SNIPPET_CHARS) -> str:
    """The first ``max_chars`` characters of ``text`` (whitespace collapsed), cut at a word
    boundary when one is near, with an ellipsis when cut."""
    t = " ".join(str(text).split())
    if len(t) <= max_chars:
        return t
    cut = t[:max_chars]
    space = cut.rfind(" ")
    if space >= max_chars * 0.6:
        cut = cut[:space]
    return cut.rstrip() + "\u2026"


def _documents_by_id(documents: str | Path | Mapping[str, Document] | Iterable[Document]) -> tuple[dict[str, Document], str | None]:
    """``{id: Document}`` from a BEIR directory, a corpus.jsonl, a mapping or an iterable."""
    if isinstance(documents, (str, Path)):
        from scalingnote.data.beir import corpus_file, iter_corpus

        p = corpus_file(documents)
        # on_invalid="skip": a bad record costs one title, not the index
        return {d.id: d for d in iter_corpus(p, on_invalid="skip")}, str(p.resolve())
    if isinstance(documents, Mapping):
        return dict(documents), None
    return {d.id: d for d in documents}, None


def _corpus_of_embeddings(embeddings_dir: str | None) -> Path | None:
    """The corpus file recorded by an embeddings directory's manifest, if it still exists."""
    if not embeddings_dir:
        return None
    try:
        man = json.loads((Path(embeddings_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    path = (man.get("corpus") or {}).get("path")
    return Path(path) if path and Path(path).is_file() else None


def write_document_store(path: Path, ids: Sequence[str], documents, snippet_chars: int = SNIPPET_CHARS) -> dict[str, Any]:
    """Write ``docs.jsonl`` (``{"id", "title", "snippet"}`` per FAISS row, in row order) atomically;
    returns its manifest entry. Documents absent from ``documents`` get empty fields."""
    from scalingnote.utils.io import atomic_write

    by_id, source = _documents_by_id(documents)
    n_found = n_titles = 0
    with atomic_write(path) as fh:
        for i in ids:
            d = by_id.get(i)
            if d is not None:
                n_found += 1
                n_titles += bool(d.title)
            rec = {"id": i, "title": d.title if d else "", "snippet": make_snippet(d.content or d.topic or "", snippet_chars) if d else ""}
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return {"file": path.name, "source": source, "n_documents": len(ids), "n_found": n_found, "n_titles": n_titles, "snippet_chars": snippet_chars}


def read_document_store(path: Path, doc_ids: Sequence[str]) -> tuple[list[str], list[str]]:
    """Titles and snippets in FAISS row order; checks the ids line by line against the index."""
    titles: list[str] = []
    snippets: list[str] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ScalingNoteError(f"{path}: line {lineno}: invalid JSON ({e.msg})") from None
                if not isinstance(rec, dict) or lineno > len(doc_ids) or rec.get("id") != doc_ids[lineno - 1]:
                    raise ScalingNoteError(f"{path}: line {lineno}: field 'id' does not match FAISS row {lineno - 1} of the index")
                titles.append(str(rec.get("title") or ""))
                snippets.append(str(rec.get("snippet") or ""))
    except OSError as e:
        raise ScalingNoteError(f"{path}: cannot read the document store ({e})") from None
    if len(titles) != len(doc_ids):
        raise ScalingNoteError(f"{path}: {len(titles)} lines for {len(doc_ids)} indexed documents")
    return titles, snippets


def attach_documents(index_dir: str | Path, documents, snippet_chars: int = SNIPPET_CHARS) -> dict[str, Any]:
    """Store titles + snippets with an existing index (``docs.jsonl`` + manifest entry, each
    written atomically). ``documents``: a BEIR directory, a corpus.jsonl, or Documents."""
    from scalingnote.utils.io import atomic_write

    root = Path(index_dir)
    man = read_manifest(root)
    files = man.get("files", {})
    doc_ids = json.loads((root / files.get("doc_ids", DOC_IDS_FILE)).read_text(encoding="utf-8"))
    info = write_document_store(root / DOCS_FILE, doc_ids, documents, snippet_chars)
    man["files"] = {**files, "docs": DOCS_FILE}
    man["documents"] = info
    with atomic_write(root / MANIFEST) as fh:
        json.dump(man, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
    return info


# --------------------------------------------------------------------------- build


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _iter_source(src: Embeddings | np.ndarray, chunk: int) -> Iterator[tuple[int, np.ndarray]]:
    if isinstance(src, Embeddings):
        yield from src.iter_chunks(chunk)
    else:
        for s in range(0, src.shape[0], chunk):
            yield s, src[s : s + chunk]


def build_index(
    source: str | Path | Embeddings | np.ndarray,
    out_dir: str | Path,
    factory: str = "Flat",
    *,
    doc_ids: Sequence[str] | None = None,
    tower_info: dict[str, Any] | None = None,
    dim: int | None = None,
    train_size: int = 100_000,
    seed: int = 0,
    semantic_ids_layers: int = 6,
    codebook_size: int = 256,
    nprobe: int | None = None,
    ef_search: int | None = None,
    add_batch_size: int = 65_536,
    polysemous_training: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    index: Any = None,
    documents: str | Path | Mapping[str, Document] | Iterable[Document] | None = None,
) -> Path:
    """Build a FAISS index over document embeddings and save it to ``out_dir``.

    ``source``: an embeddings directory (:func:`~scalingnote.index.encode_corpus`), a
    loaded :class:`~scalingnote.index.Embeddings`, or a float array ``(n, d)`` with
    ``doc_ids`` (then ``tower_info`` may name the document tower).
    ``dim``: Matryoshka prefix to index (default: all components); vectors are cut to
    the first ``dim`` components and re-normalised.
    ``train_size``: size of the seeded random training sample (FAISS training and
    semantic-ID codebooks). ``semantic_ids_layers=0`` disables semantic IDs.
    ``nprobe`` / ``ef_search``: defaults stored for searches that do not pass them.
    ``polysemous_training``: keep FAISS's polysemous PQ training (off by default, see
    :func:`_prepare_training`). ``index``: an already trained, empty FAISS index to fill
    instead of building one from ``factory`` (then only a label in the manifest), e.g. a
    learned PQ (:mod:`scalingnote.index.pq.export`). ``documents``: the corpus (BEIR
    directory, corpus.jsonl, or Documents) whose titles + snippets are stored with the index
    and returned by search; default: the corpus recorded by the embeddings directory, if any.
    Returns ``out_dir``.
    """
    import faiss

    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise ScalingNoteError(f"{out_dir}: already exists (pass overwrite=True / --overwrite to replace it)")
    embeddings_dir: str | None = None
    if isinstance(source, (str, Path)):
        embeddings_dir = str(Path(source).resolve())
        source = load_embeddings(source)
    if isinstance(source, Embeddings):
        if doc_ids is not None:
            raise ScalingNoteError("doc_ids must not be given with an embeddings directory (it has its own ids)")
        ids = list(source.ids)
        src_dim = source.dim
        tinfo = dict(source.tower) if tower_info is None else dict(tower_info)
        if embeddings_dir is None:
            embeddings_dir = str(source.root.resolve())
    else:
        arr = np.asarray(source)
        if arr.ndim != 2:
            raise ScalingNoteError(f"embeddings: expected a 2-D array (n, dim), got shape {arr.shape}")
        if doc_ids is None:
            raise ScalingNoteError("doc_ids are required when building from an array")
        ids = [str(i) for i in doc_ids]
        if len(ids) != arr.shape[0]:
            raise ScalingNoteError(f"doc_ids: {len(ids)} ids for {arr.shape[0]} vectors")
        source = arr
        src_dim = int(arr.shape[1])
        tinfo = dict(tower_info or {})
    n = len(ids)
    if n == 0:
        raise ScalingNoteError("cannot build an index over 0 documents")
    if len(set(ids)) != n:
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise ScalingNoteError(f"doc_ids: duplicate document id {dup!r}")
    dim = src_dim if dim is None else int(dim)
    if not 1 <= dim <= src_dim:
        raise ScalingNoteError(f"dim: {dim} is not a valid Matryoshka prefix of {src_dim}-d embeddings (1..{src_dim})")
    if train_size < 1:
        raise ScalingNoteError(f"train_size must be >= 1, got {train_size}")

    if index is None:
        index = make_index(dim, factory)
        _prepare_training(index, seed, polysemous_training)
    elif not index.is_trained or index.ntotal != 0 or index.d != dim:
        raise ScalingNoteError(f"index: a prebuilt index must be trained, empty and {dim}-d (is_trained={index.is_trained}, ntotal={index.ntotal}, d={index.d})")
    ivf = find_ivf(index)
    hnsw = find_hnsw(index)
    search_defaults: dict[str, int] = {}
    if ivf is not None:
        search_defaults["nprobe"] = int(min(ivf.nlist, nprobe if nprobe is not None else DEFAULT_NPROBE))
    elif nprobe is not None:
        raise ScalingNoteError(f"nprobe={nprobe} given, but index {factory!r} has no IVF layer")
    if hnsw is not None or (ivf is not None and isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexHNSW)):
        search_defaults["ef_search"] = int(ef_search if ef_search is not None else DEFAULT_EF_SEARCH)
    elif ef_search is not None:
        raise ScalingNoteError(f"ef_search={ef_search} given, but index {factory!r} has no HNSW graph")

    from tqdm.auto import tqdm

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        # 1. full-precision (Matryoshka prefix, re-normalised) vectors, memory-mapped
        vec_path = tmp_dir / VECTORS_FILE
        vectors = np.lib.format.open_memmap(vec_path, mode="w+", dtype=np.float32, shape=(n, dim))
        for s, block in _iter_source(source, add_batch_size):
            block = np.asarray(block[:, :dim], dtype=np.float32)
            if not np.all(np.isfinite(block)):
                bad = s + int(np.argwhere(~np.isfinite(block))[0, 0])
                raise ScalingNoteError(f"embeddings: row {bad} (document {ids[bad]!r}) contains non-finite values")
            vectors[s : s + len(block)] = l2_normalize(block)
        vectors.flush()

        # 2. seeded training sample
        rng = np.random.default_rng(seed)
        n_train = min(int(train_size), n)
        train_rows = np.sort(rng.choice(n, size=n_train, replace=False)) if n_train < n else np.arange(n)
        train_x = np.ascontiguousarray(vectors[train_rows])

        t0 = time.perf_counter()
        if not index.is_trained:
            try:
                index.train(train_x)
            except RuntimeError as e:
                raise ScalingNoteError(
                    f"factory {factory!r}: training on {n_train} vectors failed: {_faiss_message(e)} "
                    "(use a smaller IVF/PQ size or a larger --train-size)"
                ) from None
        train_seconds = time.perf_counter() - t0

        t0 = time.perf_counter()
        with tqdm(total=n, unit="vec", desc=f"add {factory}", disable=not progress, dynamic_ncols=True) as bar:
            for s in range(0, n, add_batch_size):
                block = np.ascontiguousarray(vectors[s : s + add_batch_size])
                index.add(block)
                bar.update(len(block))
        add_seconds = time.perf_counter() - t0
        if index.ntotal != n:
            raise ScalingNoteError(f"FAISS index holds {index.ntotal} vectors after adding {n}")

        # 3. semantic IDs (ScalingNote §3.5): residual K-means fitted on the same sample
        sem_info = None
        t0 = time.perf_counter()
        if semantic_ids_layers and semantic_ids_layers > 0:
            rkm = ResidualKMeans(n_layers=semantic_ids_layers, codebook_size=codebook_size, seed=seed).fit(train_x)
            codes = np.lib.format.open_memmap(tmp_dir / SEMANTIC_IDS_FILE, mode="w+", dtype=np.int32, shape=(n, rkm.n_layers))
            for s in range(0, n, add_batch_size):
                codes[s : s + add_batch_size] = rkm.assign(vectors[s : s + add_batch_size])
            codes.flush()
            del codes
            rkm.save(tmp_dir / SEMANTIC_CODEBOOKS_FILE)
            sem_info = {"file": SEMANTIC_IDS_FILE, "codebooks": SEMANTIC_CODEBOOKS_FILE, **rkm.describe()}
        sem_seconds = time.perf_counter() - t0
        del vectors

        faiss.write_index(index, str(tmp_dir / INDEX_FILE))
        (tmp_dir / DOC_IDS_FILE).write_text(json.dumps(ids, ensure_ascii=False), encoding="utf-8")
        files = {"index": INDEX_FILE, "vectors": VECTORS_FILE, "doc_ids": DOC_IDS_FILE}
        docs_info = None
        if documents is None:
            documents = _corpus_of_embeddings(embeddings_dir)
        if documents is not None:
            docs_info = write_document_store(tmp_dir / DOCS_FILE, ids, documents)
            files["docs"] = DOCS_FILE
        index_bytes = (tmp_dir / INDEX_FILE).stat().st_size
        code_bytes = code_bytes_per_vector(index)
        from scalingnote.utils import machine_description, package_versions

        manifest = {
            "format": FORMAT,
            "factory": factory.strip(),
            "faiss_class": type(faiss.downcast_index(index)).__name__,
            "metric": "inner_product",
            "faiss_metric": "inner_product" if index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2",
            "normalized": True,
            "dim": dim,
            "source_dim": src_dim,
            "matryoshka_prefix": dim < src_dim,
            "n_vectors": n,
            "nlist": int(ivf.nlist) if ivf is not None else None,
            "tower": tinfo,
            "embeddings_dir": embeddings_dir,
            "files": files,
            "documents": docs_info,
            "code_bytes_per_vector": code_bytes,
            "index_bytes": index_bytes,
            "index_bytes_per_vector": round(index_bytes / n, 3),
            "float_bytes_per_vector": 4 * dim,
            "compression": round(4 * dim / code_bytes, 3) if code_bytes else None,
            "train_size": int(train_size),
            "n_train": n_train,
            "seed": int(seed),
            "search_defaults": search_defaults,
            "semantic_ids": sem_info,
            "train_seconds": round(train_seconds, 3),
            "add_seconds": round(add_seconds, 3),
            "semantic_ids_seconds": round(sem_seconds, 3),
            "build_seconds": round(time.perf_counter() - t_start, 3),
            "faiss_version": faiss.__version__,
            "versions": package_versions(),
            "machine": machine_description(),
            "created": _now(),
        }
        with open(tmp_dir / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
        _replace_dir(tmp_dir, out_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return out_dir


def _replace_dir(tmp_dir: Path, out_dir: Path) -> None:
    """Rename ``tmp_dir`` onto ``out_dir``; an existing ``out_dir`` is swapped out then removed."""
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.replace(out_dir, old)
        os.replace(tmp_dir, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp_dir, out_dir)


# --------------------------------------------------------------------------- search


@dataclass
class SearchResult:
    """Results for a batch of queries. Unpacks as ``scores, doc_ids, semantic_ids = result``.

    ``scores``: float32 (nq, k), descending per row, ``-inf`` where fewer than ``k`` hits.
    ``doc_ids``: per query, the ids of the hits (length <= k).
    ``semantic_ids``: int32 (nq, k, L) semantic IDs of the hits (``-1`` padding), or None
    when the index has none. ``indices``: int64 (nq, k) FAISS row numbers (``-1`` padding).
    ``titles`` / ``snippets``: per query, the title and a text snippet of each hit (aligned
    with ``doc_ids``), or None when the index stores no documents (see ``docs.jsonl``).
    """

    scores: np.ndarray
    doc_ids: list[list[str]]
    semantic_ids: np.ndarray | None
    indices: np.ndarray
    titles: list[list[str]] | None = None
    snippets: list[list[str]] | None = None

    def __iter__(self):
        return iter((self.scores, self.doc_ids, self.semantic_ids))

    def to_run(self, query_ids: Sequence[str]) -> Run:
        """``{query_id: {doc_id: score}}`` for :func:`scalingnote.data.write_run` / evaluation."""
        if len(query_ids) != len(self.doc_ids):
            raise ScalingNoteError(f"{len(query_ids)} query ids for {len(self.doc_ids)} result rows")
        return {qid: {d: float(s) for d, s in zip(docs, row, strict=False)} for qid, docs, row in zip(query_ids, self.doc_ids, self.scores, strict=True)}


class DenseIndex:
    """A saved index opened for search. Use :meth:`open`."""

    def __init__(
        self, root: Path, manifest: dict[str, Any], index, vectors: np.ndarray, doc_ids: list[str], semantic_ids: np.ndarray | None,
        query_tower=None, titles: list[str] | None = None, snippets: list[str] | None = None,
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
        self._hnsw_graph = find_hnsw(index) is not None  # top-level HNSW (not an IVF's HNSW quantiser)

    # ------------------------------------------------------------------ open
    @classmethod
    def open(cls, root: str | Path, query_tower=None, *, mmap: bool = True) -> DenseIndex:
        """Open an index directory. With ``query_tower``, check it is compatible with the
        document tower the index was built with (compat id) and that its output dim is
        the index dim or the document tower's full dim (Matryoshka prefix).

        The FAISS index is read into memory; the full-precision vectors and semantic IDs
        are memory-mapped (``mmap=False`` reads them into memory too)."""
        import faiss

        root = Path(root)
        manifest = read_manifest(root)
        if query_tower is not None:
            check_query_tower(manifest, query_tower, root / MANIFEST)
        files = manifest.get("files", {})
        ipath = root / files.get("index", INDEX_FILE)
        try:
            index = faiss.read_index(str(ipath))
        except RuntimeError as e:
            raise ScalingNoteError(f"{ipath}: cannot read FAISS index: {_faiss_message(e)}") from None
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
    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def factory(self) -> str:
        return str(self.manifest["factory"])

    def __len__(self) -> int:
        return int(self.manifest["n_vectors"])

    def semantic_id_model(self) -> ResidualKMeans | None:
        """The residual-K-means codebooks, to assign semantic IDs to new documents."""
        sem = self.manifest.get("semantic_ids")
        return ResidualKMeans.load(self.root / sem["codebooks"]) if sem else None

    # ------------------------------------------------------------------ search
    def query_vectors(self, queries: np.ndarray | str | Sequence[str]) -> np.ndarray:
        """Turn texts (via the query tower) or precomputed vectors into (nq, dim) unit vectors."""
        if isinstance(queries, str):
            queries = [queries]
        if not isinstance(queries, np.ndarray):
            queries = list(queries)
            if queries and not all(isinstance(q, str) for q in queries):
                queries = np.asarray(queries, dtype=np.float32)
        if isinstance(queries, list):
            if self.query_tower is None:
                raise ScalingNoteError("searching with query texts needs a query tower: DenseIndex.open(dir, query_tower=...)")
            if not queries:
                return np.zeros((0, self.dim), dtype=np.float32)
            q = np.asarray(_encode_queries(self.query_tower, queries), dtype=np.float32)
            what = f"query tower output ({q.shape[-1]}-d)"
        else:
            q = np.asarray(queries, dtype=np.float32)
            if q.ndim == 1:
                q = q[None, :]
            what = f"query vectors ({q.shape[-1]}-d)"
        if q.ndim != 2:
            raise ScalingNoteError(f"query vectors: expected shape (nq, {self.dim}), got {q.shape}")
        d, src = q.shape[1], int(self.manifest.get("source_dim", self.dim))
        if d != self.dim:
            if d == src and src > self.dim:
                q = q[:, : self.dim]  # Matryoshka prefix, as the documents were indexed
            else:
                raise ScalingNoteError(
                    f"{what} do not match the index: index dim is {self.dim} (document tower dim {src}), got {d}"
                )
        if not np.all(np.isfinite(q)):
            raise ScalingNoteError("query vectors contain non-finite values")
        return np.ascontiguousarray(l2_normalize(q))

    def search(
        self,
        queries: np.ndarray | str | Sequence[str],
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
        (TMJ §6); scores are then exact inner products.
        """
        if k < 1:
            raise ScalingNoteError(f"k must be >= 1, got {k}")
        if rerank is not None and rerank < 1:
            raise ScalingNoteError(f"rerank must be >= 1 (number of candidates), got {rerank}")
        q = self.query_vectors(queries)
        defaults = self.manifest.get("search_defaults", {})
        n_cand = max(k, rerank) if rerank else k
        n_cand = min(n_cand, len(self))
        ef = ef_search if ef_search is not None else defaults.get("ef_search")
        if ef is not None and self._hnsw_graph:
            # an HNSW beam of width ef returns at most ~ef results: widen it to the candidates asked for
            ef = max(ef, n_cand)
        params, _keep = _search_params(
            self.index,
            nprobe if nprobe is not None else defaults.get("nprobe"),
            ef,
            self.factory,
        )
        if q.shape[0] == 0:
            D = np.zeros((0, n_cand), np.float32)
            I = np.zeros((0, n_cand), np.int64)
        else:
            D, I = self.index.search(q, n_cand, params=params)
        if self.manifest.get("faiss_metric") == "l2":
            D = 1.0 - D / 2.0  # unit vectors: ||q - x||^2 = 2 - 2 q.x
        D = np.where(I >= 0, D, -np.inf).astype(np.float32)
        if rerank:
            D, I = self._rerank(q, I)
        D, I = D[:, :k], I[:, :k]
        if I.shape[1] < k:  # fewer documents than k
            pad = k - I.shape[1]
            D = np.pad(D, ((0, 0), (0, pad)), constant_values=-np.inf)
            I = np.pad(I, ((0, 0), (0, pad)), constant_values=-1)
        doc_ids = [[self.doc_ids[i] for i in row if i >= 0] for row in I]
        sem = None
        if self.semantic_ids is not None:
            L = self.semantic_ids.shape[1]
            sem = np.full((I.shape[0], k, L), -1, dtype=np.int32)
            valid = I >= 0
            if valid.any():
                sem[valid] = _gather(self.semantic_ids, I[valid])
        return self.attach_documents(SearchResult(D, doc_ids, sem, I))

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

    def search_run(self, query_ids: Sequence[str], queries, k: int = 100, batch_size: int = 256, progress: bool = False, **kw) -> Run:
        """Search in batches and return a TREC-style run ``{qid: {doc_id: score}}``."""
        from tqdm.auto import tqdm

        run: Run = {}
        qids = list(query_ids)
        n = len(qids)
        with tqdm(total=n, unit="q", desc="search", disable=not progress, dynamic_ncols=True) as bar:
            for s in range(0, n, batch_size):
                res = self.search(queries[s : s + batch_size], k, **kw)
                run.update(res.to_run(qids[s : s + batch_size]))
                bar.update(min(batch_size, n - s))
        return run

    def info(self) -> dict[str, Any]:
        return dict(self.manifest)


def _encode_queries(tower: Any, texts: list[str]) -> np.ndarray:
    """``tower.encode_queries(texts)``, without its progress bar where it has one."""
    import inspect

    try:
        quiet = "show_progress" in inspect.signature(tower.encode_queries).parameters
    except (TypeError, ValueError):
        quiet = False
    return tower.encode_queries(texts, show_progress=False) if quiet else tower.encode_queries(texts)


def _gather(arr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    uniq, inv = np.unique(idx, return_inverse=True)
    return np.asarray(arr[uniq])[inv.reshape(-1)]


def read_manifest(root: str | Path) -> dict[str, Any]:
    root = Path(root)
    path = root / MANIFEST
    if not path.exists():
        raise ScalingNoteError(f"{root}: no {MANIFEST} — not an index directory (build one with `scalingnote index build`)")
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ScalingNoteError(f"{path}: unreadable index manifest ({e})") from None
    if man.get("format") != FORMAT:
        raise ScalingNoteError(f"{path}: field 'format' is {man.get('format')!r}, expected {FORMAT!r}")
    return man


def check_query_tower(manifest: dict[str, Any], query_tower, where: str | Path = MANIFEST) -> None:
    """Raise :class:`ScalingNoteError` unless ``query_tower`` can search this index."""
    doc = manifest.get("tower") or {}
    q = tower_identity(query_tower)
    doc_compat, q_compat = doc.get("compat_id"), q.get("compat_id")
    if doc_compat is None:
        raise ScalingNoteError(
            f"{where}: the index records no document-tower compat id (built from raw vectors), so query tower "
            f"{q.get('name', '?')!r} cannot be checked; search it with precomputed query vectors instead"
        )
    if q_compat is None or str(q_compat) != str(doc_compat):
        raise ScalingNoteError(
            f"{where}: query tower {q.get('name', '?')!r} (compat id {q_compat!r}, fingerprint {q.get('fingerprint')!r}) "
            f"is not compatible with the index's document tower {doc.get('name', '?')!r} "
            f"(compat id {doc_compat!r}, fingerprint {doc.get('fingerprint')!r})"
        )
    qdim = q.get("dim")
    dim, src = int(manifest["dim"]), int(manifest.get("source_dim", manifest["dim"]))
    if qdim is not None and int(qdim) not in (dim, src):
        raise ScalingNoteError(
            f"{where}: query tower {q.get('name', '?')!r} outputs {qdim}-d vectors, but the index dim is {dim} "
            f"(document tower dim {src})"
        )
