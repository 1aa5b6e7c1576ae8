"""Pushing a Prometheus registry to a Pushgateway, for workers that cannot be scraped.

A flow-run process on a remote worker may end before Prometheus scrapes it; ``PushingSink``
forwards every packet to the ``PrometheusSink`` it wraps and pushes the whole registry at most
every ``interval_s`` seconds. Each process pushes under its own grouping key
(``instance=<host>:<pid>``), so concurrent workers never overwrite each other.

A Pushgateway keeps a group until someone deletes it, and Prometheus keeps scraping what it
holds: a run's last "over budget" gauge would alert forever. So ``close()`` (the end of a run,
and the end of the process) pushes the final values, waits ``linger_s`` so that Prometheus
scrapes them, and deletes the group. A process killed before it can do so leaves its group
behind; the alert rules ignore a group whose ``push_time_seconds`` is stale and report it as
silent instead (``infra/prometheus/rules/esper.rules.yml``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, delete_from_gateway, push_to_gateway

from esper_core.contracts import TelemetryPacket
from esper_core.telemetry.prometheus import PrometheusSink

log = logging.getLogger(__name__)

DEFAULT_LINGER_S = 6.0
"""Seconds a closing sink keeps its final values on the Pushgateway before deleting them: a
little more than the 5 s interval at which ``infra/prometheus/prometheus.yml`` scrapes it (a test
keeps the two together)."""
_TIMEOUT_S = 2.0  # a Pushgateway that hangs must not hold up training for long


def default_grouping_key() -> dict[str, str]:
    """``{"instance": "<host>:<pid>"}``: one Pushgateway group per process."""
    return {"instance": f"{socket.gethostname()}:{os.getpid()}"}


class PushingSink:
    """A ``PrometheusSink`` whose registry is also pushed to a Pushgateway.

    The sink may outlive ``close()``: a process that runs several runs one after the other
    closes it at the end of each; the next packet pushes the group again at once and the next
    ``close()`` deletes it again. (Runs that share a process concurrently share its group: one
    run's end removes it until another run's next packet, a gap of one epoch.)

    Args:
        sink: The sink whose registry is pushed (it keeps serving ``/metrics`` if served).
        url: The Pushgateway, e.g. ``http://127.0.0.1:9091``.
        job: The ``job`` label of the pushed group.
        grouping_key: Further labels of the group; default ``default_grouping_key()``.
        interval_s: Least time between two pushes triggered by packets.
        linger_s: Time between the final push and the deletion of the group in ``close()``;
            at least the Prometheus scrape interval of the Pushgateway, or the final values
            may never be scraped.

    Raises:
        ValueError: If ``url`` is not an http(s) URL, or ``interval_s`` or ``linger_s`` is
            negative.
    """

    def __init__(
        self,
        sink: PrometheusSink,
        *,
        url: str,
        job: str = "esper",
        grouping_key: Mapping[str, str] | None = None,
        interval_s: float = 5.0,
        linger_s: float = DEFAULT_LINGER_S,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"ESPER_PUSHGATEWAY_URL must be an http(s) URL such as http://127.0.0.1:9091, got {url!r}")
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        if linger_s < 0:
            raise ValueError(f"linger_s must be >= 0 (0 deletes the group right after the final push), got {linger_s}")
        self.sink = sink
        self.url = url
        self.job = job
        self.grouping_key = dict(grouping_key) if grouping_key is not None else default_grouping_key()
        self.interval_s = interval_s
        self.linger_s = linger_s
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._warned = False
        self._open = False  # packets arrived since the group was last deleted

    @property
    def registry(self) -> CollectorRegistry:
        """The registry that is pushed."""
        return self.sink.registry

    def label_run(self, run_id: str, *, workload: str) -> None:
        """Label run ``run_id``'s series with ``workload``; see ``PrometheusSink.label_run``."""
        self.sink.label_run(run_id, workload=workload)

    def emit(self, packet: TelemetryPacket) -> None:
        """Update the registry, then push if the last push is ``interval_s`` old."""
        self.sink.emit(packet)
        self._open = True
        if time.monotonic() - self._last >= self.interval_s:
            self.push()

    def push(self) -> bool:
        """Push the registry now; returns whether the Pushgateway accepted it.

        A Pushgateway that is down must not stop training: the failure is logged once (with the
        URL) and the next push tries again.
        """
        with self._lock:
            self._last = time.monotonic()
            return self._call(
                push_to_gateway,
                "push metrics to",
                registry=self.sink.registry,
            )

    def delete(self) -> bool:
        """Delete this sink's group from the Pushgateway; returns whether that succeeded."""
        with self._lock:
            return self._call(delete_from_gateway, "delete the metrics group from")

    def close(self) -> None:
        """End of the run or process: push the final values, wait ``linger_s``, delete the group.

        Does nothing when no packet arrived since the group was last deleted (e.g. the process
        ends right after its run was closed). The registry itself stays usable.
        """
        if not self._open:
            return
        self._open = False
        if self.push() and self.linger_s > 0:
            time.sleep(self.linger_s)
        if self.delete():
            self._last = -float("inf")  # the group is gone: the next packet recreates it at once

    def _call(self, request: Callable[..., None], what: str, **kwargs: object) -> bool:
        """One request to the Pushgateway; the caller holds the lock."""
        try:
            request(self.url, job=self.job, grouping_key=self.grouping_key, timeout=_TIMEOUT_S, **kwargs)
        except OSError as e:  # URLError and connection errors are OSErrors
            if not self._warned:
                log.warning("cannot %s the Pushgateway at %s (%s); will retry on later packets", what, self.url, e)
                self._warned = True
            return False
        self._warned = False
        return True
