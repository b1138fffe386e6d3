"""The hand-written Prometheus exposition and its parser."""

from __future__ import annotations

import threading

import pytest

from scalingnote.serve.metrics import Counter, Gauge, Histogram, Registry, ServeMetrics, metric_value, parse_metrics


def test_counter_gauge_histogram_render_and_parse_round_trip():
    reg = Registry()
    c = reg.add(Counter("x_requests_total", "Requests.", ("endpoint", "status")))
    g = reg.add(Gauge("x_in_flight", "In flight."))
    h = reg.add(Histogram("x_batch", "Batch sizes.", (1, 2, 4, 8)))
    c.inc(endpoint="/search", status="200")
    c.inc(2, endpoint="/search", status="200")
    c.inc(endpoint='a"b\\c\nd', status="422")  # label values are escaped
    g.inc()
    g.inc()
    g.dec()
    for v in (1, 3, 3, 8, 100):
        h.observe(v)
    text = reg.render()
    assert "# TYPE x_requests_total counter" in text and "# TYPE x_batch histogram" in text
    assert 'x_batch_bucket{le="4"} 3' in text  # cumulative: 1, 3, 3
    assert 'x_batch_bucket{le="8"} 4' in text and 'x_batch_bucket{le="+Inf"} 5' in text
    parsed = parse_metrics(text)
    assert metric_value(parsed, "x_requests_total", endpoint="/search") == 3
    assert metric_value(parsed, "x_requests_total", endpoint='a"b\\c\nd') == 1
    assert metric_value(parsed, "x_in_flight") == 1
    assert metric_value(parsed, "x_batch_sum") == 115 and metric_value(parsed, "x_batch_count") == 5
    assert h.snapshot() == (115.0, 5)


def test_metric_misuse_is_refused():
    c = Counter("y_total", "y", ("a",))
    with pytest.raises(ValueError):
        c.inc(b="1")
    with pytest.raises(ValueError):
        c.inc(-1, a="1")
    with pytest.raises(ValueError):
        Counter("bad name", "x")
    reg = Registry()
    reg.add(Gauge("z", "z"))
    with pytest.raises(ValueError):
        reg.add(Gauge("z", "z"))
    with pytest.raises(ValueError):
        parse_metrics("not a metric line at all {")


def test_histogram_is_thread_safe():
    h = Histogram("t", "t", (10, 100))

    def work():
        for i in range(2000):
            h.observe(i % 150)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total, n = h.snapshot()
    assert n == 8000 and total == 4 * sum(i % 150 for i in range(2000))


def test_service_metrics_render():
    m = ServeMetrics()
    m.batch_size.observe(3)
    m.requests.inc(endpoint="/search", status="200")
    parsed = parse_metrics(m.render())
    assert metric_value(parsed, "scalingnote_encode_batch_size_count") == 1
    assert metric_value(parsed, "scalingnote_http_requests_total", status="200") == 1
