"""``LocalServer.metrics``: the Prometheus text of ``/metrics`` as a flat dict."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from server_ext import LocalServer

EXPOSITION = b"""# HELP agent_hints_prefetch_total Prefetches by result.
# TYPE agent_hints_prefetch_total counter
agent_hints_prefetch_total{result="issued"} 4.0
agent_hints_prefetch_total{result="cancelled"} 3.0
agent_hints_prefetch_created{result="issued"} 1.7e9
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2
# TYPE ttft_seconds histogram
ttft_seconds_bucket{le="0.1"} 1
ttft_seconds_bucket{le="+Inf"} 3
ttft_seconds_sum 0.75
ttft_seconds_count 3
# TYPE odd gauge
odd{path="a\\"b\\\\c"} 1
odd{path="x}y"} 2
# TYPE stamped counter
stamped_total 5 1700000000000
"""


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(EXPOSITION)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield LocalServer("127.0.0.1", httpd.server_address[1], "tiny", tmp_path / "log")
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_samples_by_series_and_by_labels(server: LocalServer) -> None:
    metrics = server.metrics()
    assert metrics["agent_hints_prefetch_total"] == 7.0
    assert metrics['agent_hints_prefetch_total{result="issued"}'] == 4.0
    assert metrics['agent_hints_prefetch_created{result="issued"}'] == 1.7e9
    assert metrics['vllm:num_requests_running{engine="0",model_name="tiny"}'] == 2.0
    assert metrics["ttft_seconds_count"] == 3.0 and metrics["ttft_seconds_sum"] == 0.75
    assert metrics['ttft_seconds_bucket{le="+Inf"}'] == 3.0
    assert metrics['odd{path="a\\"b\\\\c"}'] == 1.0  # escaped as the server wrote it
    assert metrics['odd{path="x}y"}'] == 2.0 and metrics["odd"] == 3.0
    assert metrics["stamped_total"] == 5.0  # a sample with a timestamp
    assert not any(key.startswith("#") for key in metrics)


def test_return_calibration_is_a_histogram_of_each_error() -> None:
    """Each branch return's |log2(actual / predicted)| reaches /metrics as one
    observation of a histogram (a sum alone hides the spread), however the
    engine's reports were merged on the way."""
    import functools
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from server_ext.connector import AgentHintsPromMetrics, AgentHintsStats

    registry = CollectorRegistry()
    types = {k: functools.partial(k, registry=registry) for k in (Counter, Gauge, Histogram)}
    config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config={}))
    metrics = AgentHintsPromMetrics(config, types, ["engine"], {0: ["0"]})  # type: ignore[arg-type]
    merged = AgentHintsStats({"return_log2_errors": [0.1, 0.7], "predicted_returns": 2})
    merged.aggregate(AgentHintsStats({"return_log2_errors": [2.5], "predicted_returns": 1}))
    assert merged.reduce()["predicted_returns_observed"] == 3
    metrics.observe(merged.data)
    samples = {(s.name, s.labels.get("le")): s.value for f in registry.collect() for s in f.samples}
    assert samples["agent_hints_return_log2_error_count", None] == 3
    assert samples["agent_hints_return_log2_error_sum", None] == pytest.approx(3.3)
    assert samples["agent_hints_return_log2_error_bucket", "1.0"] == 2
    assert samples["agent_hints_predicted_returns_total", None] == 3
