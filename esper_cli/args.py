"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from esper_cli.local_prefect import prefect_defaults, start_temporary_server


def positive(text: str) -> int:
    """An ``int`` >= 1, or an argparse error that says so."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def quiet_prefect() -> None:
    """Esper's Prefect defaults (no analytics call, a longer start-up wait), before Prefect is imported.

    Users who set these variables keep their choice (``esper_cli.local_prefect.prefect_defaults``).
    """
    prefect_defaults()


@contextlib.contextmanager
def local_flow_settings() -> Iterator[None]:
    """Prefect settings for flows the CLI runs in this process (on a temporary server).

    The flow-run heartbeat exists to detect crashed runs for workers; here the temporary server
    dies with the process, so it only adds its thread's join (~1 s) to every flow run. It can
    only be switched off in-process (the setting takes None, which no environment value gives).
    Deployments run by workers keep it. The temporary server does not check CSRF tokens unless
    a user switched that on, so its clients skip fetching one (an API call per client, that is
    per flow run). The temporary server is started here, one process at a time
    (``start_temporary_server``), so that several commands started together all work.
    """
    from prefect.settings import (
        PREFECT_CLIENT_CSRF_SUPPORT_ENABLED,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        get_current_settings,
        temporary_settings,
    )

    settings = get_current_settings()
    if settings.api.url:  # a real server: its crash detection needs the heartbeat
        yield
        return
    start_temporary_server()
    updates: dict = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    if not settings.server.api.csrf_protection_enabled:
        updates[PREFECT_CLIENT_CSRF_SUPPORT_ENABLED] = False
    with temporary_settings(updates=updates):
        yield
