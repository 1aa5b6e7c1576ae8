"""Waiting on a condition, never on time: the one polling loop the tests share.

A test that sleeps a fixed time fails on a busy machine; one that polls a condition up to a
generous deadline passes as soon as the condition holds and fails, naming what it waited for,
only when it never does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], *, what: str, timeout_s: float, interval_s: float = 0.05) -> T:
    """Call ``condition`` until it returns something truthy, and return that.

    Raises:
        AssertionError: ``timeout_s`` passed first (the message names ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)
    return value


def poll(read: Callable[[], T], done: Callable[[T], bool], *, timeout_s: float, interval_s: float = 0.05) -> T:
    """Call ``read`` until ``done`` holds for its value or ``timeout_s`` passes; return the last
    value either way, for the caller to assert on (its message can then show what was read)."""
    deadline = time.monotonic() + timeout_s
    while not done(value := read()) and time.monotonic() < deadline:
        time.sleep(interval_s)
    return value
