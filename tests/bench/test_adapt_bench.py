"""The adaptation bench's command line: its task syntax and input checks (the study itself is
tested in ``tests/studies/test_adapt.py``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from bench.adapt import main, parse_task
from esper_core.studies.adapt import Task

RECIPE = "mnist1d-mlp-width"


def test_tasks_parse_and_bad_ones_name_the_form() -> None:
    assert parse_task("width=0.5") == Task(width=0.5)
    assert parse_task("train_fraction=0.5,width=2") == Task(width=2.0, train_fraction=0.5)
    for bad in ("depth=2", "width=", "width"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"width=F and/or train_fraction=F"):
            parse_task(bad)
    with pytest.raises(ValueError, match=r"train_fraction must lie in \(0, 1\]"):
        parse_task("train_fraction=1.5")


def test_the_command_refuses_a_home_without_a_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["adapt", "--recipe", RECIPE, "--home", str(tmp_path), "--policy-version", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):
        main()
    assert "holds no registry: pass the ESPER_HOME the policy was trained or stored in" in capsys.readouterr().err
