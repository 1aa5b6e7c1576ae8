"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse
import os


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
