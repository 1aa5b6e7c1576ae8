"""Telemetry sinks: where packets go (a JSONL file, memory, nowhere, several places at once).

Every sink implements the two-method ``TelemetrySink`` protocol, so code that emits telemetry
takes a sink and never checks whether telemetry is enabled: disabled telemetry is a ``NullSink``
(STYLE.md practice 24). ``PrometheusSink`` lives in ``prometheus.py``.
"""

from __future__ import annotations

import json
import logging
import threading
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from pydantic import ValidationError

from esper_core.contracts import TelemetryPacket

logger = logging.getLogger(__name__)


@runtime_checkable
class TelemetrySink(Protocol):
    """Receives telemetry packets."""

    def emit(self, packet: TelemetryPacket) -> None:
        """Deliver one packet."""
        ...

    def close(self) -> None:
        """Release resources (files, sockets); the sink may not be used afterwards."""
        ...


def packet_to_json(packet: TelemetryPacket) -> str:
    """Serialise a packet to one line of JSON that keeps non-finite metric values.

    ``TelemetryPacket.to_json`` writes NaN and infinities as ``null``, which the contract then
    refuses to read back; a NaN loss is exactly what telemetry must not lose. ``json.dumps``
    writes them as the ``NaN`` / ``Infinity`` tokens that ``TelemetryPacket.from_json`` accepts.

    Args:
        packet: The packet.

    Returns:
        Compact JSON without a trailing newline.
    """
    return json.dumps(packet.model_dump(mode="json"), separators=(",", ":"))


class NullSink:
    """Discards every packet: the sink to pass when telemetry is disabled."""

    def emit(self, packet: TelemetryPacket) -> None:
        """Do nothing."""

    def close(self) -> None:
        """Do nothing."""


class MemorySink:
    """Keeps packets in a list, for tests and benchmarks."""

    def __init__(self) -> None:
        self.packets: list[TelemetryPacket] = []
        self.closed = False

    def emit(self, packet: TelemetryPacket) -> None:
        """Append ``packet`` to ``packets``."""
        self.packets.append(packet)

    def close(self) -> None:
        """Mark the sink closed; the packets stay readable."""
        self.closed = True


class FanoutSink:
    """Forwards each packet to several sinks, in order.

    Args:
        *sinks: The sinks to forward to.
    """

    def __init__(self, *sinks: TelemetrySink) -> None:
        self.sinks: tuple[TelemetrySink, ...] = sinks

    def emit(self, packet: TelemetryPacket) -> None:
        """Emit ``packet`` to every sink; an error in one sink propagates."""
        for sink in self.sinks:
            sink.emit(packet)

    def close(self) -> None:
        """Close every sink, in order, even if one of them raises (the first error propagates)."""
        with ExitStack() as stack:
            # ExitStack runs callbacks last-in first-out and still runs the rest after a failure.
            for sink in reversed(self.sinks):
                stack.callback(sink.close)


class JsonlSink:
    """Appends one packet per line of JSON to a file.

    Each packet is written with a single unbuffered ``write`` of one complete line, so a crash
    of the process loses at most the packet being written, and several processes (Prefect
    workers) can append to the same file without interleaving their lines. A line-buffered text
    file would split long lines across several system calls; writes are not ``fsync``-ed, so a
    machine crash can still lose what the OS had not flushed.

    Args:
        path: The file; parent directories are created, an existing file is appended to.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()

    def emit(self, packet: TelemetryPacket) -> None:
        """Append ``packet`` as one JSON line."""
        data = memoryview((packet_to_json(packet) + "\n").encode("utf-8"))
        with self._lock:
            # A raw file's write may be partial (disk full, signals); finish the line.
            while data:
                written = self._file.write(data)
                assert written is not None, "a blocking raw file never returns None"
                data = data[written:]

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_jsonl(path: str | Path) -> list[TelemetryPacket]:
    """Read the packets a ``JsonlSink`` wrote.

    A last line without its newline is what a crash in the middle of a write leaves behind: it
    is skipped with a logged warning. Any other unreadable line is an error.

    Args:
        path: The JSONL file.

    Returns:
        The packets, in file order.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If a complete line is not a valid packet; the message names the file and
            the 1-based line number.
    """
    path = Path(path)
    packets: list[TelemetryPacket] = []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    # ``split`` leaves the text after the last newline as the final element ("" if complete).
    *complete, tail = lines
    for lineno, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            packets.append(TelemetryPacket.from_json(line))
        except ValidationError as e:
            raise ValueError(
                f"{path}:{lineno}: not a valid telemetry packet ({e.error_count()} errors): "
                f"{e.errors()[0]['msg']}; remove or repair that line"
            ) from e
    if tail.strip():
        try:
            packets.append(TelemetryPacket.from_json(tail))
        except ValidationError:
            logger.warning(
                "%s:%d: skipping a truncated last line (a write was interrupted)",
                path,
                len(complete) + 1,
            )
    return packets
