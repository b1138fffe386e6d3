"""Online query service (ScalingNote §3.5): HTTP search over the distilled query tower and
the compressed index (any back end of :mod:`scalingnote.index.backends`), with dynamic
micro-batching, input limits, health/metrics endpoints and hot swap of the query tower. The
loopback-only load generator (TMJ §6.2) that measures it is ``benchmarks/loadgen.py``.

Typical use::

    from scalingnote.serve import ServeSettings, create_app, serve
    serve("runs/index/ivfpq", "runs/qkd/query_tower", ServeSettings(port=8080))   # blocks

    app = create_app(index_dir, query_tower_dir, ServeSettings(max_batch=32))    # ASGI app
    with BackgroundServer(app) as srv:                                            # real uvicorn, free port
        srv.wait_ready()
        httpx.post(srv.url + "/search", json={"query": "what causes fractures?"})

POST bodies share one parser (415 non-JSON, 400 invalid UTF-8 / too deep, 422 naming the field);
``/documents`` refuses a batch naming every document, ``_id`` and field, and answers each
document's status (added / replaced); a ``/search/batch`` counts against ``max_queue`` by its
size and cannot take the single queries' share (``batch_queue_share``). A request without
``mode`` gets the index's served default (``fusion.json``), as ``scalingnote search`` does.

FastAPI / uvicorn / httpx are imported by the submodules that need them.
"""

import importlib

from scalingnote.serve.metrics import ServeMetrics, metric_value, parse_metrics
from scalingnote.serve.settings import ServeSettings, check_bind_host, is_loopback_host

#: names served by a submodule that needs FastAPI (an optional dependency: the serve extra),
#: imported on first use (PEP 562)
LAZY: dict[str, str] = {
    "create_app": "scalingnote.serve.app",
    "serve": "scalingnote.serve.server",
    "BackgroundServer": "scalingnote.serve.server",
    "bind_socket": "scalingnote.serve.server",
    "SearchService": "scalingnote.serve.service",
    "SearchParams": "scalingnote.serve.service",
    "ServiceError": "scalingnote.serve.service",
}


def __getattr__(name: str):
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'scalingnote.serve' has no attribute {name!r}")


__all__ = [
    "BackgroundServer",
    "SearchParams",
    "SearchService",
    "ServeMetrics",
    "ServeSettings",
    "ServiceError",
    "bind_socket",
    "check_bind_host",
    "create_app",
    "is_loopback_host",
    "metric_value",
    "parse_metrics",
    "serve",
]
