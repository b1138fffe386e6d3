"""Distributed corpus encoding with Ray Data: the document tower runs in an actor pool.

Writes exactly the on-disk format of :func:`scalingnote.index.encode_corpus`
(``scalingnote-embeddings/1``: ``manifest.json`` + ``shards/NNNNN.npy`` +
``shards/NNNNN.ids.json``), so :func:`scalingnote.index.build_index` and
:func:`scalingnote.index.load_embeddings` consume it unchanged, and so either encoder
can resume a directory the other started.

How the work is split
---------------------
1. **Plan (driver).** The corpus is streamed once with the same reader as the
   in-process encoder (:func:`scalingnote.data.iter_corpus` for BEIR JSONL: same
   validation, same skipping of empty documents, same duplicate-id check) or with the
   Parquet reader below, and cut into shards of ``shard_size`` documents in corpus
   order. Shards already listed in the manifest are verified against the corpus
   (ids + content hash) and skipped. Each pending shard becomes one row (shard index
   + its documents as list columns) of an Arrow table put into Ray's object store
   (``ray.put``; Ray spills the object store to disk when it fills up).
2. **Encode (actor pool).** ``ray.data.from_arrow_refs(...)`` →
   ``map_batches(_ShardEncoder, batch_size=1, compute=ActorPoolStrategy(size=N),
   num_cpus=..., num_gpus=...)``: each actor loads the document tower once, encodes
   a whole shard with the same batching as the in-process encoder (so the vectors
   are the same), and writes the shard's ``.npy`` / ``.ids.json`` files atomically.
3. **Commit (driver).** As shard results stream back (in any order) the driver adds
   them to ``manifest.json`` (rewritten atomically after each shard: the commit
   record). An interrupted run leaves only committed shards listed; rerunning the
   same command skips them (resume by shard).

The corpus and the output directory must be on a filesystem that every Ray node
sees (one machine, NFS, a mounted bucket): actors write the shard files themselves,
the driver writes the manifest. Every node needs ``scalingnote`` installed and the
tower available at the same path. The driver loads no model: every shard result
carries the actor's tower identity (fingerprint / compat id); a resumed directory is
checked against it before the first new shard is committed, and all actors must
report the same fingerprint (catches nodes holding different model files). When no
shard is left to encode, one Ray task loads the tower to make that check. A tower
that fails to load in an actor is reported as a one-line error, not as a dead actor.

Local clusters
--------------
Without ``address``, a local Ray instance is started (bound to 127.0.0.1, no
dashboard, no usage reporting) and shut down at the end. On a 2-core machine actors
must ask for less than one CPU each (e.g. ``cpus_per_actor=0.5``): the pool's CPU
demand must fit in the cluster, which is checked up front. If Ray is already
initialised in this process (``ray.init`` by the caller), that cluster is used and
left running.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalingnote.data.corpus import open_corpus
from scalingnote.data.types import Document
from scalingnote.errors import ScalingNoteError
from scalingnote.index.embeddings import EncodeResult, check_resume, encode_chunk, tower_identity
from scalingnote.index.pipeline import load_tower_for
from scalingnote.index.ray.ray_pool import RAY_HINT, RayPool, engine_info, ray_error, start_ray
from scalingnote.index.shards import MANIFEST, ShardLog, read_manifest, shard_paths
from scalingnote.models.spec import TowerSpec
from scalingnote.utils.io import atomic_path

log = logging.getLogger("scalingnote.index.ray")

# --------------------------------------------------------------------------- tower spec


@dataclass(frozen=True)
class ActorTower:
    """How an actor obtains the document tower: a :class:`~scalingnote.models.spec.TowerSpec`
    (name/path + options, loaded with :func:`scalingnote.index.pipeline.load_tower_for`, with the
    projection ``dim``), or a picklable zero-argument ``factory`` returning an object with
    ``encode_documents``."""

    spec: TowerSpec | None = None
    dim: int | None = None
    factory: Callable[[], Any] | None = None

    def load(self):
        if self.factory is not None:
            return self.factory()
        s = self.spec
        return load_tower_for(s.model, "document", num_layers=s.num_layers, dim=self.dim, pooling=s.pooling)

    def describe(self) -> str:
        return self.spec.model if self.spec is not None else getattr(self.factory, "__name__", repr(self.factory))


@dataclass(frozen=True)
class _Job:
    """What every actor needs: the tower, the pool, the output directory and the encoding sizes."""

    spec: ActorTower
    pool: RayPool
    out_dir: Path
    shard_size: int
    batch_size: int
    normalize: bool

    def encoded(self, rd, refs: list[Any]):
        """The Ray dataset of the shard results: each shard table of ``refs`` through a :class:`_ShardEncoder` actor."""
        p = self.pool
        return rd.from_arrow_refs(refs).map_batches(
            _ShardEncoder,
            batch_size=1,
            batch_format="pyarrow",
            compute=rd.ActorPoolStrategy(size=int(p.num_actors)),
            fn_constructor_kwargs={
                "spec": self.spec,
                "out_dir": str(self.out_dir),
                "batch_size": self.batch_size,
                "normalize": self.normalize,
                "threads": p.threads,
            },
            num_cpus=p.cpus_per_actor,
            num_gpus=p.gpus_per_actor if p.gpus_per_actor > 0 else None,
        )

    def check_stored_tower(self, ray, shards: ShardLog) -> None:
        """With nothing left to encode: check in one Ray task that this tower made the stored shards."""
        p = self.pool
        ident_task = ray.remote(num_cpus=p.cpus_per_actor, num_gpus=p.gpus_per_actor, max_retries=0)(
            _tower_identity_task
        )
        try:
            ident = ray.get(ident_task.remote(self.spec, p.threads))
        except Exception as e:  # noqa: BLE001 - RayTaskError wrapping the loading error
            raise ray_error(e, f"loading document tower {self.spec.describe()!r} on the Ray cluster") from None
        check_resume(self.out_dir, shards.man, ident, self.shard_size)


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch  # why: runs in a Ray actor; the driver never needs torch itself

        torch.set_num_threads(int(threads))


def _tower_identity_task(spec: ActorTower, threads: int | None) -> dict[str, Any]:
    """Runs as a Ray task: load the tower once and report its identity."""
    _set_threads(threads)
    return tower_identity(spec.load())


class _NullBar:
    def update(self, n: int) -> None:  # the driver shows progress; actors stay quiet
        pass


class _ShardEncoder:
    """Ray Data callable class: one tower load per actor; one call encodes one shard."""

    def __init__(self, spec: ActorTower, out_dir: str, batch_size: int, normalize: bool, threads: int | None):
        self.out_dir = Path(out_dir)
        self.batch_size = int(batch_size)
        self.normalize = bool(normalize)
        self.host = f"{os.uname().nodename}:{os.getpid()}"
        self.tower, self.ident, self.load_error = None, {}, None
        try:
            _set_threads(threads)
            self.tower = spec.load()
            self.ident = tower_identity(self.tower)
        except Exception as e:  # noqa: BLE001 - reported as data
            # a failing actor constructor gives an unreadable Ray error: report the failure as data
            self.load_error = f"loading document tower {spec.describe()!r} on Ray worker {self.host}: " + _message(e)

    def __call__(self, batch):
        import pyarrow as pa  # why: pyarrow comes with the optional ray[data] extra

        results = []
        for row in batch.to_pylist():
            if self.load_error is not None:
                results.append(json.dumps({"shard": int(row["shard"]), "error": self.load_error, "load": True}))
                continue
            try:
                results.append(json.dumps(self._encode_shard(row)))
            except Exception as e:  # noqa: BLE001 - reported to the driver as data, raised there
                results.append(json.dumps({"shard": int(row["shard"]), "error": _message(e)}))
        return pa.table({"result": pa.array(results, type=pa.string())})

    def _encode_shard(self, row: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        shard = int(row["shard"])
        docs = [
            Document(i, t, p, c)
            for i, t, p, c in zip(row["ids"], row["titles"], row["topics"], row["contents"], strict=True)
        ]
        assert self.tower is not None  # loaded (a load error is reported before any shard)
        vecs = encode_chunk(self.tower, docs, self.batch_size, self.normalize, _NullBar())
        vpath, ipath = shard_paths(self.out_dir, shard)
        with atomic_path(vpath, suffix=".npy") as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, vecs)
        with atomic_path(ipath) as tmp:
            tmp.write_text(json.dumps(list(row["ids"]), ensure_ascii=False), encoding="utf-8")
        return {
            "shard": shard,
            "n": len(docs),
            "dim": int(vecs.shape[1]),
            "seconds": round(time.perf_counter() - t0, 3),
            "tower": self.ident,
            "worker": self.host,
        }


def _message(e: BaseException) -> str:
    return str(e) if isinstance(e, ScalingNoteError) else f"{type(e).__name__}: {e}"


# --------------------------------------------------------------------------- main entry


def encode_corpus_ray(
    tower: str | Path | Callable[[], Any],
    corpus: str | Path | Iterable[Document],
    out_dir: str | Path,
    *,
    pool: RayPool | None = None,
    shard_size: int = 10_000,
    batch_size: int = 64,
    num_layers: int | None = None,
    dim: int | None = None,
    pooling: str | None = None,
    normalize: bool = True,
    progress: bool = True,
    quiet: bool = True,
    on_shard_done: Callable[[int], None] | None = None,
    **pool_options: Any,
) -> EncodeResult:
    """Encode ``corpus`` with the document tower ``tower`` in a Ray Data actor pool into
    ``out_dir`` (the :func:`~scalingnote.index.encode_corpus` format; resumable by shard).

    ``tower``: a packaged name / HF dir / ``.gguf`` / saved tower dir (loaded in each actor
    with ``num_layers`` / ``dim`` / ``pooling``), or a picklable zero-argument factory.
    ``corpus``: a BEIR directory, a ``corpus.jsonl``, a ``.parquet`` file or a directory of
    ``.parquet`` files, or an iterable of documents. ``pool``: the actor pool and cluster
    (:class:`RayPool`), or its fields as keywords (``pool_options``: ``num_actors``,
    ``cpus_per_actor``, ``gpus_per_actor``, ``threads_per_actor``, ``address``, ``num_cpus``,
    ``num_gpus``). ``on_shard_done(shard)`` runs in the driver after each shard is committed.
    Returns the same :class:`~scalingnote.index.EncodeResult` as the in-process encoder;
    ``seconds`` / ``docs_per_s`` exclude Ray start-up (recorded in the manifest's ``engine``).
    """
    pool = RayPool.resolve(pool, pool_options)
    _check_sizes(shard_size, batch_size, pool)
    job = _Job(
        _tower_spec(tower, num_layers, dim, pooling), pool, Path(out_dir).resolve(), shard_size, batch_size, normalize
    )
    out_dir = job.out_dir
    # open the corpus first: a missing file fails before Ray starts
    docs, source, total = open_corpus(corpus)
    prior = read_manifest(out_dir)
    if prior is not None and int(prior.get("shard_size", -1)) != shard_size:
        check_resume(out_dir, prior, {}, shard_size)  # raises the shard-size message before Ray starts

    ray, started, startup_s = start_ray(pool, quiet)
    try:
        import ray.data as rd

        engine = engine_info(ray, rd, quiet, pool, startup_s)
        # The tower's identity comes with every shard result (the driver loads no model);
        # a resumed directory is checked against it before the first new shard is
        # committed (shard files written before that are uncommitted, hence ignored).
        shards = ShardLog.open(
            out_dir, shard_size=shard_size, batch_size=batch_size, normalize=normalize, source=source, tower=None
        )
        shards.man["engine"] = engine
        from tqdm.auto import tqdm

        bar = tqdm(total=total, unit="doc", desc="encode (ray)", disable=not progress, dynamic_ncols=True)
        t0 = time.perf_counter()
        try:
            encoded, written = _encode_shards(ray, rd, job, shards, docs, source, bar, t0, on_shard_done)
        finally:
            bar.close()
        seconds = shards.finish(t0, encoded, f"{out_dir / MANIFEST}: no dimension recorded (no shard was ever encoded)")
        rate = encoded / seconds if encoded and seconds > 0 else 0.0
        return EncodeResult(
            out_dir,
            shards.man["n_docs"],
            shards.n_shards,
            shards.n_shards - written,
            written,
            seconds,
            rate,
            shards.man,
        )
    finally:
        if started:
            ray.shutdown()


def _encode_shards(
    ray, rd, job: _Job, shards: ShardLog, docs, source: str | None, bar, t0: float, on_shard_done
) -> tuple[int, int]:
    """Verify the finished shards, put the pending ones into the object store, encode them in the
    actor pool and commit each as it comes back. Returns ``(documents encoded, shards written)``."""
    pending: dict[int, dict[str, Any]] = {}
    refs = [
        ray.put(_shard_table(shard, chunk))
        for shard, chunk, _ in _record(shards.plan(docs, job.shard_size, on_finished=bar.update), pending)
    ]
    if shards.n_shards == 0:
        raise ScalingNoteError(f"{source or 'corpus'}: no documents to encode")
    if not refs:
        job.check_stored_tower(ray, shards)
        return 0, 0
    return _commit_results(job.encoded(rd, refs), shards, pending, job.shard_size, bar, t0, on_shard_done), len(refs)


def _check_sizes(shard_size: int, batch_size: int, pool: RayPool) -> None:
    if shard_size < 1:
        raise ScalingNoteError(f"shard_size must be >= 1, got {shard_size}")
    if batch_size < 1:
        raise ScalingNoteError(f"batch_size must be >= 1, got {batch_size}")
    pool.check()


def _tower_spec(tower, num_layers: int | None, dim: int | None, pooling: str | None) -> ActorTower:
    if isinstance(tower, (str, Path)):
        return ActorTower(TowerSpec(str(tower), num_layers=num_layers, pooling=pooling), dim=dim)
    if callable(tower):
        if num_layers is not None or dim is not None or pooling is not None:
            raise ScalingNoteError("num_layers / dim / pooling apply to a tower name or path, not to a tower factory")
        return ActorTower(factory=tower)
    raise ScalingNoteError(f"tower must be a name, a path or a zero-argument factory, got {type(tower).__name__}")


def _record(planned, pending: dict[int, dict[str, Any]]):
    """Pass the planned shards through, remembering each one's size and digest in ``pending``."""
    for shard, chunk, digest in planned:
        pending[shard] = {"n": len(chunk), "digest": digest}
        yield shard, chunk, digest


def _shard_table(shard: int, chunk: list[Document]):
    """One shard as a one-row Arrow table (lists of ids / titles / topics / contents)."""
    import pyarrow as pa  # why: pyarrow comes with the optional ray[data] extra

    return pa.table(
        {
            "shard": pa.array([shard], type=pa.int64()),
            "ids": pa.array([[d.id for d in chunk]], type=pa.list_(pa.string())),
            "titles": pa.array([[d.title for d in chunk]], type=pa.list_(pa.string())),
            "topics": pa.array([[d.topic for d in chunk]], type=pa.list_(pa.string())),
            "contents": pa.array([[d.content for d in chunk]], type=pa.list_(pa.string())),
        }
    )


def _commit_results(
    ds, shards: ShardLog, pending: dict[int, dict[str, Any]], shard_size: int, bar, t0: float, on_shard_done
) -> int:
    """Stream the actor pool's results; check each (size, tower identity, dim) and commit its
    shard. Returns the number of documents encoded."""
    encoded = 0
    ident: dict[str, Any] | None = None
    rows = iter(ds.iter_rows())
    try:
        while True:
            try:
                row = next(rows)
            except StopIteration:
                break
            except Exception as e:  # noqa: BLE001 - Ray pipeline failure (actor died, ...)
                raise ray_error(e, "the Ray encoding pipeline failed") from None
            res = json.loads(row["result"])
            sh = int(res["shard"])
            if "error" in res:
                raise ScalingNoteError(res["error"] if res.get("load") else f"shard {sh}: {res['error']}")
            info = pending.pop(sh, None)
            if info is None:
                raise ScalingNoteError(f"shard {sh}: unexpected or repeated result from the Ray pipeline")
            if res["n"] != info["n"]:
                raise ScalingNoteError(f"shard {sh}: an actor encoded {res['n']} documents, expected {info['n']}")
            if ident is None:
                ident = res["tower"]
                if shards.resumed:
                    check_resume(shards.out_dir, shards.man, ident, shard_size)
                else:
                    shards.man["tower"] = ident
            elif res["tower"].get("fingerprint") != ident.get("fingerprint"):
                raise ScalingNoteError(
                    f"shard {sh}: the tower on Ray worker {res.get('worker')} has fingerprint "
                    f"{res['tower'].get('fingerprint')!r}, "
                    f"other workers have {ident.get('fingerprint')!r}: do all nodes hold the same model files?"
                )
            shards.set_dim(int(res["dim"]))
            shards.commit(sh, info["n"], info["digest"], shard_size, res["seconds"])
            encoded += info["n"]
            bar.update(info["n"])
            bar.set_postfix(docs_per_s=f"{encoded / max(time.perf_counter() - t0, 1e-9):.1f}", shard=sh)
            if on_shard_done is not None:
                on_shard_done(sh)
    finally:  # stop the streaming execution (and its actors) on an early exit
        close = getattr(rows, "close", None)
        if close is not None:
            close()
    if pending:
        raise ScalingNoteError(f"the Ray pipeline returned no result for shard(s) {sorted(pending)[:10]}")
    return encoded


__all__ = ["RAY_HINT", "ActorTower", "RayPool", "encode_corpus_ray"]
