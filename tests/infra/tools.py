"""Find an external tool a test runs (promtool, the Pushgateway), or say how to get it.

Locally a missing tool skips the test with the install command; in CI (``CI=true``, set by
``.ci/run``, which installs them) a missing tool fails it, so these tests never silently stop
running there.
"""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(command: str, *, apt_package: str) -> str:
    """The path of ``command``; skips the test locally and fails it in CI when it is missing."""
    path = shutil.which(command)
    if path is not None:
        return path
    why = f"{command} is not installed: apt-get install -y {apt_package}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why} (CI must have it: .ci/run installs it)")
    pytest.skip(why)
