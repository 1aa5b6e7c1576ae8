"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator


def positive(text: str) -> int:
    """An ``int`` >= 1, or an argparse error that says so."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def quiet_prefect() -> None:
    """Turn off the Prefect server's usage-analytics call before Prefect is imported.

    Without a network it only logs an error; users who set the variable keep their choice.
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@contextlib.contextmanager
def local_flow_settings() -> Iterator[None]:
    """Prefect settings for flows the CLI runs in this process (on a temporary server).

    The flow-run heartbeat exists to detect crashed runs for workers; here the temporary server
    dies with the process, so it only adds its thread's join (~1 s) to every flow run. It can
    only be switched off in-process (the setting takes None, which no environment value gives).
    Deployments run by workers keep it.
    """
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

    if get_current_settings().api.url:  # a real server: its crash detection needs the heartbeat
        yield
        return
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
