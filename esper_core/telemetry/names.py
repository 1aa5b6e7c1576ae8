"""Telemetry naming rules: metric/event names and label keys, with errors that say how to fix.

The contracts (``MetricPoint``, ``TelemetryEvent``) already enforce the name pattern, but pydantic
reports only the raw regex. These checks run first so that a bad name fails at the call site with
the rule spelled out (DESIGN.md "Telemetry names").
"""

from __future__ import annotations

import re

# Same pattern as ``MetricPoint.name`` / ``TelemetryEvent.name`` in the contracts; a test pins the
# two together so they cannot drift apart.
NAME_PATTERN = r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$"
NAME_RULE = (
    "names follow 'subsystem.area.name': lower case letters, digits and underscores, "
    "at least two parts separated by dots, starting with a letter "
    "(e.g. 'tolaria.training.latency_ms')"
)

# Prometheus label names; a leading double underscore is reserved by Prometheus itself.
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NAME_RE = re.compile(NAME_PATTERN)

RESERVED_LABELS = frozenset({"source", "workload"})
"""Label keys the Prometheus exposition adds itself (the packet's source, the run's recipe)."""

PREFIX = "esper_"
COUNTER_SUFFIX = "_total"


def check_name(name: str, *, kind: str = "metric") -> str:
    """Validate a telemetry metric or event name.

    Args:
        name: The dotted name, e.g. ``tolaria.training.latency_ms``.
        kind: What the name is for (``"metric"`` or ``"event"``), used in the error message.

    Returns:
        ``name`` unchanged.

    Raises:
        ValueError: If ``name`` does not follow ``subsystem.area.name``.
    """
    if not isinstance(name, str) or _NAME_RE.match(name) is None:
        raise ValueError(f"invalid {kind} name {name!r}: {NAME_RULE}")
    return name


def check_label_key(key: str, *, metric: str) -> str:
    """Validate one label key of a metric.

    Args:
        key: The label key.
        metric: The metric the label belongs to, for the error message.

    Returns:
        ``key`` unchanged.

    Raises:
        ValueError: If ``key`` is not a valid Prometheus label name or is reserved.
    """
    if _LABEL_RE.match(key) is None or key.startswith("__"):
        raise ValueError(
            f"invalid label {key!r} on metric {metric}: label keys are letters, digits and "
            "underscores, start with a letter or '_', and may not start with '__'"
        )
    if key in RESERVED_LABELS:
        raise ValueError(
            f"label {key!r} on metric {metric} is reserved: the exporter adds the packet's "
            "source and the run's workload itself; rename the label (e.g. 'origin')"
        )
    return key


def prometheus_name(name: str) -> str:
    """Map a dotted telemetry name to its Prometheus name.

    Args:
        name: E.g. ``tolaria.training.latency_ms``.

    Returns:
        E.g. ``esper_tolaria_training_latency_ms``: dots become underscores under ``esper_``.

    Raises:
        ValueError: If ``name`` does not follow ``subsystem.area.name``.
    """
    return PREFIX + check_name(name).replace(".", "_")


MS_SUFFIX = "_ms"


def histogram_name(name: str) -> str | None:
    """The Prometheus histogram (in seconds) a millisecond metric is also observed into.

    Packets, baselines and the ``*_ms`` gauges keep the seeds' millisecond names; Prometheus
    convention is base units, so ``tolaria.training.latency_ms`` is also exported as the
    histogram ``esper_tolaria_training_latency_seconds`` (for ``histogram_quantile``).

    Args:
        name: A dotted metric name.

    Returns:
        The histogram's base name (without ``_bucket``/``_sum``/``_count``), or ``None`` when
        ``name`` does not end in ``_ms``.
    """
    if not name.endswith(MS_SUFFIX):
        return None
    return prometheus_name(name).removesuffix(MS_SUFFIX) + "_seconds"
