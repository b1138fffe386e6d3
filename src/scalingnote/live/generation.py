"""Index generations of a live index: the on-disk snapshots that compaction and rebuild write.

Layout (beside the index built by ``scalingnote index build``, which is generation 0)::

    <index>/live/CURRENT            {"generation": "gen-000003"}: the generation in use
                                    (absent: generation 0, the index directory itself)
    <index>/live/gen-000003/        a complete ``scalingnote-index/1`` directory (DenseIndex.open
                                    reads it) + corpus.jsonl (every live document, full text),
                                    bm25/ (bm25s over them) and live.json (below)
    <index>/live/wal/               the write-ahead log (:mod:`scalingnote.live.wal`)
    <index>/live/writer.lock        flock held by the one writer (a service or a CLI command)

A new generation is written into a temporary directory beside the old one, fsync-ed, renamed,
and then ``CURRENT`` is replaced atomically (temp file + fsync + rename + fsync of the
directory): a crash leaves either the old or the new generation in use, never a mix. Only then
are the log segments it covers deleted; older generations than the previous one are removed.

``live.json`` records the log position the generation covers (``wal_seq``) and the training
state: how many documents the coarse quantiser / PQ / semantic-ID codebooks were trained on,
and how many were added since (the drift share exported by the service).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.data.types import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index.build import build_index
from scalingnote.index.engine_files import read_structure
from scalingnote.index.faiss.methods import load_state
from scalingnote.index.layout import (
    INDEX_FILE,
    MANIFEST,
    SEMANTIC_CODEBOOKS_FILE,
    SEMANTIC_IDS_FILE,
    anchor_paths,
    read_manifest,
)
from scalingnote.live.wal import WriteAheadLog, fsync_dir
from scalingnote.sparse.bm25 import BM25Config, BM25Retriever
from scalingnote.utils.io import write_json

LIVE_DIR = "live"
CURRENT = "CURRENT"
LIVE_META = "live.json"
CORPUS = "corpus.jsonl"
BM25_SUBDIR = "bm25"
LIVE_FORMAT = "scalingnote-live/1"
_GEN_RE = re.compile(r"^gen-(\d{6})$")


def live_dir(root: str | Path) -> Path:
    return Path(root) / LIVE_DIR


def current_generation(root: str | Path) -> Path:
    """The directory of the generation in use (the index directory itself for generation 0)."""
    root = Path(root)
    cur = live_dir(root) / CURRENT
    if not cur.exists():
        return root
    try:
        name = json.loads(cur.read_text(encoding="utf-8"))["generation"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ScalingNoteError(f"{cur}: unreadable generation pointer ({e})") from None
    gen = live_dir(root) / str(name)
    if not _GEN_RE.match(str(name)) or not (gen / MANIFEST).exists():
        raise ScalingNoteError(f"{cur}: names generation {name!r}, which is not a complete index directory")
    return gen


def logged_after_generation(root: str | Path) -> bool:
    """Whether the live index's write-ahead log holds a record after its current generation: a
    batch ``index add --no-compact`` / ``index delete --no-compact`` (or a killed service) logged
    that no compaction has written yet. Reads only; never cuts a torn tail."""
    wal_dir = live_dir(root) / "wal"
    if not wal_dir.is_dir():
        return False
    after = int(read_live_meta(current_generation(root)).get("wal_seq", 0))
    return next(WriteAheadLog(wal_dir, create=False).replay(after_seq=after, truncate=False), None) is not None


def generation_number(gen: Path) -> int:
    m = _GEN_RE.match(gen.name)
    return int(m.group(1)) if m else 0


def read_live_meta(gen: Path) -> dict[str, Any]:
    """``live.json`` of a generation; for generation 0 (a plain index) the defaults."""
    p = gen / LIVE_META
    if p.exists():
        try:
            meta = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ScalingNoteError(f"{p}: unreadable ({e})") from None
        if meta.get("format") != LIVE_FORMAT:
            raise ScalingNoteError(f"{p}: field 'format' is {meta.get('format')!r}, expected {LIVE_FORMAT!r}")
        return meta
    n = int(read_manifest(gen)["n_vectors"])
    return {
        "format": LIVE_FORMAT,
        "generation": 0,
        "wal_seq": 0,
        "n_trained": n,
        "added_since_training": 0,
        "trained_generation": 0,
    }


def _fsync_tree(path: Path) -> None:
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def write_generation(
    root: Path,
    *,
    vectors: np.ndarray,
    doc_ids: Sequence[str],
    documents: Sequence[Document],
    semantic_ids: np.ndarray | None,
    manifest: dict[str, Any],
    src_gen: Path,
    meta: dict[str, Any],
    retrain: bool,
    seed: int = 0,
    progress: bool = False,
) -> Path:
    """Write the next generation (not yet in use: see :func:`swap_current`) and return it.

    ``retrain=False`` (compaction): the FAISS index keeps the trained quantiser / codebooks of
    ``src_gen`` and only the live vectors are re-added (dead rows and tombstones go away; the
    codes are the same, PQ encoding is deterministic); the semantic IDs are kept.
    ``retrain=True`` (``scalingnote index rebuild``): coarse quantiser, PQ and residual-K-means
    codebooks are trained again on the live vectors, with the settings of the original build.
    A routed structure (manifest ``routing``) keeps its method: compaction puts the live rows into
    the same lists by the stored rule (``ivf_qmetric``: A and c') or builds the HNSW graph again
    over them (tombstones gone) with the trained PQ; rebuild trains it again (``ivf_qmetric``
    with the stored query metric A: no training queries are kept).
    """
    ldir = live_dir(root)
    ldir.mkdir(parents=True, exist_ok=True)
    number = (
        max([generation_number(p) for p in ldir.iterdir() if _GEN_RE.match(p.name)] + [generation_number(src_gen)]) + 1
    )
    gen = ldir / f"gen-{number:06d}"
    if gen.exists():  # a leftover of a crash before the swap: never in use
        shutil.rmtree(gen)
    try:
        _write_generation_files(
            gen,
            number,
            vectors=vectors,
            doc_ids=doc_ids,
            documents=documents,
            semantic_ids=semantic_ids,
            manifest=manifest,
            src_gen=src_gen,
            meta=meta,
            retrain=retrain,
            seed=seed,
            progress=progress,
        )
    except BaseException:
        shutil.rmtree(gen, ignore_errors=True)  # never in use; frees what it took (a full disk)
        raise
    return gen


def _write_generation_files(
    gen: Path,
    number: int,
    *,
    vectors: np.ndarray,
    doc_ids: Sequence[str],
    documents: Sequence[Document],
    semantic_ids: np.ndarray | None,
    manifest: dict[str, Any],
    src_gen: Path,
    meta: dict[str, Any],
    retrain: bool,
    seed: int,
    progress: bool,
) -> None:
    """The files of generation ``gen`` (:func:`write_generation`), fsync-ed."""
    sem_info = manifest.get("semantic_ids") or None
    kw: dict[str, Any] = {
        "doc_ids": list(doc_ids),
        "tower_info": manifest.get("tower") or {},
        "seed": seed,
        "progress": progress,
        "documents": list(documents),
        "train_size": int(manifest.get("train_size") or 100_000),
    }
    defaults = manifest.get("search_defaults") or {}
    kw.update({"nprobe": defaults.get("nprobe"), "ef_search": defaults.get("ef_search")})
    routing = manifest.get("routing")
    if routing:  # a routed structure: the same method and parameters, its stored list rule
        kw.update(method=routing["method"], routing=routing["config"], routing_state=load_state(src_gen, manifest))
    if retrain:
        kw.update(
            {
                "semantic_ids_layers": int(sem_info["n_layers"]) if sem_info else 0,
                "codebook_size": int(sem_info.get("codebook_size", 256)) if sem_info else 256,
            }
        )
        build_index(vectors, gen, manifest["factory"], **kw)
    else:
        empty = read_structure(src_gen / manifest.get("files", {}).get("index", INDEX_FILE))
        empty.reset()
        build_index(vectors, gen, manifest["factory"], index=empty, semantic_ids_layers=0, **kw)
        if sem_info is not None and semantic_ids is not None:
            np.save(gen / SEMANTIC_IDS_FILE, np.ascontiguousarray(semantic_ids, dtype=np.int32))
            shutil.copy2(src_gen / sem_info["codebooks"], gen / SEMANTIC_CODEBOOKS_FILE)
            new_man = read_manifest(gen)
            new_man["semantic_ids"] = {**sem_info, "file": SEMANTIC_IDS_FILE, "codebooks": SEMANTIC_CODEBOOKS_FILE}
            for key in ("train_size", "n_train", "seed", "train_seconds"):  # the training it still uses
                if key in manifest:
                    new_man[key] = manifest[key]
            write_json(gen / MANIFEST, new_man)
    if manifest.get("search_tuning"):  # tuned search settings (incl. a default re-rank depth) outlive a compaction
        new_man = read_manifest(gen)
        new_man.update(search_defaults=defaults, search_tuning=manifest["search_tuning"])
        write_json(gen / MANIFEST, new_man)
    # the full documents (the next compaction's and the BM25 fit's source) and BM25 over them
    with open(gen / CORPUS, "w", encoding="utf-8") as fh:
        for d in documents:
            if d.text.strip():  # a document whose text is unknown (index built without a corpus) has none
                fh.write(json.dumps(d.to_beir(), ensure_ascii=False) + "\n")
    man = read_manifest(gen)
    man["documents"] = {**(man.get("documents") or {}), "source": str((gen / CORPUS).resolve())}
    write_json(gen / MANIFEST, anchor_paths(gen, man))
    texts = [d for d in documents if d.text.strip()]
    if texts:
        bm_cfg = BM25Config(language=meta.get("bm25_language") or "auto")
        BM25Retriever.fit(texts, bm_cfg, show_progress=False).save(gen / BM25_SUBDIR)
    write_json(gen / LIVE_META, {**meta, "format": LIVE_FORMAT, "generation": number})
    _fsync_tree(gen)


def swap_current(root: Path, gen: Path) -> None:
    """Make ``gen`` the generation in use (atomic, durable); remove generations older than the
    previous one."""
    ldir = live_dir(root)
    prev = current_generation(root)
    write_json(ldir / CURRENT, {"generation": gen.name})  # temp file + fsync + rename
    fsync_dir(ldir)
    keep = {gen.name, prev.name}
    for p in ldir.iterdir():
        if _GEN_RE.match(p.name) and p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)
    for p in ldir.iterdir():  # leftovers of interrupted writes
        if p.name.startswith(".") and p.name.endswith(".tmp"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
