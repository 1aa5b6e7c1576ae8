"""``esper_core.child.run_in_child``: the result, the error and the log lines come back; a time limit
kills the child and everything it started."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from esper_core.child import ChildTimeoutError, run_in_child
from tests.helpers.waiting import wait_for


def test_the_result_and_the_log_records_come_back(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="esper_core"):
        assert run_in_child("tests.helpers.child_targets:log_and_double", 21, limit_s=120) == 42
    assert [(r.name, r.getMessage()) for r in caplog.records] == [("esper_core.child_test", "doubling 21")]


def test_an_error_is_raised_again_with_its_type() -> None:
    with pytest.raises(json.JSONDecodeError) as error:
        run_in_child("json:loads", "{", limit_s=120)
    assert any("in the child process" in note for note in error.value.__notes__)


def test_a_limit_kills_the_child_and_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    start = time.monotonic()
    with pytest.raises(ChildTimeoutError, match="ran past its time limit of 3 s"):
        # The grandchild would sleep for a minute; the limit stops it after 3 s.
        run_in_child("tests.helpers.child_targets:sleep_in_grandchild", pid_file, limit_s=3)
    assert time.monotonic() - start < 50
    grandchild = int(pid_file.read_text())
    wait_for(
        lambda: not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE,
        what=f"grandchild {grandchild} to end at the limit",
        timeout_s=30,
    )


def test_a_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit_s must be positive"):
        run_in_child("json:loads", "{}", limit_s=0)
