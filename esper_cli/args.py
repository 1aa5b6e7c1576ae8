"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
from collections.abc import Iterator

from esper_cli.choices import PINNABLE_POLICIES
from esper_cli.local_prefect import LocalPrefect
from esper_cli.temporary_server import TemporaryServer, prefect_defaults


def positive(text: str) -> int:
    """An ``int`` >= 1, or an argparse error that says so."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def share(text: str) -> float:
    """A ``float`` in (0, 1], or an argparse error that says so."""
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a share in (0, 1], e.g. 0.25 for the first quarter, got {text}")
    return value


def policy_choice(text: str) -> str:
    """What ``esper run --policy`` takes: a name of ``PINNABLE_POLICIES``, or ``gnn:<N>`` for Simic
    version N (``esper_core.tamiyo.config.check_pinnable`` decides the same in the flow)."""
    number = text.removeprefix("gnn:")
    if text in PINNABLE_POLICIES or (text.startswith("gnn:") and number.isdigit() and int(number) >= 1):
        return text
    raise argparse.ArgumentTypeError(
        f"must be one of {', '.join(PINNABLE_POLICIES)} or gnn:<N> (Simic version N >= 1), got {text!r}"
    )


def quiet_prefect() -> None:
    """Esper's Prefect defaults (no analytics call, a longer start-up wait), before Prefect is imported.

    Users who set these variables keep their choice (``esper_cli.temporary_server.prefect_defaults``).
    """
    prefect_defaults()


def prefect_for_command() -> TemporaryServer | None:
    """Decide where this command's flows go, first thing, before Prefect is imported.

    ``PREFECT_API_URL`` when it is set; else the ``esper server start`` of this ``ESPER_HOME``
    when one runs (exported as ``PREFECT_API_URL``: the run then shows in its UI, and no
    temporary server is started); else a temporary server, started now in the background so
    that its start overlaps the command's own planning and checks. ``local_flow_settings``
    takes what this returns. A temporary server is stopped when the command exits (a check
    that fails included).
    """
    prefect_defaults()
    if os.environ.get("PREFECT_API_URL"):
        return None
    from esper_core.settings import EsperSettings

    running = LocalPrefect.running_api_url(EsperSettings().home)
    if running is not None:
        os.environ["PREFECT_API_URL"] = running
        return None
    server = TemporaryServer()
    # Registered before Prefect's own exit handlers (its log shipping among them), so it runs
    # after them: the server stays up until the last log line has reached it.
    atexit.register(server.stop)
    return server.begin()


@contextlib.contextmanager
def local_flow_settings(server: TemporaryServer | None) -> Iterator[None]:
    """Prefect settings for flows the CLI runs in this process.

    On the command's temporary server (``prefect_for_command``): its URL, once it answers. The
    flow-run heartbeat exists to detect crashed runs for workers; a temporary server dies with
    the process, so it only adds its thread's join (~1 s) to every flow run. It can only be
    switched off in-process (the setting takes None, which no environment value gives).
    Deployments run by workers keep it. The temporary server does not check CSRF tokens unless
    a user switched that on, so its clients skip fetching one (an API call per client, that is
    per flow run).
    """
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_CLIENT_CSRF_SUPPORT_ENABLED,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        get_current_settings,
        temporary_settings,
    )

    settings = get_current_settings()
    if server is None or settings.api.url:  # a real server: its crash detection needs the heartbeat
        if server is not None:  # a Prefect profile names one: it wins over the temporary server
            server.stop()
        yield
        return
    updates: dict = {PREFECT_API_URL: server.wait(), PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    if not settings.server.api.csrf_protection_enabled:
        updates[PREFECT_CLIENT_CSRF_SUPPORT_ENABLED] = False
    with temporary_settings(updates=updates):
        yield
