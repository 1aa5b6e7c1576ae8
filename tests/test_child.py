"""``esper_core.child.run_in_child``: the result, the error and the log lines come back; a time limit
kills the child and everything it started."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from esper_core.child import ChildTimeoutError, run_in_child
from tests.helpers.processes import pid_alive
from tests.helpers.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]


class Unpicklable:
    """Pickles, but fails to unpickle: the child cannot read the request."""

    def __reduce__(self) -> tuple[object, tuple[int, int]]:
        import operator

        return operator.truediv, (1, 0)


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
        lambda: not pid_alive(grandchild),
        what=f"grandchild {grandchild} to end at the limit",
        timeout_s=30,
    )


def test_a_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit_s must be positive"):
        run_in_child("json:loads", "{}", limit_s=0)


def test_a_reused_child_serves_the_next_call_and_is_replaced_after_an_error() -> None:
    first, _ = run_in_child("tests.helpers.child_targets:pid_and_threads", limit_s=120, reuse=True)
    assert run_in_child("tests.helpers.child_targets:print_and_return", 7, limit_s=120, reuse=True) == 7
    again, _ = run_in_child("tests.helpers.child_targets:pid_and_threads", limit_s=120, reuse=True)
    assert again == first
    # A target that raised may have left its process in a bad state: that child is not kept.
    with pytest.raises(json.JSONDecodeError):
        run_in_child("json:loads", "{", limit_s=120, reuse=True)
    after, _ = run_in_child("tests.helpers.child_targets:pid_and_threads", limit_s=120, reuse=True)
    assert after != first
    wait_for(lambda: not psutil.pid_exists(first), what=f"child {first} to be stopped after its error", timeout_s=30)
    # Not reused: its own process, stopped after the call.
    other, _ = run_in_child("tests.helpers.child_targets:pid_and_threads", limit_s=120)
    assert other != after
    wait_for(lambda: not psutil.pid_exists(other), what=f"one-call child {other} to end", timeout_s=30)


def test_an_argument_that_does_not_unpickle_is_an_error_at_once() -> None:
    start = time.monotonic()
    with pytest.raises(ZeroDivisionError):
        run_in_child("tests.helpers.child_targets:pid_and_threads", Unpicklable(), limit_s=120, reuse=True)
    assert time.monotonic() - start < 60, "the child waited for its time limit"


def test_a_child_that_overran_or_died_is_not_reused(tmp_path: Path) -> None:
    first, _ = run_in_child("tests.helpers.child_targets:pid_and_threads", limit_s=120, reuse=True)
    with pytest.raises(ChildTimeoutError):
        run_in_child("tests.helpers.child_targets:sleep_in_grandchild", tmp_path / "pid", limit_s=2, reuse=True)
    wait_for(lambda: not psutil.pid_exists(first), what=f"child {first} to be stopped at the limit", timeout_s=30)
    second, _ = run_in_child("tests.helpers.child_targets:pid_and_threads", limit_s=120, reuse=True)
    with pytest.raises(RuntimeError, match="died with exit code 3"):
        run_in_child("tests.helpers.child_targets:exit_at_once", 3, limit_s=120, reuse=True)
    third, _ = run_in_child("tests.helpers.child_targets:pid_and_threads", limit_s=120, reuse=True)
    assert len({first, second, third}) == 3


def test_threads_set_the_childs_torch_threads_unless_the_environment_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    one, threads = run_in_child("tests.helpers.child_targets:pid_and_threads", limit_s=120, threads=1, reuse=True)
    assert threads == "1"
    # Another thread count is another child.
    two, threads = run_in_child("tests.helpers.child_targets:pid_and_threads", limit_s=120, threads=2, reuse=True)
    assert (threads, two != one) == ("2", True)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # an operator's (or Dask's) setting wins
    _, threads = run_in_child("tests.helpers.child_targets:pid_and_threads", limit_s=120, threads=1)
    assert threads == "3"
    with pytest.raises(ValueError, match="threads must be >= 1"):
        run_in_child("json:loads", "{}", limit_s=10, threads=0)


def test_an_idle_child_is_stopped_after_idle_s(monkeypatch: pytest.MonkeyPatch) -> None:
    import esper_core.child

    monkeypatch.setattr(esper_core.child, "IDLE_S", 0.2)
    pid, _ = run_in_child("tests.helpers.child_targets:pid_and_threads", limit_s=120, reuse=True)
    wait_for(lambda: not psutil.pid_exists(pid), what=f"idle child {pid} to be stopped", timeout_s=60)


def test_an_idle_child_ends_with_its_parent() -> None:
    code = (
        "import os; from esper_core.child import run_in_child; "
        "pid, _ = run_in_child('tests.helpers.child_targets:pid_and_threads', limit_s=120, reuse=True); "
        "print(pid, flush=True); os._exit(0)"  # no clean-up: as if the parent were killed
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    pid = int(out.stdout.split()[0])
    wait_for(lambda: not psutil.pid_exists(pid), what=f"orphaned child {pid} to exit", timeout_s=60)
