"""Process-wide state of the task layer: settings, telemetry sinks and live run sessions.

Why live sessions are kept here: a Prefect task takes and returns small serialisable values
(practice 10), so the morphogenesis flow's tasks pass a ``RunHandle``, not the ``Run`` (which
holds the model, its optimizer, open files and a Tamiyo thread). Rebuilding the run from its last
commit in every ``grow`` task would cost a restore per task, so the process that started the run
keeps it live here, by run id, from ``start-run`` (``remember``) to ``finish-run`` (``forget``).
It is a cache, never the truth: the run's state is its last commit, and a task in another
process (or after a crash) finds nothing here and reopens the run from that commit
(``session_for``), which gives the same run.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading

from prometheus_client import CollectorRegistry

from esper_core.run.session import Run, RunHandle
from esper_core.settings import EsperSettings
from esper_core.telemetry import FanoutSink, JsonlSink, PrometheusSink, TelemetrySink, serve
from esper_core.telemetry.catalog import help_text
from esper_core.telemetry.push import PushingSink

log = logging.getLogger(__name__)
_lock = threading.Lock()
_sessions: dict[str, Run] = {}  # run id -> the live run of this process (see the module's docstring)


def settings() -> EsperSettings:
    """Settings from the environment (``ESPER_*``), read per call so tests can change them."""
    return EsperSettings()


@functools.cache
def prometheus() -> PrometheusSink | PushingSink:
    """The process's Prometheus sink.

    Served at ``http://127.0.0.1:<ESPER_PROMETHEUS_PORT>/metrics`` when that is set, and pushed
    to ``ESPER_PUSHGATEWAY_URL`` when that is set (both may be). Metric help texts come from
    the telemetry catalogue.
    """
    registry = CollectorRegistry()
    s = settings()
    if s.prometheus_port is not None:
        try:
            # Loopback only: a Prometheus elsewhere reads the Pushgateway or a local agent.
            serve(s.prometheus_port, registry, addr="127.0.0.1")
        except OSError as e:
            # Two flow-run processes on one machine cannot share the port; the second one
            # trains on (metrics still go to telemetry.jsonl and any Pushgateway).
            log.warning(
                "cannot serve Prometheus metrics on 127.0.0.1:%d (%s); another Esper process holds it? "
                "Set ESPER_PUSHGATEWAY_URL for concurrent flow runs",
                s.prometheus_port,
                e,
            )
    sink = PrometheusSink(registry, describe=help_text)
    if s.pushgateway_url:
        pushing = PushingSink(sink, url=s.pushgateway_url)
        # Packets push at most every few seconds; when the process ends, the last values go out
        # and the group is deleted (a run's close does the same), so no stale group alerts on.
        atexit.register(pushing.close)
        return pushing
    return sink


def run_sink(run_id: str, workload: str) -> TelemetrySink:
    """The Prometheus sink of a run trained in another process (rank 0 of ``esper run --nproc``),
    labelled as ``remember`` labels a live session's. Built in that process: when this one
    serves ``ESPER_PROMETHEUS_PORT`` the rank cannot, and its metrics reach Prometheus through
    ``ESPER_PUSHGATEWAY_URL`` (and telemetry.jsonl always)."""
    sink = prometheus()
    sink.label_run(run_id, workload=workload)
    return sink


def service_sink() -> TelemetrySink:
    """Where telemetry of work outside a run (compiles, publishes) goes."""
    return FanoutSink(JsonlSink(settings().home / "telemetry.jsonl"), prometheus())


def remember(session: Run) -> None:
    """Keep ``session`` live for the following tasks of its run in this process."""
    # Its Prometheus series carry workload=<recipe>: alert rules are scoped by workload.
    prometheus().label_run(session.run_id, workload=session.config.recipe)
    with _lock:
        _sessions[session.run_id] = session


def session_for(handle: RunHandle) -> Run:
    """The live session of ``handle``, reopened from its last commit if this process has none."""
    with _lock:
        session = _sessions.get(handle.run_id)
    if session is None:
        session = Run.resume(settings=settings(), run_id=handle.run_id, extra_sink=prometheus())
        remember(session)
    return session


def forget(handle: RunHandle) -> None:
    """Close and drop the live session of ``handle``."""
    with _lock:
        session = _sessions.pop(handle.run_id, None)
    if session is not None:
        session.close()
