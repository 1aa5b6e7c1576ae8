"""Pushing a Prometheus registry to a Pushgateway, for workers that cannot be scraped.

A flow-run process on a remote worker may end before Prometheus scrapes it; ``PushingSink``
forwards every packet to the ``PrometheusSink`` it wraps and pushes the whole registry at most
every ``interval_s`` seconds, and once more on ``close()``. Each process pushes under its own
grouping key (``instance=<host>:<pid>``), so concurrent workers never overwrite each other.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, push_to_gateway

from esper_core.contracts import TelemetryPacket
from esper_core.telemetry.prometheus import PrometheusSink

log = logging.getLogger(__name__)

Push = Callable[..., Any]


def default_grouping_key() -> dict[str, str]:
    """``{"instance": "<host>:<pid>"}``: one Pushgateway group per process."""
    return {"instance": f"{socket.gethostname()}:{os.getpid()}"}


class PushingSink:
    """A ``PrometheusSink`` whose registry is also pushed to a Pushgateway.

    Args:
        sink: The sink whose registry is pushed (it keeps serving ``/metrics`` if served).
        url: The Pushgateway, e.g. ``http://127.0.0.1:9091``.
        job: The ``job`` label of the pushed group.
        grouping_key: Further labels of the group; default ``default_grouping_key()``.
        interval_s: Least time between two pushes triggered by packets.
        push: The push function (``prometheus_client.push_to_gateway``; tests may count calls).

    Raises:
        ValueError: If ``url`` is not an http(s) URL or ``interval_s`` is negative.
    """

    def __init__(
        self,
        sink: PrometheusSink,
        *,
        url: str,
        job: str = "esper",
        grouping_key: Mapping[str, str] | None = None,
        interval_s: float = 5.0,
        push: Push = push_to_gateway,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"ESPER_PUSHGATEWAY_URL must be an http(s) URL such as http://127.0.0.1:9091, got {url!r}")
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        self.sink = sink
        self.url = url
        self.job = job
        self.grouping_key = dict(grouping_key) if grouping_key is not None else default_grouping_key()
        self.interval_s = interval_s
        self._push = push
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._warned = False

    @property
    def registry(self) -> CollectorRegistry:
        """The registry that is pushed."""
        return self.sink.registry

    def emit(self, packet: TelemetryPacket) -> None:
        """Update the registry, then push if the last push is ``interval_s`` old."""
        self.sink.emit(packet)
        if time.monotonic() - self._last >= self.interval_s:
            self.push()

    def push(self) -> bool:
        """Push the registry now; returns whether the Pushgateway accepted it.

        A Pushgateway that is down must not stop training: the failure is logged once (with the
        URL) and the next push tries again.
        """
        with self._lock:
            self._last = time.monotonic()
            try:
                self._push(
                    self.url, job=self.job, registry=self.sink.registry, grouping_key=self.grouping_key, timeout=2
                )
            except OSError as e:  # URLError and connection errors are OSErrors
                if not self._warned:
                    log.warning(
                        "cannot push metrics to the Pushgateway at %s (%s); will retry on later packets", self.url, e
                    )
                    self._warned = True
                return False
            self._warned = False
            return True

    def close(self) -> None:
        """Push the final values (the registry itself stays usable)."""
        self.push()
