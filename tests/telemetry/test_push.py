"""PushingSink against a real HTTP endpoint on 127.0.0.1 standing in for a Pushgateway."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from esper_core.contracts import MetricPoint, TelemetryPacket
from esper_core.telemetry import PrometheusSink
from esper_core.telemetry.push import PushingSink


class _Gateway(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append(("PUT", self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, list]]:
    _Gateway.received = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", _Gateway.received
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _packet(value: float) -> TelemetryPacket:
    return TelemetryPacket(source="tolaria", metrics=(MetricPoint(name="tolaria.training.latency_ms", value=value),))


def test_pushes_the_registry_rate_limited_and_on_close(gateway: tuple[str, list]) -> None:
    url, received = gateway
    sink = PushingSink(PrometheusSink(CollectorRegistry()), url=url, grouping_key={"instance": "h:1"}, interval_s=60)
    sink.emit(_packet(3.0))
    sink.emit(_packet(4.0))  # within the interval: no second push
    assert len(received) == 1
    method, path, body = received[0]
    assert method == "PUT" and path == "/metrics/job/esper/instance/h%3A1"
    assert b"esper_tolaria_training_latency_ms" in body
    sink.close()
    assert len(received) == 2 and b"4.0" in received[1][2]


def test_a_pushgateway_that_is_down_does_not_stop_training(caplog: pytest.LogCaptureFixture) -> None:
    sink = PushingSink(PrometheusSink(CollectorRegistry()), url="http://127.0.0.1:9", interval_s=0)
    sink.emit(_packet(1.0))
    sink.emit(_packet(2.0))
    assert not sink.push()
    assert sum("cannot push metrics" in r.message for r in caplog.records) == 1  # logged once
    assert sink.registry.get_sample_value("esper_tolaria_training_latency_ms", {"source": "tolaria"}) == 2.0


def test_rejects_a_url_that_is_not_http() -> None:
    with pytest.raises(ValueError, match="ESPER_PUSHGATEWAY_URL"):
        PushingSink(PrometheusSink(CollectorRegistry()), url="127.0.0.1:9091")
