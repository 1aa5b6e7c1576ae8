"""What ``esper`` imports before it answers: commands that do not train answer at once.

torch, torch-geometric, Prefect and SQLAlchemy cost seconds to import (torch-geometric alone
pulled in Dynamo); ``--help``, ``--version`` and an argument error need none of them. The
commands import the library inside the functions that run them, and ``esper_cli.choices``
spells out the values the options offer. Each case runs in a fresh interpreter, since this test
process has imported everything already.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

import pytest

from esper_cli.main import build_parser
from esper_core.run import Run, RunSpec, grow_epoch
from esper_core.settings import EsperSettings

HEAVY = ("torch", "torch_geometric", "prefect", "sqlalchemy")
"""Packages no parse-only command may import."""

_PROBE = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from esper_cli.main import main

    loaded = {}
    for argv in json.loads(sys.argv[1]):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                main(argv)
            except SystemExit:
                pass
        loaded[" ".join(argv)] = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[2:]))
    print(json.dumps(loaded))
    """
)


def _heavy_imports(argvs: list[list[str]]) -> dict[str, list[str]]:
    """``argv`` (joined) -> the HEAVY packages loaded once it was parsed, all in one fresh process.

    They run in turn in one interpreter: the first command that loads a package is the one named.
    """
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(argvs), *HEAVY],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout)


def _every_help() -> list[list[str]]:
    """``--help`` of ``esper`` and of every command and subcommand the parser knows."""

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> list[list[str]]:
        found = [[*prefix, "--help"]]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    found += walk(child, [*prefix, name])
        return found

    return walk(build_parser(), [])


@pytest.mark.parametrize(
    "argvs",
    [
        pytest.param([["--version"]], id="version"),
        pytest.param(_every_help(), id="every-help"),
        pytest.param(
            [
                ["nope"],  # an unknown command
                ["run", "--epochs", "0"],  # a bad value
                ["run", "--device", "tpu"],  # not a choice
                ["catalog", "compile", "--recipe", "nope"],
                ["bench", "growth", "--plan", "nope"],
            ],
            id="argument-errors",
        ),
    ],
)
def test_parsing_imports_no_heavy_package(argvs: list[list[str]]) -> None:
    loaded = _heavy_imports(argvs)
    offenders = {argv: packages for argv, packages in loaded.items() if packages}
    assert not offenders, (
        f"`esper {next(iter(offenders))}` imports {offenders[next(iter(offenders))]} before it answers: import the "
        "library inside the function that runs the command, and take option values from esper_cli/choices.py"
    )


def test_commands_that_read_runs_import_no_policy_graph_or_flow_library(esper_home: EsperSettings) -> None:
    """``runs list`` and ``export`` read run folders: torch-geometric (Tamiyo's graphs) and Prefect
    have no part in them, and ``runs list`` reads only files (``run.json``, ``LATEST``), so not
    torch either; the run it lists leaves its epoch count to its recipe, which ``run.json``
    records resolved. ``export`` goes through the whole run layer short of a session: the
    import of its module is what is checked, with a run id that is not there."""
    run = Run.start(RunSpec(recipe="seed-reference", device="cpu", run_id="listed"), settings=esper_home)
    try:
        grow_epoch(run, 0)
    finally:
        run.close()
    loaded = _heavy_imports([["runs", "list"], ["export", "no-such-run"]])
    assert loaded == {"runs list": [], "export no-such-run": ["sqlalchemy", "torch"]}
