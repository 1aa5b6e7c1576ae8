"""Process-wide state of the task layer: settings, telemetry sinks and live run sessions.

A live ``RunSession`` is cached per process so consecutive tasks of a run skip re-building it;
a task in another process (or after a crash) reopens the run from its last commit instead.
"""

from __future__ import annotations

import functools
import threading

from prometheus_client import CollectorRegistry

from esper_core.session import RunHandle, RunSession
from esper_core.settings import EsperSettings
from esper_core.telemetry import FanoutSink, JsonlSink, PrometheusSink, TelemetrySink, serve

_lock = threading.Lock()
_sessions: dict[str, RunSession] = {}


def settings() -> EsperSettings:
    """Settings from the environment (``ESPER_*``), read per call so tests can change them."""
    return EsperSettings()


@functools.cache
def prometheus() -> PrometheusSink:
    """The process's Prometheus sink; served over HTTP when ``ESPER_PROMETHEUS_PORT`` is set."""
    registry = CollectorRegistry()
    port = settings().prometheus_port
    if port is not None:
        serve(port, registry)
    return PrometheusSink(registry)


def service_sink() -> TelemetrySink:
    """Where telemetry of work outside a run (compiles, publishes) goes."""
    return FanoutSink(JsonlSink(settings().home / "telemetry.jsonl"), prometheus())


def remember(session: RunSession) -> None:
    """Keep ``session`` live for the following tasks of its run in this process."""
    with _lock:
        _sessions[session.run_id] = session


def session_for(handle: RunHandle) -> RunSession:
    """The live session of ``handle``, reopened from its last commit if this process has none."""
    with _lock:
        session = _sessions.get(handle.run_id)
    if session is None:
        session = RunSession.open(settings=settings(), run_id=handle.run_id, extra_sink=prometheus())
        remember(session)
    return session


def forget(handle: RunHandle) -> None:
    """Close and drop the live session of ``handle``."""
    with _lock:
        session = _sessions.pop(handle.run_id, None)
    if session is not None:
        session.close()
