"""A real Milvus server on this machine: the embedded standalone build of the ``milvus`` PyPI
package (2.3.5: the Milvus 2.3.5 server binary with its own etcd and local storage, no Docker).

Unlike Milvus Lite (``*.db`` URIs, :mod:`scalingnote.index.milvus.milvus`), which implements no PQ
index and silently brute-forces an IVF_PQ collection, this server builds and searches
IVF_PQ (ScalingNote §3.5's compressed serving index), HNSW and SCANN through the same
:func:`~scalingnote.index.milvus.milvus_export.export_to_milvus` /
:class:`~scalingnote.index.milvus.milvus.MilvusSearcher` code, at the URI ``http://127.0.0.1:<port>``::

    with EmbeddedMilvus("runs/milvus-data") as srv:          # starts, waits until healthy
        export_to_milvus("runs/index", srv.uri, "notes")      # auto -> IVF_PQ on a server
        hits = MilvusSearcher.open(srv.uri, "notes").search(q, k=10)
    # stopped: SIGTERM, graceful shutdown, SIGKILL only after ``stop_timeout_s``

or from the shell ``scalingnote index milvus-server --data runs/milvus-data`` (foreground,
Ctrl-C stops it), then ``--uri http://127.0.0.1:19530`` for ``index export``, ``search`` and
``serve --backend milvus``. Data persist in ``data_dir`` across restarts.

Network: every component registers itself as 127.0.0.1 and clients connect to 127.0.0.1 only;
etcd listens on 127.0.0.1. Milvus 2.3.5 itself binds its gRPC / metrics listeners on all
interfaces (hard-coded ``":port"`` in that release; its ``*.ip`` settings only choose the
advertised address), so on a machine with other interfaces keep those ports firewalled.
"""

from __future__ import annotations

import hashlib
import logging
import lzma
import os
import platform
import shutil
import signal
import socket
import subprocess
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from scalingnote.errors import ScalingNoteError

log = logging.getLogger(__name__)

MILVUS_PIN = "milvus==2.3.5"
COMPONENTS = ("rootCoord", "proxy", "queryCoord", "queryNode", "indexCoord", "indexNode", "dataCoord", "dataNode")


