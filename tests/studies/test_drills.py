"""The two fault drills on real runs: each must pass every check it makes."""

from __future__ import annotations

from pathlib import Path

from esper_core.studies.drills import run_rollback_drill, run_timeout_drill


def test_timeout_drill(tmp_path: Path) -> None:
    result = run_timeout_drill(tmp_path)
    assert result["passed"], result["checks"]


def test_rollback_drill(tmp_path: Path) -> None:
    result = run_rollback_drill(tmp_path)
    assert result["passed"], result["checks"]
