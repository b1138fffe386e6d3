"""Shared helpers of the benchmarks (run each as ``python -m benchmarks.<name>`` from the
repository root): one results-file format, the shared-data location, timing, cached corpus
encoding, and ``scalingnote serve`` in a subprocess.

``benchmarks/results/<name>.json`` = {"rows": [...], "config": {...},
"versions": {...}, "machine": "...", "created": "..."}.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scalingnote.utils import run_metadata, write_json

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    """``../shared/data`` beside the repository (override with SCALINGNOTE_SHARED_DATA)."""
    env = os.environ.get("SCALINGNOTE_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def chosen_student(choices: dict[str, Any]) -> dict[str, Any]:
    """The chosen student's candidate record in a quick-start ``results.json``'s ``choices`` (its
    ``name``, ``dir`` (the query tower), ``qkd`` metrics, ...)."""
    st = choices["student"]
    return next(c for c in st["candidates"] if c["name"] == st["chosen"])


def portable(path: str | Path) -> str:
    """``path`` as a results file records it: relative to the repository when inside it, else its
    parent folder's name and its own (never one machine's absolute path)."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(REPO_ROOT.resolve()))
    except ValueError:
        return str(Path(path.parent.name) / path.name)


def without_local_paths(obj: Any) -> Any:
    """``obj`` with this machine's absolute paths made portable in every string: the repository's
    as relative paths, the shared data directory's as ``../shared/data``, the home directory's as ``~``."""
    shared, repo = shared_data_dir(), REPO_ROOT
    prefixes = [
        (str(d), "../shared/data") for d in dict.fromkeys([shared.resolve(), shared.absolute()])
    ]  # a linked folder: both spellings
    for r in dict.fromkeys([repo.resolve(), repo.absolute()]):
        prefixes += [(str(r) + os.sep, ""), (str(r), ".")]
    prefixes.append((str(Path.home()) + os.sep, "~" + os.sep))
    if isinstance(obj, str):
        for old, new in prefixes:
            if len(old) > 1:
                obj = obj.replace(old, new)
        return obj
    if isinstance(obj, dict):
        return {k: without_local_paths(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [without_local_paths(v) for v in obj]
    return obj


def write_results(name: str, rows: list[dict[str, Any]], config: dict[str, Any] | None = None) -> Path:
    """Atomically write ``benchmarks/results/<name>.json`` and return its path."""
    for r in rows:
        for k, v in r.items():
            if isinstance(v, (dict, list)):
                raise ValueError(f"results rows must be flat: key {k!r} holds a {type(v).__name__}")
    meta = run_metadata(config or {})
    out = {
        "rows": without_local_paths(rows),
        "config": without_local_paths(meta["config"]),
        "versions": meta["versions"],
        "machine": meta["machine"],
        "created": meta["created"],
    }
    path = RESULTS_DIR / f"{name}.json"
    write_json(path, out)
    return path


# --------------------------------------------------------------------------- torchrun


def free_port() -> int:
    """A free TCP port on loopback (for torchrun's rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_launch(nproc: int, *args: str) -> tuple[list[str], dict[str, str]]:
    """(command, environment) running ``args`` (a script and its arguments, or ``-m module ...``)
    on ``nproc`` local processes under torchrun: gloo on loopback, 1 thread per process, ``src/``
    importable."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        *args,
    ]
    return cmd, env


# --------------------------------------------------------------------------- timing


class Timer:
    """``with Timer() as t: ...`` then ``t.seconds``; ``t.rate(n)`` = n / seconds (None at 0 s)."""

    def __enter__(self) -> Timer:
        self.t0 = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.t0

    def rate(self, n: int) -> float | None:
        return n / self.seconds if self.seconds > 0 else None


# --------------------------------------------------------------------------- encoding


def encode_cached(tower: str, data: Path, out: Path, **kw: Any) -> Path:
    """Encode the corpus ``data`` with the document tower ``tower`` into ``out`` (resumable:
    finished shards are verified and kept), returning ``out``."""
    from scalingnote.index.pipeline import encode_with_tower

    encode_with_tower(tower, data, out, progress=False, **kw)
    return out


# --------------------------------------------------------------------------- the service in a subprocess


class ServeProcess:
    """``scalingnote serve ... --port 0`` in a subprocess (loopback, a free port), run from this
    checkout's ``src``; ``wait_ready`` polls ``/healthz``, ``stop`` sends SIGTERM."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, stderr_tail: int = 3000):
        cmd = [sys.executable, "-m", "scalingnote", "serve", *args, "--port", "0"]
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(REPO_ROOT / "src"), **(env or {})}
        self.tail = stderr_tail
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (http://\S+?) ", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"service did not start: {line}{self.proc.stderr.read()[-self.tail :]}")
        self.url = m.group(1)

    def wait_ready(self, timeout: float = 600, poll_s: float = 0.2) -> dict:
        import httpx

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited: {self.proc.stderr.read()[-self.tail :]}")
            try:
                r = httpx.get(self.url + "/healthz", trust_env=False)
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                pass
            time.sleep(poll_s)
        raise RuntimeError("service not ready in time")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def time_search(
    searcher, q, k: int, *, repeats: int = 3, n_single: int | None = None, **search_kw: Any
) -> dict[str, float]:
    """Batched QPS (median of ``repeats`` runs of all queries at once) and one-query-at-a-time
    latency over the first ``n_single`` queries (default: all): ``qps_batched``, ``qps_single``,
    ``p50_ms``, ``p99_ms``. ``search_kw`` go to ``searcher.search`` (nprobe, rerank, ...)."""
    import statistics

    import numpy as np

    batched = []
    for _ in range(repeats):
        with Timer() as t:
            searcher.search(q, k, **search_kw)
        batched.append(t.seconds)
    lat = []
    for i in range(min(n_single if n_single is not None else len(q), len(q))):
        with Timer() as t:
            searcher.search(q[i : i + 1], k, **search_kw)
        lat.append(t.seconds)
    lat_ms = np.array(lat) * 1000
    return {
        "qps_batched": round(len(q) / statistics.median(batched), 1),
        "qps_single": round(len(lat) / sum(lat), 1),
        "p50_ms": round(float(np.percentile(lat_ms, 50)), 3),
        "p99_ms": round(float(np.percentile(lat_ms, 99)), 3),
    }


def loadavg(before: tuple[float, ...]) -> dict[str, list[float]]:
    """``loadavg_before`` / ``loadavg_after`` (1, 5, 15 min) for a results config: the machine is
    shared, so every timing is read against the load it ran under."""
    return {"loadavg_before": [round(x, 2) for x in before], "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


def report(name: str, rows: list[dict[str, Any]], config: dict[str, Any] | None = None) -> Path:
    """:func:`write_results`, then say where it went."""
    path = write_results(name, rows, config)
    print(f"wrote {path}")
    return path


def build_timings(manifest: dict[str, Any]) -> dict[str, Any]:
    """Size and build-time columns of an index manifest (``scalingnote-index/1``)."""
    m = manifest
    return {
        "compression": m["compression"],
        "train_s": m["train_seconds"],
        "add_s": m["add_seconds"],
        "build_s": round(m["train_seconds"] + m["add_seconds"], 3),
    }


def tiny_served_index(root: Path):
    """A tiny random BERT tower, a tiny BEIR corpus and an IVF-PQ index over it (seconds on a
    CPU): ``(tower_dir, beir_dir, index_dir)`` for the service fuzz and soak runs."""
    from scalingnote.index import build_index
    from scalingnote.index.pipeline import encode_with_tower
    from scalingnote.models import build_tiny_model
    from tests.helpers.tiny_data import write_tiny_beir

    bert = build_tiny_model(root / "bert", "bert", seed=0)
    beir = write_tiny_beir(root / "beir", docs_per_topic=8)
    encode_with_tower(bert, beir, root / "emb", shard_size=32, batch_size=16, progress=False)
    idx = build_index(
        root / "emb", root / "idx", "IVF4,PQ8x4", semantic_ids_layers=2, codebook_size=4, seed=0, progress=False
    )
    return bert, beir, idx
