"""A small, thread-safe Prometheus text exposition (format 0.0.4), written by hand.

``prometheus_client`` is not a dependency; the service needs only counters, gauges
and fixed-bucket histograms, rendered as text for ``GET /metrics``. Observations may
come from the event loop and from the model worker thread, so every metric holds a
lock. :func:`parse_metrics` reads the text back (used by the load generator to get
the mean encode batch size of a run from two scrapes).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Request latency buckets (seconds): 1 ms .. 10 s.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
#: Encode batch size buckets (queries per model call).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def _fmt(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def _escape(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: tuple[str, str] | None = None) -> str:
    pairs = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra is not None:
        pairs.append(f'{extra[0]}="{_escape(extra[1])}"')
    return "{" + ",".join(pairs) + "}" if pairs else ""


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()):
        if not _NAME_RE.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(labels)} != {sorted(self.labelnames)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help.replace(chr(10), ' ')}", f"# TYPE {self.name} {self.kind}"]


class _Scalar(_Metric):
    """One float per label set (shared by :class:`Counter` and :class:`Gauge`)."""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()):
        super().__init__(name, help, labelnames)
        self._values: dict[tuple[str, ...], float] = {} if labelnames else {(): 0.0}

    def _add(self, amount: float, labels: dict[str, str]) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self.header() + [f"{self.name}{_labels(self.labelnames, k)} {_fmt(v)}" for k, v in items]


class Counter(_Scalar):
    """A monotonically increasing count. ``name`` should end in ``_total``."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self._add(amount, labels)


class Gauge(_Scalar):
    """A value that goes up and down."""

    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._add(amount, labels)

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self.inc(-amount, **labels)

    def clear(self) -> None:
        with self._lock:
            self._values = {} if self.labelnames else {(): 0.0}


