"""Resumable, sharded corpus encoding with a document tower.

On-disk format (``scalingnote-embeddings/1``) — kept deliberately simple so other
writers (e.g. a Ray-based distributed encoder) can produce the same layout::

    <dir>/manifest.json          what is there (below); rewritten atomically
    <dir>/shards/00000.npy       float32 array (n_i, dim), row r = document r of the shard
    <dir>/shards/00000.ids.json  JSON list of the n_i document ids, same order
    <dir>/shards/00001.npy ...

Shard ``i`` holds corpus documents ``[i * shard_size, (i + 1) * shard_size)`` in
corpus order (the last shard may be shorter). Each shard file is written to a
temporary name and renamed; a shard counts as finished only once it is listed in
``manifest["shards"]`` (the manifest is the commit record, updated atomically after
each shard). Shard files not listed in the manifest are ignored and rewritten.

``manifest.json`` keys: ``format``, ``dim``, ``dtype`` ("float32"), ``normalized``
(rows are L2-normalised), ``shard_size``, ``tower`` (``name``, ``fingerprint``,
``compat_id``, ``dim``, ... of the document tower), ``corpus`` (source path),
``shards`` (list of ``{"shard", "vectors", "ids", "n", "start", "content_sha256",
"seconds"}``; ``content_sha256`` hashes the shard's document fields),
``n_docs`` (documents in finished shards), ``complete`` (all documents encoded),
``encode_seconds`` / ``docs_per_s`` / ``docs_encoded_last_run`` (of the last run that
encoded anything; a resumed run measures only the shards it encoded), ``batch_size``,
``created``.

An interrupted encoding is resumed by calling :func:`encode_corpus` again with the
same output directory, tower and shard size: finished shards are not recomputed;
their stored ids and content hash are checked against the corpus so a changed corpus
is caught.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from scalingnote.data.corpus import open_corpus
from scalingnote.data.types import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index.shards import MANIFEST, ShardLog, read_manifest, shard_paths
from scalingnote.utils.io import atomic_path
from scalingnote.utils.steps import describe_changes


@runtime_checkable
class DocumentEncoder(Protocol):
    """What :func:`encode_corpus` needs from a document tower."""

    def encode_documents(self, docs: Sequence[Document]) -> np.ndarray: ...


def tower_identity(tower: Any) -> dict[str, Any]:
    """The identity of a tower as recorded in manifests.

    ``fingerprint`` identifies the exact weights + settings; ``compat_id`` is shared
    by towers whose embeddings live in the same space (a dual-tower pair, a
    distilled student and its teacher's document tower, or one zero-shot symmetric
    model used on both sides); ``dim`` is the tower's output size; ``path`` is the saved
    tower directory the weights were loaded from (a fine-tuned tower's ``name`` is its base
    model's, so the path is what lets the live index re-encode new documents). Works with
    :class:`scalingnote.models.Tower` (``out_dim``, ``config``) and with any object
    exposing ``fingerprint`` / ``compat_id`` / ``dim``.
    """
    info: dict[str, Any] = {}
    cfg = getattr(tower, "config", None)
    name = getattr(tower, "name", None) or getattr(cfg, "base_model", None)
    if name is not None:
        info["name"] = str(name)
    for key in ("fingerprint", "compat_id"):
        val = getattr(tower, key, None)
        if val is not None:
            info[key] = str(val)
    dim = getattr(tower, "out_dim", None) or getattr(tower, "dim", None)
    if dim is not None:
        info["dim"] = int(dim)
    path = getattr(tower, "source_path", None)  # a saved tower directory: what re-encodes new documents
    if path is not None:
        info["path"] = str(path)
    for key in ("kind", "role", "pooling", "num_layers", "max_doc_length", "max_query_length"):
        val = getattr(cfg, key, None) if cfg is not None else getattr(tower, key, None)
        if isinstance(val, (str, int, float, bool)):
            info[key] = val
    return info


def _encode_call(tower: Any, docs: list[Document], batch_size: int) -> np.ndarray:
    """``tower.encode_documents(docs)``, passing ``batch_size`` / ``show_progress=False`` where accepted."""
    fn = tower.encode_documents
    kw: dict[str, Any] = {}
    params: Mapping[str, Any]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "batch_size" in params:
        kw["batch_size"] = batch_size
    if "show_progress" in params:
        kw["show_progress"] = False
    return fn(docs, **kw)


@dataclass
class EncodeResult:
    """Outcome of one :func:`encode_corpus` call; ``seconds`` / ``docs_per_s`` cover the
    documents encoded by this call (0 docs/s when every shard was already finished)."""

    out_dir: Path
    n_docs: int
    n_shards: int
    shards_skipped: int
    shards_written: int
    seconds: float
    docs_per_s: float
    manifest: dict[str, Any] = field(repr=False, default_factory=dict)


def encode_corpus(
    tower: DocumentEncoder,
    corpus: str | Path | Iterable[Document],
    out_dir: str | Path,
    *,
    shard_size: int = 10_000,
    batch_size: int = 64,
    normalize: bool = True,
    progress: bool = True,
    on_shard_done: Callable[[int], None] | None = None,
    tower_info: dict[str, Any] | None = None,
) -> EncodeResult:
    """Encode ``corpus`` with ``tower.encode_documents`` into sharded ``.npy`` files.

    Resumable: finished shards (listed in ``out_dir/manifest.json``) are skipped.
    ``on_shard_done(shard_index)`` is called after each shard is committed (tests use
    it to simulate an interruption). ``normalize`` L2-normalises rows (towers
    normally already do). ``tower_info`` overrides :func:`tower_identity`.
    Returns counts and documents/s of this run.
    """
    if shard_size < 1:
        raise ScalingNoteError(f"shard_size must be >= 1, got {shard_size}")
    if batch_size < 1:
        raise ScalingNoteError(f"batch_size must be >= 1, got {batch_size}")
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    ident = dict(tower_info) if tower_info is not None else tower_identity(tower)
    docs, source, total = open_corpus(corpus)
    shards = ShardLog.open(
        out_dir, shard_size=shard_size, batch_size=batch_size, normalize=normalize, source=source, tower=ident
    )
    if shards.resumed:
        check_resume(out_dir, shards.man, ident, shard_size, normalize)
    bar = tqdm(total=total, unit="doc", desc="encode", disable=not progress, dynamic_ncols=True)
    t0 = time.perf_counter()
    encoded = written = 0
    try:
        for shard, chunk, digest in shards.plan(docs, shard_size, on_finished=bar.update):
            ts = time.perf_counter()
            vecs = encode_chunk(tower, chunk, batch_size, normalize, bar)
            shards.set_dim(vecs.shape[1])
            ids = [d.id for d in chunk]
            vpath, ipath = shard_paths(out_dir, shard)
            with atomic_path(vpath, suffix=".npy") as tmp:
                with open(tmp, "wb") as fh:
                    np.save(fh, vecs)
            with atomic_path(ipath) as tmp:
                tmp.write_text(json.dumps(ids, ensure_ascii=False), encoding="utf-8")
            shards.commit(shard, len(ids), digest, shard_size, round(time.perf_counter() - ts, 3))
            encoded += len(ids)
            written += 1
            bar.set_postfix(docs_per_s=f"{encoded / max(time.perf_counter() - t0, 1e-9):.1f}", shard=shard)
            if on_shard_done is not None:
                on_shard_done(shard)
    finally:
        bar.close()
    seconds = shards.finish(t0, encoded, f"{source or 'corpus'}: no documents to encode")
    rate = encoded / seconds if encoded and seconds > 0 else 0.0  # this run only
    return EncodeResult(
        out_dir, shards.man["n_docs"], shards.n_shards, shards.n_shards - written, written, seconds, rate, shards.man
    )


def encode_chunk(tower: DocumentEncoder, chunk: list[Document], batch_size: int, normalize: bool, bar) -> np.ndarray:
    # sub-chunks of several batches: the tower can sort by length inside each (less
    # padding) while the progress bar still moves; the split depends only on the shard,
    # so a resumed run encodes exactly the same batches.
    step = batch_size * 8
    parts = []
    for s in range(0, len(chunk), step):
        batch = chunk[s : s + step]
        v = np.asarray(_encode_call(tower, batch, batch_size), dtype=np.float32)
        if v.ndim != 2 or v.shape[0] != len(batch):
            raise ScalingNoteError(f"document tower returned shape {v.shape} for {len(batch)} documents")
        parts.append(v)
        bar.update(len(batch))
    vecs = np.ascontiguousarray(np.concatenate(parts, axis=0), dtype=np.float32)
    if not np.all(np.isfinite(vecs)):
        raise ScalingNoteError("document tower produced non-finite embeddings")
    if normalize:
        vecs = l2_normalize(vecs)
    return vecs


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation (zero rows stay zero), float32."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


def check_resume(
    out_dir: Path, man: dict[str, Any], ident: dict[str, Any], shard_size: int, normalize: bool | None = None
) -> None:
    """Refuse to resume an encoding made with other settings: the shard size, the
    normalisation, or any identity field of the document tower recorded in both (weights
    fingerprint, compat id, pooling, maximum length, layers ...). The documents themselves are
    checked shard by shard (:func:`~scalingnote.index.shards.verify_shard`)."""
    path = out_dir / MANIFEST
    if int(man.get("shard_size", -1)) != shard_size:
        raise ScalingNoteError(
            f"{path}: field 'shard_size' is {man.get('shard_size')}, but this run asks for {shard_size}; "
            "resume with the same shard size or use a new output directory"
        )
    if normalize is not None and "normalized" in man and bool(man["normalized"]) != bool(normalize):
        raise ScalingNoteError(
            f"{path}: field 'normalized' is {man['normalized']}, but this run asks for normalize={normalize}; use "
            "a new output directory"
        )
    old = man.get("tower") or {}
    # "name" / "path" say where the tower was loaded from: the same weights moved elsewhere keep their fingerprint
    keys = [k for k in sorted(set(old) & set(ident)) if k not in ("name", "path") and str(old[k]) != str(ident[k])]
    if keys:
        what = describe_changes({"tower": {k: old[k] for k in keys}}, {"tower": {k: ident[k] for k in keys}})
        raise ScalingNoteError(
            f"{path}: the document tower differs ({what}); these embeddings were made by a different "
            "document tower or tower settings — use a new output directory"
        )


# ---------------------------------------------------------------------- reading


@dataclass
class Embeddings:
    """Encoded corpus: memory-mapped shards + document ids in corpus order."""

    root: Path
    manifest: dict[str, Any]
    shards: list[np.ndarray]  # memory-mapped (n_i, dim) float32
    ids: list[str]

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def tower(self) -> dict[str, Any]:
        return dict(self.manifest.get("tower", {}))

    @property
    def vectors(self) -> np.ndarray:
        """All vectors as one array: the memory map itself for a single shard, else a
        concatenation in memory (use :meth:`iter_chunks` to stream large corpora)."""
        if len(self.shards) == 1:
            return self.shards[0]
        return np.concatenate(self.shards, axis=0) if self.shards else np.zeros((0, self.dim), np.float32)

    def iter_chunks(self, chunk_size: int = 65536) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(start_row, array)`` blocks of at most ``chunk_size`` rows, across shards."""
        start = 0
        for sh in self.shards:
            for s in range(0, sh.shape[0], chunk_size):
                block = sh[s : s + chunk_size]
                yield start + s, block
            start += sh.shape[0]

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Gather rows by global index (any order) without concatenating all shards."""
        idx = np.asarray(idx, dtype=np.int64)
        out = np.empty((len(idx), self.dim), dtype=np.float32)
        offsets = np.cumsum([0] + [s.shape[0] for s in self.shards])
        which = np.searchsorted(offsets, idx, side="right") - 1
        for si in np.unique(which):
            m = which == si
            local = idx[m] - offsets[si]
            order = np.argsort(local)
            got = self.shards[si][local[order]]
            tmp = np.empty_like(got)
            tmp[order] = got
            out[m] = tmp
        return out


def load_embeddings(root: str | Path, require_complete: bool = True) -> Embeddings:
    """Open an embeddings directory written by :func:`encode_corpus` (memory-mapped)."""
    root = Path(root)
    man = read_manifest(root)
    if man is None:
        raise ScalingNoteError(
            f"{root}: no {MANIFEST} — not an embeddings directory (run `scalingnote index encode` first)"
        )
    if require_complete and not man.get("complete"):
        raise ScalingNoteError(
            f"{root / MANIFEST}: field 'complete' is false — encoding was interrupted; rerun the same encode "
            "command to resume"
        )
    shards, ids = [], []
    for rec in sorted(man["shards"], key=lambda r: int(r["shard"])):
        vpath, ipath = root / rec["vectors"], root / rec["ids"]
        try:
            arr = np.load(vpath, mmap_mode="r")
            sid = json.loads(ipath.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ScalingNoteError(f"{vpath}: unreadable shard ({e})") from None
        if arr.ndim != 2 or arr.shape[1] != man["dim"] or arr.shape[0] != rec["n"] or len(sid) != rec["n"]:
            raise ScalingNoteError(
                f"{vpath}: shard shape {arr.shape} / {len(sid)} ids does not match the manifest (n={rec['n']}, "
                f"dim={man['dim']})"
            )
        shards.append(arr)
        ids.extend(sid)
    return Embeddings(root, man, shards, ids)
