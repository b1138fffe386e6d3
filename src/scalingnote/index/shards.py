"""The one shard-resume helper of corpus encoding (in-process :func:`~scalingnote.index.encode_corpus`
and Ray :func:`~scalingnote.index.ray_encode.encode_corpus_ray`).

An embeddings directory is committed shard by shard: ``shards/00000.npy`` + ``00000.ids.json``
are written (atomically) first, then the shard is listed in ``manifest.json``. A resumed run
verifies each finished shard against the corpus (ids and a content digest) and encodes only
the others; a shard file that is not in the manifest is ignored and rewritten.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from scalingnote.data.types import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index.embeddings import FORMAT, MANIFEST, SHARD_DIR, content_digest, read_manifest, shard_paths, utc_now, verify_shard
from scalingnote.utils.io import write_json


class ShardLog:
    """The manifest of an embeddings directory being written: finished shards, commits, the end."""

    def __init__(self, out_dir: Path, manifest: dict[str, Any], resumed: bool):
        self.out_dir = out_dir
        self.man = manifest
        self.resumed = resumed
        self.done: dict[int, dict[str, Any]] = {int(s["shard"]): s for s in manifest["shards"]}
        self.n_shards = 0

    @classmethod
    def open(cls, out_dir: Path, *, shard_size: int, batch_size: int, normalize: bool, source: str | None, tower: dict[str, Any] | None) -> ShardLog:
        """The directory's manifest (resumed; the caller checks it with
        :func:`~scalingnote.index.embeddings.check_resume`) or a new one."""
        man = read_manifest(out_dir)
        if man is not None:
            log = cls(out_dir, man, resumed=True)
        else:
            log = cls(out_dir, {
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
            }, resumed=False)
        (out_dir / SHARD_DIR).mkdir(parents=True, exist_ok=True)
        return log

    @property
    def path(self) -> Path:
        return self.out_dir / MANIFEST

    def plan(self, docs: Iterator[Document], shard_size: int, on_finished=None) -> Iterator[tuple[int, list[Document], str]]:
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
                f"{self.path}: lists shard(s) {extra} beyond the end of the corpus ({shard} shards): the corpus changed; use a new output directory"
            )

    def set_dim(self, dim: int) -> None:
        if self.man["dim"] is None:
            self.man["dim"] = int(dim)
        elif int(dim) != int(self.man["dim"]):
            raise ScalingNoteError(f"{self.path}: field 'dim' is {self.man['dim']}, but the tower produced {dim}-d vectors")

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


__all__ = ["ShardLog"]
