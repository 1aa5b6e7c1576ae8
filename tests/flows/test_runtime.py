"""The task layer's Prometheus sink: pushed to a Pushgateway when ESPER_PUSHGATEWAY_URL is set."""

from __future__ import annotations

import atexit
import http.server
import threading
from collections.abc import Iterator

import pytest

from esper_core.contracts import MetricPoint, TelemetryPacket
from esper_core.settings import EsperSettings
from esper_core.telemetry.push import PushingSink
from tasks import _runtime


class _Gateway(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway_url() -> Iterator[str]:
    _Gateway.bodies = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_flows_push_metrics_with_catalogue_help(
    esper_home: EsperSettings, gateway_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ESPER_PUSHGATEWAY_URL", gateway_url)
    _runtime.prometheus.cache_clear()
    try:
        sink = _runtime.prometheus()
        assert isinstance(sink, PushingSink)
        sink.emit(
            TelemetryPacket(source="tolaria", metrics=(MetricPoint(name="tolaria.training.latency_ms", value=7.0),))
        )
    finally:
        atexit.unregister(sink.close)  # the gateway is gone by the time the test process exits
        _runtime.prometheus.cache_clear()
    (body,) = _Gateway.bodies
    assert b'esper_tolaria_training_latency_ms{source="tolaria",workload=""} 7.0' in body
    assert b"budget 18 ms" in body  # the help text comes from the telemetry catalogue