class Histogram(_Metric):
    """Fixed upper-bound buckets (cumulative when rendered), plus ``_sum`` and ``_count``."""

    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: Iterable[float], labelnames: Sequence[str] = ()):
        super().__init__(name, help, labelnames)
        b = sorted(float(x) for x in buckets)
        if not b or len(set(b)) != len(b):
            raise ValueError(f"{name}: buckets must be distinct and non-empty")
        self.buckets = tuple(x for x in b if not math.isinf(x))
        # per label key: [count per finite bucket (non-cumulative)] + [overflow], sum, count
        self._data: dict[tuple[str, ...], list] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        v = float(value)
        i = next((j for j, ub in enumerate(self.buckets) if v <= ub), len(self.buckets))
        with self._lock:
            d = self._data.get(key)
            if d is None:
                d = self._data[key] = [[0] * (len(self.buckets) + 1), 0.0, 0]
            d[0][i] += 1
            d[1] += v
            d[2] += 1

    def snapshot(self, **labels: str) -> tuple[float, int]:
        """``(sum, count)`` for one label set."""
        with self._lock:
            d = self._data.get(self._key(labels))
            return (float(d[1]), int(d[2])) if d else (0.0, 0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted((k, [list(d[0]), d[1], d[2]]) for k, d in self._data.items())
        lines = self.header()
        for key, (counts, total, n) in items:
            cum = 0
            for ub, c in zip(self.buckets, counts, strict=False):
                cum += c
                lines.append(f"{self.name}_bucket{_labels(self.labelnames, key, ('le', _fmt(ub)))} {cum}")
            lines.append(f"{self.name}_bucket{_labels(self.labelnames, key, ('le', '+Inf'))} {n}")
            lines.append(f"{self.name}_sum{_labels(self.labelnames, key)} {_fmt(total)}")
            lines.append(f"{self.name}_count{_labels(self.labelnames, key)} {n}")
        return lines


class Registry:
    """An ordered set of metrics rendered together."""

    def __init__(self) -> None:
        self._metrics: list[_Metric] = []

    def add(self, metric):
        if any(m.name == metric.name for m in self._metrics):
            raise ValueError(f"metric {metric.name!r} registered twice")
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        lines: list[str] = []
        for m in self._metrics:
            lines.extend(m.render())  # type: ignore[attr-defined]
        return "\n".join(lines) + "\n"


class ServeMetrics:
    """The service's metrics (names prefixed ``scalingnote_``)."""

    def __init__(self) -> None:
        self.registry = Registry()
        # registered (and rendered) in this order: requests, the model worker, the live index
        self._add_request_metrics(self.registry)
        self._add_live_metrics(self.registry)
        self.collectors: list = []  # callables run before each render

    def _add_request_metrics(self, r: Registry) -> None:
        """HTTP requests, the queue and the model worker, the served tower."""
        self.requests = r.add(
            Counter(
                "scalingnote_http_requests_total", "HTTP requests by endpoint and status code.", ("endpoint", "status")
            )
        )
        self.latency = r.add(
            Histogram(
                "scalingnote_http_request_duration_seconds",
                "HTTP request latency by endpoint (seconds).",
                LATENCY_BUCKETS,
                ("endpoint",),
            )
        )
        self.in_flight = r.add(Gauge("scalingnote_http_requests_in_flight", "HTTP requests being handled."))
        self.queries = r.add(
            Counter("scalingnote_queries_total", "Queries searched (a batch request counts each of its queries).")
        )
        self.query_errors = r.add(
            Counter(
                "scalingnote_query_errors_total", "Queries that failed inside the model worker, by kind.", ("kind",)
            )
        )
        self.batch_size = r.add(
            Histogram(
                "scalingnote_encode_batch_size",
                "Queries encoded together in one micro-batch (dynamic batching).",
                BATCH_BUCKETS,
            )
        )
        self.encode_seconds = r.add(
            Histogram(
                "scalingnote_encode_duration_seconds", "Query-tower time per micro-batch (seconds).", LATENCY_BUCKETS
            )
        )
        self.search_seconds = r.add(
            Histogram(
                "scalingnote_search_duration_seconds", "FAISS search time per micro-batch (seconds).", LATENCY_BUCKETS
            )
        )
        self.queue_wait = r.add(
            Histogram(
                "scalingnote_queue_wait_seconds",
                "Time from a request's arrival to the start of its micro-batch (seconds).",
                LATENCY_BUCKETS,
            )
        )
        self.queue_depth = r.add(Gauge("scalingnote_queue_queries", "Queries waiting for the model worker."))
        self.rejected = r.add(
            Counter(
                "scalingnote_rejected_total", "Requests refused by input limits or overload, by reason.", ("reason",)
            )
        )
        self.shed_queries = r.add(
            Counter(
                "scalingnote_shed_queries_total", "Queries refused with 503 because the queue was full (load shedding)."
            )
        )
        self.queue_limit = r.add(
            Gauge(
                "scalingnote_queue_limit_queries",
                "The queue bound (max_queue): more waiting queries are shed with 503.",
            )
        )
        self.reloads = r.add(
            Counter(
                "scalingnote_tower_reloads_total",
                "Query-tower reloads by result (swapped, incompatible, failed, busy).",
                ("result",),
            )
        )
        self.ready = r.add(Gauge("scalingnote_ready", "1 when the query tower and the index are loaded."))
        self.tower_info = r.add(
            Gauge(
                "scalingnote_query_tower_info",
                "The query tower being served (value 1).",
                ("name", "fingerprint", "compat_id"),
            )
        )

    def _add_live_metrics(self, r: Registry) -> None:
        """The live index (filled by :mod:`scalingnote.serve.documents` before each render)."""
        self.live_documents = r.add(Gauge("scalingnote_live_documents", "Documents in the live index."))
        self.live_added_share = r.add(
            Gauge(
                "scalingnote_live_added_share",
                "Documents added since the codebooks were last trained / documents they were trained on.",
            )
        )
        self.live_recall = r.add(
            Gauge(
                "scalingnote_live_recall_estimate",
                "Sampled recall@10 of the ANN index vs exact search over the live vectors.",
            )
        )
        self.live_log_records = r.add(
            Gauge("scalingnote_live_log_records", "Write-ahead-log records not yet compacted into a generation.")
        )
        self.live_bm25_delta = r.add(
            Gauge(
                "scalingnote_live_bm25_delta_documents", "Documents in the BM25 delta segment (merged at query time)."
            )
        )
        self.live_writes_degraded = r.add(
            Gauge(
                "scalingnote_live_writes_degraded",
                "1 while writes to the live index are refused (a full disk, an I/O error, the back end "
                "unavailable) until one succeeds; searches are answered meanwhile.",
            )
        )
        self.live_write_errors = r.add(
            Counter(
                "scalingnote_live_write_errors_total",
                "Live-index writes the storage or the back end refused, by operation and cause (ENOSPC, EIO, ...).",
                ("op", "cause"),
            )
        )
        self.live_documents_total = r.add(
            Counter("scalingnote_live_documents_total", "Documents upserted / deleted through the service.", ("op",))
        )

    def render(self) -> str:
        for collect in self.collectors:
            collect()
        return self.registry.render()


# --------------------------------------------------------------------------- parsing

_LINE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$")
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Parse Prometheus text exposition into ``{sample_name: [(labels, value), ...]}``."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE_RE.match(line)
        if not m:
            raise ValueError(f"unparsable metrics line: {raw!r}")
        name, labels_s, value = m.group(1), m.group(3) or "", m.group(4)
        labels = {k: _unescape(v) for k, v in _LABEL_RE.findall(labels_s)}
        out.setdefault(name, []).append((labels, float(value.replace("Inf", "inf"))))
    return out


def metric_value(parsed: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0.0 if none)."""
    return float(sum(v for lab, v in parsed.get(name, []) if all(lab.get(k) == str(x) for k, x in labels.items())))
