"""Baselines and environment capture: write/load/compare round trip, atomicity, errors."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from esper_core.contracts import TelemetryEvent, TelemetryLevel, TelemetryPacket
from esper_core.telemetry import (
    TelemetryRecorder,
    capture_environment,
    compare_baselines,
    environment_diff,
    format_comparison,
    load_baseline,
    write_baseline,
)
from esper_core.telemetry import environment as environment_module


def _packet() -> TelemetryPacket:
    rec = TelemetryRecorder("bench", run_id="bench-1")
    rec.metric("tolaria.training.latency_ms", 0.43, unit="ms")
    rec.event("tolaria.compile_enabled", level=TelemetryLevel.INFO, mode="default")
    return rec.packet()


def _write(path: Path, epoch: list[float], **kwargs: Any) -> dict[str, Any]:
    return write_baseline(
        path,
        name="seed-reference",
        workload={"batch": 4, "steps": 4, "shape": (16, 4)},
        latency_ms={"epoch": epoch, "step": [0.1, 0.2, 0.3, 0.4]},
        device="cpu",
        **kwargs,
    )


def test_write_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "baselines" / "perf" / "seed-reference" / "cpu.json"
    packet = _packet()
    extra_event = TelemetryEvent(name="tolaria.graph_fallback", message="shape change")

    written = _write(path, [1.0, 2.0, 3.0, 4.0, 5.0], packet=packet, events=[extra_event], extra={"ratio": 1.1})
    loaded = load_baseline(path)

    assert loaded == written
    assert list(os.listdir(path.parent)) == ["cpu.json"]  # no temporary file left behind
    assert loaded["name"] == "seed-reference"
    assert loaded["created_at"].endswith("+00:00")
    assert loaded["environment"]["device"] == "cpu"
    assert loaded["workload"] == {"batch": 4, "steps": 4, "shape": [16, 4]}
    assert loaded["latency"]["epoch"] == {"p50_ms": 3.0, "p95_ms": 4.8, "max_ms": 5.0, "samples": 5}
    assert TelemetryPacket.model_validate(loaded["telemetry"]) == packet
    assert [e["name"] for e in loaded["events"]] == [
        "tolaria.compile_enabled",
        "tolaria.graph_fallback",
    ]
    assert loaded["extra"] == {"ratio": 1.1}


def test_baseline_without_packet(tmp_path: Path) -> None:
    _write(tmp_path / "b.json", [1.0])
    loaded = load_baseline(tmp_path / "b.json")
    assert loaded["telemetry"] is None
    assert loaded["events"] == []
    assert loaded["extra"] == {}


def test_compare_and_format(tmp_path: Path) -> None:
    before = _write(tmp_path / "a.json", [1.0, 1.0, 2.0])
    after = write_baseline(
        tmp_path / "b.json",
        name="seed-reference",
        workload={},
        latency_ms={"epoch": [0.5, 0.5, 1.0], "new_series": [1.0]},
        device="cpu",
    )

    rows = compare_baselines(before, after)

    assert [r[0] for r in rows] == ["epoch.p50_ms", "epoch.p95_ms", "epoch.max_ms"]
    assert rows[0] == ("epoch.p50_ms", 1.0, 0.5, 0.5)
    assert rows[2] == ("epoch.max_ms", 2.0, 1.0, 0.5)
    table = format_comparison(rows, before="main", after="branch")
    lines = table.splitlines()
    assert lines[0].split() == ["latency", "main", "(ms)", "branch", "(ms)", "ratio", "change"]
    assert lines[2].split() == ["epoch.p50_ms", "1.000", "0.500", "0.50x", "-50.0%"]
    assert format_comparison([]) == "no latency series in common"
    assert environment_diff(before, after) == []


def test_ratio_with_zero_before() -> None:
    a = {"latency": {"s": {"p50_ms": 0.0, "p95_ms": 0.0, "max_ms": 0.0, "samples": 1}}}
    b = {"latency": {"s": {"p50_ms": 1.0, "p95_ms": 0.0, "max_ms": 0.0, "samples": 1}}}
    rows = compare_baselines(a, b)
    assert rows[0][3] == float("inf")
    assert rows[1][3] == 1.0
    assert "n/a" in format_comparison(rows)


def test_environment_diff_reports_changed_fields() -> None:
    a = {"environment": {"torch": "2.13.0", "cudnn": {"benchmark": False}}}
    b = {"environment": {"torch": "2.13.1", "cudnn": {"benchmark": True}, "new": 1}}
    assert environment_diff(a, b) == [
        ("cudnn.benchmark", False, True),
        ("new", None, 1),
        ("torch", "2.13.0", "2.13.1"),
    ]


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no baseline file at .*write_baseline"):
        load_baseline(tmp_path / "missing.json")

    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"name": "x",\n oops}')
    with pytest.raises(ValueError, match=r"bad\.json is not valid JSON .* line 2 column 2"):
        load_baseline(bad_json)

    not_baseline = tmp_path / "other.json"
    not_baseline.write_text(json.dumps({"name": "x", "latency": {}}))
    with pytest.raises(ValueError, match=r"missing keys \['created_at', 'environment'"):
        load_baseline(not_baseline)

    good = _write(tmp_path / "good.json", [1.0])
    good["latency"]["epoch"] = {"p50_ms": 1.0}
    malformed = tmp_path / "malformed.json"
    malformed.write_text(json.dumps(good))
    with pytest.raises(ValueError, match="latency series 'epoch' is malformed"):
        load_baseline(malformed)


def test_write_errors_leave_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "b.json"
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        _write(path, [1.0], extra={"fn": print})
    with pytest.raises(ValueError, match=r"latency series 'epoch'.*at least one sample"):
        _write(path, [])
    assert list(tmp_path.iterdir()) == []

    # A failure at the last step keeps the old file intact and removes the temporary one.
    original = _write(path, [1.0])

    def failing_replace(src: str, dst: str) -> None:
        raise OSError("simulated crash")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated crash"):
        _write(path, [9.0])
    assert list(tmp_path.iterdir()) == [path]
    assert load_baseline(path) == original


def test_capture_environment_cpu() -> None:
    env = capture_environment(torch.device("cpu"))

    json.dumps(env)  # must be storable as is
    assert env["device"] == "cpu"
    assert env["device_name"] == "cpu"
    assert env["torch"] == torch.__version__
    assert env["num_threads"] == torch.get_num_threads()
    assert env["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert set(env["cudnn"]) == {"enabled", "benchmark", "deterministic"}
    assert env["driver_version"] is None
    assert env["cpu_count"] >= 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a CPU-only machine")
def test_capture_environment_cuda_without_cuda() -> None:
    with pytest.raises(ValueError, match=r"torch\.cuda\.is_available"):
        capture_environment("cuda")


def test_mixed_tf32_apis_do_not_break_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    class MixedMatmul(types.SimpleNamespace):
        @property
        def allow_tf32(self) -> bool:
            raise RuntimeError("you have used mix of the legacy and new APIs")

    matmul = MixedMatmul(fp32_precision=torch.backends.cuda.matmul.fp32_precision)
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)

    env = environment_module.capture_environment("cpu")

    assert env["cuda_matmul_allow_tf32"].startswith("unreadable")
    assert isinstance(env["cudnn_allow_tf32"], bool)
