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
    Deployments run by workers keep it. The temporary server is started here, one process at a
    time (``start_temporary_server``), so that several commands started together all work.
    """
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

    if get_current_settings().api.url:  # a real server: its crash detection needs the heartbeat
        yield
        return
    start_temporary_server()
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
