"""Running the app with uvicorn: ``serve`` (foreground, the CLI) and ``BackgroundServer``
(a real server in a thread, for tests and benchmarks).

The listening socket is bound here (not by uvicorn) so a busy port or a bad address is
a clear :class:`~scalingnote.errors.ScalingNoteError`, and port 0 picks a free port.
Graceful shutdown (SIGINT / SIGTERM): uvicorn stops accepting connections and waits up
to ``shutdown_timeout_s`` for requests in flight; then the app's lifespan shutdown lets
the batcher finish what is queued (same timeout) and stops the model worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from scalingnote.errors import ScalingNoteError
from scalingnote.index.backends import get_backend, read_backend_manifest
from scalingnote.serve.app import create_app
from scalingnote.serve.settings import ServeSettings, check_bind_host


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv4 or IPv6); ``port=0`` picks a free one."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ScalingNoteError(f"--host {host!r}: cannot resolve ({e.strerror})") from None
    last: OSError | None = None
    for family, stype, proto, _, addr in infos:
        sock = socket.socket(family, stype, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(2048)
            sock.set_inheritable(True)
            return sock
        except OSError as e:
            sock.close()
            last = e
    raise ScalingNoteError(f"cannot listen on {host}:{port}: {last.strerror if last else 'no address'}")


def _uvicorn_server(app, settings: ServeSettings):
    import uvicorn  # why: an optional dependency (the serve extra), needed only to run a server

    config = uvicorn.Config(
        app,
        log_level=settings.log_level,
        access_log=settings.access_log,
        timeout_graceful_shutdown=int(max(1, round(settings.shutdown_timeout_s))),
        lifespan="on",
    )
    return uvicorn.Server(config)  # handles SIGINT/SIGTERM when run in the main thread


def serve(index_dir: str | Path, query_tower: str | Path, settings: ServeSettings | None = None) -> None:
    """Serve ``index_dir`` (where ``settings.backend`` lives: an index directory, or the URI of a
    back end located by URI) with ``query_tower`` until interrupted (blocks).

    Refuses non-loopback hosts unless ``settings.allow_remote``. If the tower or index
    fails to load, the server stops and a :class:`ScalingNoteError` says why.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch/faiss start OpenMP (shared CPUs)
    settings = settings or ServeSettings()
    check_bind_host(settings.host, settings.allow_remote)
    backend = get_backend(settings.backend, "backend")
    # fail fast: not where the back end lives (not an index directory, no such collection)
    read_backend_manifest(backend, index_dir, collection=settings.collection, token=settings.backend_token)
    sock = bind_socket(settings.host, settings.port)
    app = create_app(index_dir, query_tower, settings)
    service = app.state.service
    server = _uvicorn_server(app, settings)
    failure: list[BaseException] = []

    def on_failure(e: BaseException) -> None:
        failure.append(e)
        server.should_exit = True

    service.on_failure = on_failure
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"scalingnote serve: listening on http://{shown}:{port} (loading {query_tower} + {index_dir}; GET /healthz)",
        flush=True,
    )
    if app.state.admin_token_source == "generated":  # the only way to learn a generated token
        print(
            "scalingnote serve: admin token for this run (send 'Authorization: Bearer TOKEN' to /admin/*): "
            f"{app.state.admin_token}",
            flush=True,
        )
    else:
        source = (
            "--admin-token-file"
            if app.state.admin_token_source == "file"
            else "--admin-token / SCALINGNOTE_ADMIN_TOKEN"
        )
        print(f"scalingnote serve: admin token from {source}", flush=True)

    # uvicorn handles SIGINT/SIGTERM (graceful shutdown), then re-raises the signal to the
    # handler that was installed before it: make SIGTERM end the command like SIGINT (exit 0).
    def _term(signum, frame):
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, _term) if threading.current_thread() is threading.main_thread() else None
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    if failure:
        e = failure[0]
        raise ScalingNoteError(f"serve: could not load the service: {service.error or e}")


class BackgroundServer:
    """A real uvicorn server for ``app`` in a daemon thread, on ``host`` and a free port.

    ``with BackgroundServer(app) as srv: httpx.get(srv.url + "/healthz")``. Leaving the
    block performs uvicorn's graceful shutdown (requests in flight are finished).
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, settings: ServeSettings | None = None):
        self.app = app
        self.settings = settings or getattr(app.state, "settings", None) or ServeSettings()
        check_bind_host(host, self.settings.allow_remote)
        self.sock = bind_socket(host, port)
        h, p = self.sock.getsockname()[:2]
        self.host, self.port = h, int(p)
        self.url = f"http://{'[' + h + ']' if ':' in h else h}:{self.port}"
        self.server = _uvicorn_server(app, self.settings)
        self.thread = threading.Thread(target=self._run, name="scalingnote-uvicorn", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve(sockets=[self.sock]))
        except BaseException as e:  # noqa: BLE001 - reported by start()/stop()
            self.error = e

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() - t0 > timeout:
                raise ScalingNoteError(f"server did not start on {self.url}: {self.error!r}")
            time.sleep(0.01)
        return self

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        """Poll ``/healthz`` until 200 (returns its JSON) or fail after ``timeout`` s."""
        import httpx  # why: an optional dependency (the serve extra), needed only to poll a running server

        t0 = time.monotonic()
        last: Any = None
        with httpx.Client(trust_env=False, timeout=5.0) as client:
            while time.monotonic() - t0 < timeout:
                with contextlib.suppress(httpx.HTTPError):
                    r = client.get(self.url + "/healthz")
                    last = r.json()
                    if r.status_code == 200:
                        return last
                    if last.get("status") == "failed":
                        raise ScalingNoteError(
                            f"service failed to load: {last.get('load_error') or last.get('detail')}"
                        )
                time.sleep(0.05)
        raise ScalingNoteError(f"service not ready after {timeout:.0f}s: {last}")

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