def _free_port(start: int) -> int:
    for port in range(start, start + 1000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ScalingNoteError(f"no free port in {start}..{start + 999} on 127.0.0.1")


def _cache_root() -> Path:
    return Path(os.environ.get("SCALINGNOTE_CACHE") or Path.home() / ".cache" / "scalingnote")


def server_binaries() -> Path:
    """The Milvus server binary and its libraries, unpacked once per machine from the package's
    ``.lzma`` files into ``$SCALINGNOTE_CACHE`` (default ``~/.cache/scalingnote``)
    ``/milvus-<version>/bin`` (built under a temporary name, then renamed). The package would
    otherwise unpack ~200 MB into every data directory, which dominates start-up."""
    import milvus  # why: the milvus package (server binaries) is an optional extra

    final = _cache_root() / f"milvus-{version('milvus')}" / "bin"
    if (final / ".complete").exists():
        return final
    src = Path(milvus.__file__).parent / "data" / "bin"
    tmp = final.with_name(f".bin.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for lz in sorted(src.glob("*.lzma")):
        out = tmp / lz.name[: -len(".lzma")]
        with lzma.open(lz) as fin, open(out, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
        out.chmod(0o755)
        # the package skips unpacking a file whose <name>.lzma.md5 matches its archive
        (tmp / f"{out.name}.lzma.md5").write_text(hashlib.md5(lz.read_bytes()).hexdigest(), encoding="utf-8")
    (tmp / ".complete").write_text("ok", encoding="utf-8")
    try:
        tmp.rename(final)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def milvus_server_available() -> str | None:
    """None when the embedded server can run here, else the reason it cannot."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return (
            f"the milvus package ships a Linux x86_64 server binary; this is {platform.system()} {platform.machine()}"
        )
    try:
        import milvus  # noqa: F401
    except ImportError:
        return f"the embedded Milvus server needs the milvus package: pip install '{MILVUS_PIN}'"
    return None


class EmbeddedMilvus:
    """Start / stop one embedded Milvus standalone server on 127.0.0.1.

    ``port``: the gRPC port clients use (default: the first free one from 19530).
    ``data_dir``: configuration, logs, etcd and segment data (kept after :meth:`stop`).
    """

    def __init__(
        self,
        data_dir: str | Path,
        port: int | None = None,
        start_timeout_s: float = 180.0,
        stop_timeout_s: float = 30.0,
        graceful_stop_s: float = 10.0,
    ):
        self.data_dir = Path(data_dir).resolve()
        self.graceful_stop_s = graceful_stop_s
        self.port = port
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.startup_seconds: float | None = None
        self._server: Any = None  # milvus-lite's server handle (untyped)

    @property
    def uri(self) -> str:
        if self.port is None:
            raise ScalingNoteError("the Milvus server is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        s = self._server
        return s is not None and s.server_proc is not None and s.server_proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._server.server_proc.pid if self.running else None

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    def start(self) -> EmbeddedMilvus:
        if self.running:
            return self
        reason = milvus_server_available()
        if reason:
            raise ScalingNoteError(reason)
        from milvus import (  # why: optional extra, needed only to run the embedded server
            MilvusServer,
            MilvusServerConfig,
        )

        t0 = time.perf_counter()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        bin_dir = self.data_dir / "bin"
        if not bin_dir.exists():
            bin_dir.symlink_to(server_binaries(), target_is_directory=True)
        srv = MilvusServer(MilvusServerConfig(), wait_for_started=False)
        srv.set_base_dir(str(self.data_dir))
        for comp in COMPONENTS:  # register (advertise) every component on loopback
            srv.config.set(f"{comp}.ip", "127.0.0.1")
        # 2.3.5 default: 1800 s; its standalone shutdown can stall retrying stopped coordinators
        srv.config.set("common.gracefulStopTimeout", int(self.graceful_stop_s))
        self.port = self.port or _free_port(19530)
        srv.listen_port = self.port
        self._server = srv
        try:
            srv.start()  # writes configs/milvus.yaml, unpacks the binary once, spawns `milvus run standalone`
            srv.wait_started(timeout=int(self.start_timeout_s * 1000))
            self.port = srv.listen_port  # the package moves to the next free port if ours was taken meanwhile
        except Exception as e:  # noqa: BLE001 - RuntimeError/TimeoutError/OSError from the package
            tail = self._log_tail()
            self.stop()
            raise ScalingNoteError(
                f"the embedded Milvus server did not start ({e}); log {self.log_dir}:\n{tail}"
            ) from None
        self.startup_seconds = time.perf_counter() - t0
        log.info(
            "Milvus %s on %s (pid %s, data %s) in %.1fs",
            MILVUS_PIN,
            self.uri,
            self.pid,
            self.data_dir,
            self.startup_seconds,
        )
        return self

    def _log_tail(self, n: int = 15) -> str:
        p = self.log_dir / "milvus-stderr.log"
        try:
            return "\n".join(p.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM and wait for Milvus' graceful shutdown (it force-quits itself after
        ``graceful_stop_s``); SIGKILL only if still alive after ``stop_timeout_s``. Idempotent.
        Exported collections are flushed at export, so their data survive either way."""
        srv, self._server = self._server, None
        if srv is None:
            return
        proc = srv.server_proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "Milvus (pid %d) still running %.0fs after SIGTERM: killing it", proc.pid, self.stop_timeout_s
                )
                proc.kill()
                proc.wait(timeout=10)
        srv.server_proc = None
        for fd in srv.proc_fds.values():
            fd.close()
        srv.proc_fds.clear()

    def __enter__(self) -> EmbeddedMilvus:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["EmbeddedMilvus", "MILVUS_PIN", "milvus_server_available"]
