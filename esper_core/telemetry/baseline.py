"""Performance baselines: JSON snapshots of a workload's latency, environment and telemetry.

Baselines live under ``baselines/perf/<name>/`` (DESIGN.md "Baselines"). One file holds::

    {
      "schema_version": 1,
      "name": "seed-reference",
      "created_at": "2026-05-09T07:35:25+00:00",      # ISO 8601, UTC
      "environment": {...},                          # capture_environment(device)
      "workload": {...},                             # what was measured, as the caller describes it
      "latency": {"epoch": {"p50_ms": .., "p95_ms": .., "max_ms": .., "samples": ..}, ...},
      "telemetry": {...} | null,                     # the run's TelemetryPacket
      "events": [...],                               # its events (and any extra ones)
      "extra": {...}
    }

Files are written atomically (temporary file in the same directory, then ``os.replace``), so a
reader never sees half a baseline. A packet metric that is NaN or infinite is written as the
``NaN`` / ``Infinity`` token, which Python's ``json`` reads back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from esper_core.contracts import LatencyStats, TelemetryEvent, TelemetryPacket
from esper_core.telemetry.atomic import atomic_write
from esper_core.telemetry.environment import capture_environment
from esper_core.telemetry.stats import latency_stats

SCHEMA_VERSION = 1
REQUIRED_KEYS = (
    "name",
    "created_at",
    "environment",
    "workload",
    "latency",
    "telemetry",
    "events",
    "extra",
)
STATS = ("p50_ms", "p95_ms", "max_ms")

ComparisonRow = tuple[str, float, float, float]
"""``(series.stat, before, after, after / before)``."""


def write_baseline(
    path: str | Path,
    *,
    name: str,
    workload: Mapping[str, Any],
    latency_ms: Mapping[str, Sequence[float]],
    device: torch.device | str,
    packet: TelemetryPacket | None = None,
    events: Sequence[TelemetryEvent] = (),
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Summarise a measurement and write it as a baseline JSON file, atomically.

    Args:
        path: The JSON file, e.g. ``baselines/perf/seed-reference/cpu.json``; parent
            directories are created and an existing file is replaced.
        name: The workload's stable name (``seed-reference``, ``digits-mlp``, ...).
        workload: JSON-serialisable description of what was measured (sizes, epochs, options).
        latency_ms: Series name -> latency samples in ms, e.g. ``{"epoch": [...], "step": [...]}``.
        device: The device measured on; its environment is captured here.
        packet: The run's telemetry packet, stored whole; its events also go to ``events``.
        events: Further events to store after the packet's own.
        extra: Any other JSON-serialisable data (e.g. the ratio to bare PyTorch).

    Returns:
        The baseline as written, equal to what ``load_baseline(path)`` returns.

    Raises:
        ValueError: If ``name`` or ``latency_ms`` is empty, a series has no valid samples, or
            ``workload`` / ``extra`` is not JSON-serialisable.
    """
    if not name:
        raise ValueError("name must be the workload's name, e.g. 'seed-reference'")
    if not latency_ms:
        raise ValueError("latency_ms needs at least one series, e.g. {'epoch': [0.4, 0.5]}")
    latency = {}
    for series, samples in latency_ms.items():
        try:
            latency[series] = latency_stats(samples).model_dump()
        except (ValueError, ValidationError) as e:
            raise ValueError(f"latency series {series!r}: {e}") from e
    all_events = [*(packet.events if packet is not None else ()), *events]
    baseline = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "environment": capture_environment(device),
        "workload": dict(workload),
        "latency": latency,
        "telemetry": packet.model_dump(mode="json") if packet is not None else None,
        "events": [event.model_dump(mode="json") for event in all_events],
        "extra": dict(extra) if extra is not None else {},
    }
    try:
        text = json.dumps(baseline, indent=2) + "\n"
    except TypeError as e:
        raise ValueError(
            f"baseline {name!r} is not JSON-serialisable ({e}); pass plain numbers, strings, "
            "lists and dicts in workload and extra"
        ) from e
    atomic_write(Path(path), text)
    # Return what a reader will see (tuples become lists, and so on).
    result: dict[str, Any] = json.loads(text)
    return result


