"""PushingSink against a recording HTTP server on 127.0.0.1 and against a real Pushgateway."""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from esper_core.contracts import MetricPoint, TelemetryPacket
from esper_core.telemetry import PrometheusSink
from esper_core.telemetry.push import PushingSink
from tests.helpers.waiting import poll
from tests.infra.tools import require_tool


class _Gateway(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append(("PUT", self.path, body))
        self.send_response(200)
        self.end_headers()

    def do_DELETE(self) -> None:  # noqa: N802 - http.server's naming
        self.received.append(("DELETE", self.path, b""))
        self.send_response(202)
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


def test_pushes_rate_limited_and_on_close_pushes_then_deletes_the_group(gateway: tuple[str, list]) -> None:
    url, received = gateway
    sink = PushingSink(
        PrometheusSink(CollectorRegistry()), url=url, grouping_key={"instance": "h:1"}, interval_s=60, linger_s=0
    )
    sink.emit(_packet(3.0))
    sink.emit(_packet(4.0))  # within the interval: no second push
    assert len(received) == 1
    method, path, body = received[0]
    assert method == "PUT" and path == "/metrics/job/esper/instance/h%3A1"
    assert b"esper_tolaria_training_latency_ms" in body
    sink.close()
    assert [(m, p) for m, p, _ in received[1:]] == [("PUT", path), ("DELETE", path)]
    assert b"4.0" in received[1][2]
    sink.close()  # the process's atexit after the run's close: nothing left to delete
    assert len(received) == 3
    sink.emit(_packet(5.0))  # a next run in the same process pushes the group again ...
    sink.close()  # ... and its close deletes it again
    assert [m for m, _, _ in received[3:]] == ["PUT", "PUT", "DELETE"]


def test_close_lingers_so_prometheus_scrapes_the_final_values(gateway: tuple[str, list]) -> None:
    url, received = gateway
    sink = PushingSink(PrometheusSink(CollectorRegistry()), url=url, interval_s=60, linger_s=0.3)
    sink.emit(_packet(1.0))
    start = time.monotonic()
    sink.close()
    assert time.monotonic() - start >= 0.3
    assert [m for m, _, _ in received] == ["PUT", "PUT", "DELETE"]


def test_rejects_a_negative_linger() -> None:
    with pytest.raises(ValueError, match="linger_s must be >= 0"):
        PushingSink(PrometheusSink(CollectorRegistry()), url="http://127.0.0.1:9091", linger_s=-1)


def test_a_pushgateway_that_is_down_does_not_stop_training(caplog: pytest.LogCaptureFixture) -> None:
    sink = PushingSink(PrometheusSink(CollectorRegistry()), url="http://127.0.0.1:9", interval_s=0)
    sink.emit(_packet(1.0))
    sink.emit(_packet(2.0))
    assert not sink.push()
    assert sum("cannot push metrics" in r.message for r in caplog.records) == 1  # logged once
    assert (
        sink.registry.get_sample_value("esper_tolaria_training_latency_ms", {"source": "tolaria", "workload": ""})
        == 2.0
    )


def test_rejects_a_url_that_is_not_http() -> None:
    with pytest.raises(ValueError, match="ESPER_PUSHGATEWAY_URL"):
        PushingSink(PrometheusSink(CollectorRegistry()), url="127.0.0.1:9091")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


@pytest.fixture
def pushgateway(tmp_path: Path) -> Iterator[str]:
    """A real Pushgateway (Debian's prometheus-pushgateway) on a free loopback port."""
    binary = require_tool("prometheus-pushgateway", apt_package="prometheus-pushgateway")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}", f"--persistence.file={tmp_path / 'pushgateway.data'}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                _get(f"{url}/-/ready")
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, f"the Pushgateway exited: {proc.stderr.read().decode()[-2000:]}"
                assert time.monotonic() < deadline, "the Pushgateway did not become ready in 15 s"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_real_pushgateway_holds_the_group_until_close_deletes_it(pushgateway: str) -> None:
    sink = PushingSink(
        PrometheusSink(CollectorRegistry()), url=pushgateway, grouping_key={"instance": "h:7"}, linger_s=0
    )
    sink.label_run("run-1", workload="seed-reference")
    sink.emit(
        TelemetryPacket(
            source="tolaria",
            run_id="run-1",
            metrics=(MetricPoint(name="tolaria.training.latency_ms", value=25.0),),
        )
    )
    held = _get(f"{pushgateway}/metrics")
    assert (
        'esper_tolaria_training_latency_ms{instance="h:7",job="esper",source="tolaria",workload="seed-reference"} 25'
        in held
    )
    assert 'push_time_seconds{instance="h:7",job="esper"}' in held  # what the rules' freshness check reads
    # The zero series of the alerting events went out too (the gateway accepted the whole registry).
    assert 'esper_events_total{instance="h:7",job="esper",level="warning",name="tolaria.compile_fallback"' in held

    sink.close()

    # The Pushgateway answers a DELETE once it has queued it (202 Accepted) and applies it after:
    # read /metrics until the group is gone (it failed once, loaded, when read right away).
    after = poll(lambda: _get(f"{pushgateway}/metrics"), lambda text: 'instance="h:7"' not in text, timeout_s=15)
    assert 'instance="h:7"' not in after, "the group outlived the run: its last values would alert forever"
