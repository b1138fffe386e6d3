"""The Ray side of :func:`~scalingnote.index.ray.ray_encode.encode_corpus_ray`: the actor pool's
settings (:class:`RayPool`), starting or joining a cluster, checking it can hold the pool, and
turning Ray task / actor failures into one-line errors."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from scalingnote.errors import ScalingNoteError
from scalingnote.index.settings import with_options

RAY_HINT = "Ray Data is needed for --engine ray: pip install 'ray[data]==2.60.0'"


def import_ray():
    try:
        import ray  # why: Ray is an optional extra (ray[data]), imported only for --engine ray
        import ray.data
    except ImportError as e:
        raise ScalingNoteError(f"{RAY_HINT} ({e})") from None
    return ray


@dataclass(frozen=True)
class RayPool:
    """The actor pool and the cluster it runs on: ``num_actors`` actors each reserve
    ``cpus_per_actor`` CPUs and ``gpus_per_actor`` GPUs; torch in an actor uses
    ``threads_per_actor`` threads (default: ``max(1, int(cpus_per_actor))``). ``address``: an
    existing Ray cluster (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``); default: reuse an
    initialised Ray or start a local one with ``num_cpus`` / ``num_gpus``."""

    num_actors: int = 2
    cpus_per_actor: float = 0.5
    gpus_per_actor: float = 0.0
    threads_per_actor: int | None = None
    address: str | None = None
    num_cpus: float | None = None
    num_gpus: float | None = None

    @classmethod
    def resolve(cls, pool: RayPool | None, options: dict[str, Any]) -> RayPool:
        """``pool`` (default: the defaults) with the fields named in ``options`` replaced."""
        return with_options(cls, pool, options, "encode_corpus_ray")

    @property
    def threads(self) -> int:
        return self.threads_per_actor if self.threads_per_actor is not None else max(1, int(self.cpus_per_actor))

    def check(self) -> None:
        if self.num_actors < 1:
            raise ScalingNoteError(f"num_actors must be >= 1, got {self.num_actors}")
        if self.cpus_per_actor < 0 or self.gpus_per_actor < 0:
            raise ScalingNoteError(
                f"cpus_per_actor / gpus_per_actor must be >= 0, got {self.cpus_per_actor} / {self.gpus_per_actor}"
            )
        if self.cpus_per_actor == 0 and self.gpus_per_actor == 0:
            raise ScalingNoteError("an actor must reserve some CPU or GPU (cpus_per_actor or gpus_per_actor > 0)")


def start_ray(pool: RayPool, quiet: bool) -> tuple[Any, bool, float]:
    """``(ray, started_here, seconds)``: connect to ``pool.address``, reuse an initialised Ray,
    or start a local instance on 127.0.0.1."""
    address, num_cpus, num_gpus = pool.address, pool.num_cpus, pool.num_gpus
    ray = import_ray()
    if ray.is_initialized():
        return ray, False, 0.0
    # keep a local cluster on the loopback interface, without dashboard or usage reporting
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t0 = time.perf_counter()
    kw: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": not quiet,
        "logging_level": logging.WARNING if quiet else logging.INFO,
    }
    try:
        if address:
            ray.init(address=address, **kw)
        else:
            if num_cpus is not None:
                kw["num_cpus"] = num_cpus
            if num_gpus is not None:
                kw["num_gpus"] = num_gpus
            ray.init(**kw)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
        raise ScalingNoteError(f"cannot start/connect to {where}: {e}") from None
    return ray, True, time.perf_counter() - t0


def check_resources(ray, pool: RayPool) -> dict[str, float]:
    """The cluster's CPUs and GPUs; refused when they cannot hold the actor pool."""
    num_actors, cpus_per_actor, gpus_per_actor = pool.num_actors, pool.cpus_per_actor, pool.gpus_per_actor
    res = ray.cluster_resources()
    cpus, gpus = float(res.get("CPU", 0.0)), float(res.get("GPU", 0.0))
    need_c, need_g = num_actors * cpus_per_actor, num_actors * gpus_per_actor
    if need_c > cpus + 1e-9:
        raise ScalingNoteError(
            f"--num-actors {num_actors} x --cpus-per-actor {cpus_per_actor:g} = {need_c:g} CPUs, but the Ray "
            f"cluster has {cpus:g}: "
            "the actor pool could never start (use fewer actors or a fractional --cpus-per-actor, e.g. 0.5)"
        )
    if need_g > gpus + 1e-9:
        raise ScalingNoteError(
            f"--num-actors {num_actors} x --gpus-per-actor {gpus_per_actor:g} = {need_g:g} GPUs, but the Ray "
            f"cluster has {gpus:g}"
        )
    return {"cpus": cpus, "gpus": gpus}


def ray_error(e: BaseException, what: str) -> ScalingNoteError:
    """The user-facing error inside a Ray task/actor exception."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, ScalingNoteError):
        return cause
    if cause is not None:
        return ScalingNoteError(f"{what}: {type(cause).__name__}: {cause}")
    return ScalingNoteError(f"{what}: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")


def engine_info(ray, rd, quiet: bool, pool: RayPool, startup_s: float) -> dict[str, Any]:
    """Quiet Ray Data down, check the cluster can hold the actor pool; the manifest's ``engine``."""
    ctx = rd.DataContext.get_current()
    ctx.enable_progress_bars = False  # the driver shows one documents bar
    if quiet:
        ctx.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.WARNING)
    cluster = check_resources(ray, pool)
    return {
        "name": "ray",
        "ray_version": ray.__version__,
        "address": pool.address,
        "num_actors": int(pool.num_actors),
        "cpus_per_actor": float(pool.cpus_per_actor),
        "gpus_per_actor": float(pool.gpus_per_actor),
        "threads_per_actor": int(pool.threads),
        "cluster_cpus": cluster["cpus"],
        "cluster_gpus": cluster["gpus"],
        "startup_seconds": round(startup_s, 3),
    }


__all__ = ["RAY_HINT", "RayPool", "check_resources", "engine_info", "import_ray", "ray_error", "start_ray"]