def save_result_with_plot(
    result: Mapping[str, Any], directory: Path, *, json_name: str, png_name: str, png: bytes
) -> tuple[Path, Path]:
    """Write a benchmark's ``result`` as ``directory/json_name`` and its plot as
    ``directory/png_name`` (``directory`` made as needed, each file replaced atomically);
    returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path, png_path = directory / json_name, directory / png_name
    atomic_write(json_path, json.dumps(result, indent=2) + "\n")
    atomic_write(png_path, png)
    return json_path, png_path


def load_baseline(path: str | Path) -> dict[str, Any]:
    """Read and check a baseline written by ``write_baseline``.

    Args:
        path: The baseline JSON file.

    Returns:
        The baseline dict.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the file is not JSON, lacks a required key, has an unsupported
            ``schema_version`` or a malformed latency entry; the message names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no baseline file at {path}; record one with "
            "esper_core.telemetry.write_baseline (the benchmark commands do)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
            "restore it from version control or record the baseline again"
        ) from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a baseline is a JSON object, found {type(data).__name__}")
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise ValueError(f"{path} is not a baseline: missing keys {missing}; record it with write_baseline")
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise ValueError(
            f"{path} has schema_version {version}, this code reads {SCHEMA_VERSION}; "
            "record the baseline again with this version"
        )
    if not isinstance(data["latency"], dict):
        raise ValueError(f"{path}: 'latency' must map series names to statistics")
    for series, stats in data["latency"].items():
        try:
            LatencyStats.model_validate(stats)
        except ValidationError as e:
            raise ValueError(
                f"{path}: latency series {series!r} is malformed: {e.errors()[0]['msg']} "
                f"at {'.'.join(map(str, e.errors()[0]['loc'])) or 'top level'}; expected "
                "{p50_ms, p95_ms, max_ms, samples}"
            ) from e
    return data


def compare_baselines(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[ComparisonRow]:
    """Compare the latency of two baselines, series by series.

    Args:
        a: The "before" baseline (as ``load_baseline`` returns it).
        b: The "after" baseline.

    Returns:
        For every latency series present in both, sorted by series name, one row per statistic
        (``p50_ms``, ``p95_ms``, ``max_ms``): ``(f"{series}.{stat}", before, after, ratio)``
        where ``ratio = after / before`` (above 1 is slower); ``inf`` when only ``before`` is
        0, and 1 when both are. Series found in only one baseline are left out.
    """
    rows: list[ComparisonRow] = []
    for series in sorted(a["latency"].keys() & b["latency"].keys()):
        for stat in STATS:
            before = float(a["latency"][series][stat])
            after = float(b["latency"][series][stat])
            if before > 0:
                ratio = after / before
            else:
                ratio = 1.0 if after == 0 else math.inf
            rows.append((f"{series}.{stat}", before, after, ratio))
    return rows


def format_comparison(rows: Sequence[ComparisonRow], *, before: str = "before", after: str = "after") -> str:
    """Render comparison rows as a side-by-side text table.

    Args:
        rows: Rows from ``compare_baselines``.
        before: Header of the first column of numbers (e.g. a baseline name or commit).
        after: Header of the second one.

    Returns:
        A table with one line per row and columns ``latency``, ``before (ms)``, ``after (ms)``,
        ``ratio`` and ``change``; a one-line note when there are no rows.
    """
    if not rows:
        return "no latency series in common"
    header = ("latency", f"{before} (ms)", f"{after} (ms)", "ratio", "change")
    body = [
        (
            key,
            f"{x:.3f}",
            f"{y:.3f}",
            f"{ratio:.2f}x",
            f"{(ratio - 1) * 100:+.1f}%" if math.isfinite(ratio) else "n/a",
        )
        for key, x, y, ratio in rows
    ]
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        )
        for line in (header, *body)
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def environment_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """The environment fields that differ between two baselines (nested keys dotted).

    Latency ratios across different devices, torch builds or flags compare the environments as
    much as the code; print this next to ``format_comparison``.

    Args:
        a: The "before" baseline.
        b: The "after" baseline.

    Returns:
        ``(key, before, after)`` for each differing field, sorted by key; a field missing on one
        side appears as None there.
    """
    flat_a, flat_b = _flatten(a["environment"]), _flatten(b["environment"])
    return [
        (key, flat_a.get(key), flat_b.get(key))
        for key in sorted(flat_a.keys() | flat_b.keys())
        if flat_a.get(key) != flat_b.get(key)
    ]


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
