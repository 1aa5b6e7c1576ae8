"""A failing benchmark sweep posts to the alert webhook (a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from esper_core.benchmarks import registry
from esper_core.benchmarks.registry import BenchCase, SweepConfig, Workload
from esper_core.settings import EsperSettings

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


class _Webhook(http.server.BaseHTTPRequestHandler):
    posts: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook_url() -> Iterator[str]:
    _Webhook.posts = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _Webhook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hooks/esper"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _broken(case: BenchCase) -> dict:
    raise RuntimeError(f"the benchmark of {case.workload} broke")


def test_a_failed_sweep_posts_to_the_webhook(
    esper_home: EsperSettings, tmp_path: Path, webhook_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.benchmark_sweep import benchmark_sweep

    monkeypatch.setenv("ESPER_ALERT_WEBHOOK_URL", webhook_url)
    monkeypatch.setitem(registry.SWEEPS, "smoke", SweepConfig(name="smoke", workloads=("broken",), epochs=5))
    monkeypatch.setitem(registry.WORKLOADS, "broken", Workload(name="broken", description="", run=_broken))
    state = benchmark_sweep(sweep="smoke", baselines_dir=str(tmp_path / "perf"), return_state=True)
    assert state.is_failed()
    (post,) = _Webhook.posts
    assert post["flow"] == "benchmark_sweep" and post["state"] == "Failed"
    assert post["flow_run_id"] == str(state.state_details.flow_run_id)
    assert "the benchmark of broken broke" in post["message"] and post["message"] in post["text"]


def test_a_successful_sweep_or_no_webhook_posts_nothing(
    esper_home: EsperSettings, tmp_path: Path, webhook_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.benchmark_sweep import benchmark_sweep

    monkeypatch.setitem(registry.SWEEPS, "smoke", SweepConfig(name="smoke", workloads=("broken",), epochs=5))
    monkeypatch.setitem(registry.WORKLOADS, "broken", Workload(name="broken", description="", run=_broken))
    monkeypatch.delenv("ESPER_ALERT_WEBHOOK_URL", raising=False)
    assert benchmark_sweep(sweep="smoke", baselines_dir=str(tmp_path / "perf"), return_state=True).is_failed()
    assert _Webhook.posts == []
