"""The on-disk shards of an embeddings directory (``scalingnote-embeddings/1``, described in
:mod:`scalingnote.index.embeddings`) and the one shard-resume helper of corpus encoding
(in-process :func:`~scalingnote.index.encode_corpus` and Ray
:func:`~scalingnote.index.ray.ray_encode.encode_corpus_ray`): shard paths, the manifest reader, the
content digest and the check of a finished shard. This module imports nothing else of
:mod:`scalingnote.index`; :mod:`~scalingnote.index.embeddings` builds on it.

An embeddings directory is committed shard by shard: ``shards/00000.npy`` + ``00000.ids.json``
are written (atomically) first, then the shard is listed in ``manifest.json``. A resumed run
verifies each finished shard against the corpus (ids and a content digest) and encodes only
the others; a shard file that is not in the manifest is ignored and rewritten.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from scalingnote.data.types import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.utils.io import write_json

FORMAT = "scalingnote-embeddings/1"
MANIFEST = "manifest.json"
SHARD_DIR = "shards"


def shard_paths(out_dir: Path, shard: int) -> tuple[Path, Path]:
    base = out_dir / SHARD_DIR / f"{shard:05d}"
    return base.with_suffix(".npy"), Path(str(base) + ".ids.json")


def read_manifest(out_dir: Path) -> dict[str, Any] | None:
    path = out_dir / MANIFEST
    if not path.exists():
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            man = json.load(fh)
    except (OSError, json.JSONDecodeError) as e:
        raise ScalingNoteError(f"{path}: unreadable embeddings manifest ({e})") from None
    if man.get("format") != FORMAT:
        raise ScalingNoteError(f"{path}: field 'format' is {man.get('format')!r}, expected {FORMAT!r}")
    return man


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def content_digest(docs: list[Document]) -> str:
    """SHA-256 over the documents' fields: detects a corpus edited between runs."""
    h = hashlib.sha256()
    for d in docs:
        h.update(json.dumps([d.id, d.title, d.topic, d.content], ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def verify_shard(out_dir: Path, rec: dict[str, Any], ids: list[str], digest: str, shard: int) -> None:
    ipath = out_dir / rec["ids"]
    try:
        stored = json.loads(ipath.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ScalingNoteError(
            f"{ipath}: finished shard {shard} has unreadable ids ({e}); delete the output directory and re-encode"
        ) from None
    if stored != ids:
        first = next(
            (i for i, (a, b) in enumerate(zip(stored, ids, strict=False)) if a != b), min(len(stored), len(ids))
        )
        raise ScalingNoteError(
            f"{ipath}: finished shard {shard} does not match the corpus (first difference at row {first}); "
            "the corpus changed since encoding started — use a new output directory"
        )
    if rec.get("content_sha256") not in (None, digest):
        raise ScalingNoteError(
            f"{out_dir / MANIFEST}: finished shard {shard} was encoded from different document texts "
            "(content_sha256 differs); "
            "the corpus changed since encoding started — use a new output directory"
        )


class ShardLog:
    """The manifest of an embeddings directory being written: finished shards, commits, the end."""

    def __init__(self, out_dir: Path, manifest: dict[str, Any], resumed: bool):
        self.out_dir = out_dir
        self.man = manifest
        self.resumed = resumed
        self.done: dict[int, dict[str, Any]] = {int(s["shard"]): s for s in manifest["shards"]}
        self.n_shards = 0

    @classmethod
    def open(
        cls,
        out_dir: Path,
        *,
        shard_size: int,
        batch_size: int,
        normalize: bool,
        source: str | None,
        tower: dict[str, Any] | None,
    ) -> ShardLog:
        """The directory's manifest (resumed; the caller checks it with
        :func:`~scalingnote.index.embeddings.check_resume`) or a new one."""
        man = read_manifest(out_dir)
        if man is not None:
            log = cls(out_dir, man, resumed=True)
        else:
            log = cls(
                out_dir,
                {
                    "format": FORMAT,
                    "dim": None,
                    "dtype": "float32",
                    "normalized": bool(normalize),
                    "shard_size": int(shard_size),
                    "tower": tower,
                    "corpus": {"path": source},
                    "shards": [],
                    "n_docs": 0,
                    "complete": False,
                    "batch_size": int(batch_size),
                    "created": utc_now(),
                },
                resumed=False,
            )
        (out_dir / SHARD_DIR).mkdir(parents=True, exist_ok=True)
        return log

    @property
    def path(self) -> Path:
        return self.out_dir / MANIFEST

    def plan(
        self, docs: Iterator[Document], shard_size: int, on_finished=None
    ) -> Iterator[tuple[int, list[Document], str]]:
        """Cut ``docs`` into shards; verify the finished ones (``on_finished(n_docs)`` each) and
        yield ``(shard, documents, content digest)`` for the others. At the end, refuses a
        manifest that lists shards beyond the corpus."""
        shard = 0
        while True:
            chunk = list(islice(docs, shard_size))
            if not chunk:
                break
            digest = content_digest(chunk)
            if shard in self.done:
                verify_shard(self.out_dir, self.done[shard], [d.id for d in chunk], digest, shard)
                if on_finished is not None:
                    on_finished(len(chunk))
            else:
                yield shard, chunk, digest
            shard += 1
        self.n_shards = shard
        extra = sorted(k for k in self.done if k >= shard)
        if extra:
            raise ScalingNoteError(
                f"{self.path}: lists shard(s) {extra} beyond the end of the corpus ({shard} shards): the corpus "
                "changed; use a new output directory"
            )

    def set_dim(self, dim: int) -> None:
        if self.man["dim"] is None:
            self.man["dim"] = int(dim)
        elif int(dim) != int(self.man["dim"]):
            raise ScalingNoteError(
                f"{self.path}: field 'dim' is {self.man['dim']}, but the tower produced {dim}-d vectors"
            )

    def commit(self, shard: int, n: int, digest: str, shard_size: int, seconds: float) -> None:
        """List a shard whose files are written in the manifest (written atomically)."""
        vpath, ipath = shard_paths(self.out_dir, shard)
        self.done[shard] = {
            "shard": shard,
            "vectors": str(vpath.relative_to(self.out_dir)),
            "ids": str(ipath.relative_to(self.out_dir)),
            "n": n,
            "start": shard * shard_size,
            "content_sha256": digest,
            "seconds": seconds,
        }
        self.man["shards"] = [self.done[k] for k in sorted(self.done)]
        self.man["n_docs"] = int(sum(s["n"] for s in self.man["shards"]))
        write_json(self.path, self.man)

    def finish(self, t0: float, encoded: int, empty_message: str) -> float:
        """Mark the directory complete with this run's speed; returns the seconds since ``t0``."""
        seconds = time.perf_counter() - t0
        if self.man["dim"] is None:
            raise ScalingNoteError(empty_message)
        self.man["complete"] = True
        self.man["n_docs"] = int(sum(s["n"] for s in self.man["shards"]))
        if encoded:  # a run that only verified finished shards keeps the last measured speed
            self.man["encode_seconds"] = round(seconds, 3)
            self.man["docs_per_s"] = round(encoded / seconds, 2) if seconds > 0 else None
            self.man["docs_encoded_last_run"] = encoded
        self.man["updated"] = utc_now()
        write_json(self.path, self.man)
        return seconds


__all__ = [
    "FORMAT",
    "MANIFEST",
    "SHARD_DIR",
    "ShardLog",
    "content_digest",
    "read_manifest",
    "shard_paths",
    "utc_now",
    "verify_shard",
]
