"""Progress displays, ``--version``, ``-v`` and the bench compile table of the ``esper`` command.

Whether a display appears depends on stderr being a terminal, so the end-to-end tests run the
real command in a child process with stderr on a pseudo-terminal and stdout on a pipe.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from esper_cli.main import main
from esper_cli.progress import LOGGERS, _route_handlers, follow_task_runs
from esper_core.run.recipes import RECIPES
from esper_core.settings import EsperSettings

ROOT = Path(__file__).resolve().parents[2]
# Exactly 5 epochs (--min-seconds 0): these tests are about the display, not the timing.
SEED_REFERENCE = [
    *("bench", "seed-reference", "--epochs", "5", "--min-seconds", "0"),
    *("--warmup-batches", "0", "--no-compile", "--seeds", "0"),
]
BAR = "━"  # rich's bar glyph: only a progress display draws it


def run_with_terminal_stderr(*argv: str) -> tuple[int, str, str]:
    """``python -m esper_cli ARGV`` with stderr on a pseudo-terminal; returns (rc, stdout, stderr)."""
    env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(ROOT)}
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(name, None)
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "esper_cli", *argv],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=secondary,
    )
    os.close(secondary)
    err = bytearray()
    try:
        while True:
            ready, _, _ = select.select([primary], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # the child closed the terminal (Linux reports EIO)
                    break
                if not chunk:
                    break
                err += chunk
            elif proc.poll() is not None:
                break
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.wait(timeout=60)
    finally:
        os.close(primary)
    return proc.returncode, out.decode(), err.decode(errors="replace")


@pytest.fixture
def esper_loggers() -> Iterator[None]:
    """Restore the levels ``-v`` sets on Esper's loggers after the test."""
    levels = {name: logging.getLogger(name).level for name in LOGGERS}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_version_names_esper_and_its_stack(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("esper 0.1.0 (torch 2.")
    assert "prefect 3." in out and "Python 3." in out


@pytest.mark.parametrize(("flags", "level"), [([], logging.NOTSET), (["-v"], logging.INFO), (["-vv"], logging.DEBUG)])
def test_verbose_sets_esper_loggers(
    flags: list[str], level: int, esper_loggers: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logging.getLogger("esper_core").setLevel(logging.NOTSET)
    assert main([*flags, "catalog", "list", "--json"]) == 0
    json.loads(capsys.readouterr().out)  # -v never reaches stdout
    assert logging.getLogger("esper_core").level == level
    assert logging.getLogger("bench").level == level


def test_help_lists_the_choices_of_recipes_and_plans(capsys: pytest.CaptureFixture[str]) -> None:
    expected = {
        ("run",): sorted(RECIPES),
        ("bench", "orchestration"): sorted(RECIPES),
        ("catalog", "compile"): sorted(RECIPES),
        ("bench", "growth"): ["digits-cnn", "digits-mlp", "seed-reference", "default", "smoke"],
    }
    for argv, names in expected.items():
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        out = "".join(capsys.readouterr().out.split())  # argparse wraps lines, also at hyphens
        for name in names:
            assert name in out, f"{argv} --help does not list {name}"


def test_unknown_plan_and_recipe_are_refused_before_work(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "growth", "--plan", "huge"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err
    # A user's model without build_scaled has no frontier: refused before any kernel is compiled.
    assert main(["bench", "growth", "--recipes", "tests.helpers.user_model:recipe"]) == 2
    assert "without ModelSpec.build_scaled" in capsys.readouterr().err
    # run's --recipe is not a closed choice (recipes may be import paths) but is checked first.
    assert main(["run", "--recipe", "nope"]) == 2
    assert "unknown recipe 'nope'; choose one of" in capsys.readouterr().err


def test_progress_is_off_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SEED_REFERENCE) == 0
    captured = capsys.readouterr()
    assert "seed-reference on cpu: 5 epochs" in captured.out
    assert BAR not in captured.err and "timed epochs" not in captured.err


def test_log_handlers_on_the_terminal_are_routed_above_the_display_and_back() -> None:
    terminal, proxy = io.StringIO(), io.StringIO()
    logger = logging.getLogger("esper-test-route")
    plain = logging.StreamHandler(terminal)
    rich_handler = logging.Handler()
    rich_handler.console = Console(file=terminal)  # type: ignore[attr-defined]  # as Prefect's handler has
    other = logging.StreamHandler(io.StringIO())
    for handler in (plain, rich_handler, other):
        logger.addHandler(handler)
    try:
        undo = _route_handlers(terminal, proxy)
        assert plain.stream is proxy and rich_handler.console.file is proxy  # type: ignore[attr-defined]
        assert other.stream is not proxy
        for restore in undo:
            restore()
        assert plain.stream is terminal and rich_handler.console.file is terminal  # type: ignore[attr-defined]
    finally:
        for handler in (plain, rich_handler, other):
            logger.removeHandler(handler)


class _Recorder:
    """A display that records what it was told (``follow_task_runs`` only calls it)."""

    enabled = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int | None]] = []

    def __call__(self, description: str, completed: int, total: int | None) -> None:
        self.calls.append((description, completed, total))


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_follow_task_runs_counts_finished_task_runs_of_a_real_flow() -> None:
    from prefect import flow, task

    @task(name="step-a")
    def step_a(x: int) -> int:
        return x + 1

    @task(name="step-b")
    def step_b(x: int) -> int:
        return x * 2

    @flow(name="progress-probe")
    def probe() -> int:
        return step_b(step_a(1)) + step_b(step_a(2))

    display = _Recorder()
    handlers = list(logging.getLogger("prefect.task_runs").handlers)
    with follow_task_runs(display, {"step-a": "a done", "step-b": "b done"}):  # type: ignore[arg-type]
        assert probe() == 10
    assert display.calls[-1] == ("2 a done, 2 b done", 4, None)
    assert [completed for _, completed, _ in display.calls] == [1, 2, 3, 4]
    assert logging.getLogger("prefect.task_runs").handlers == handlers  # detached again


@pytest.mark.slow
def test_progress_draws_on_a_terminal_and_json_stays_clean(esper_home: EsperSettings) -> None:
    rc, out, err = run_with_terminal_stderr(*SEED_REFERENCE)
    assert rc == 0, err
    assert "seed-reference on cpu: 5 epochs" in out and "\x1b[" not in out
    assert BAR in err and "timed epochs" in err and "5/5" in err

    rc, out, err = run_with_terminal_stderr("-v", *SEED_REFERENCE, "--json")
    assert rc == 0, err
    result = json.loads(out)  # nothing but the JSON object on stdout
    assert result["workload"] == "seed-reference" and result["epochs"] == 5
    assert BAR not in err  # --json switches the display off
    assert "esper device: cpu" in err  # -v: Esper's INFO records on stderr


@pytest.mark.slow
def test_bench_compile_prints_a_table(
    esper_home: EsperSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scratch = f"sqlite:///{tmp_path / 'scratch.db'}"
    argv = ["bench", "compile", "--backend", "export", "--load-repeats", "1", "--publishes", "10", "--lookups", "20"]
    assert main([*argv, "--registry-url", scratch]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("compile residual_mlp f64-b512 with export on cpu: artifact active")
    table = "\n".join(lines)
    assert "{" not in table  # a table, not JSON
    for label in ("compile, cold", "compile, warm", "Kasmina load", "first use / cold compile"):
        assert label in table
    lookups = [line for line in lines if line.startswith("registry lookup p95")]
    assert len(lookups) == 2 and all("<= 2" in line for line in lookups)  # SQLite file and --registry-url
