"""A model the tests define themselves (tests/helpers/user_model.py) grown end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from esper_core.settings import EsperSettings

REPO = Path(__file__).resolve().parents[2]
RECIPE = "tests.helpers.user_model:recipe"
EXAMPLE = "examples.grow_your_own:recipe"

pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("prefect_harness")
def test_a_user_model_grows_in_a_real_flow_run(esper_home: EsperSettings) -> None:
    from flows.morphogenesis import morphogenesis

    # Pinned to the rule: the model offers branch slots only, and the shipped policy (zoo-1) was
    # trained on width slots (docs/zoo.md); what is tested here is the recipe, not who decides.
    summary = morphogenesis(recipe=RECIPE, epochs=4, device="cpu", seed=0, run_id="user", policy="heuristic")
    run_dir = esper_home.runs_dir / "user"
    assert summary.recipe == RECIPE and summary.epochs == 4
    assert summary.commands.get("germinate", 0) >= 1, summary.commands
    assert set(summary.seeds) == {"stem", "body.1"}
    assert any(not stage.startswith("dormant") for stage in summary.seeds.values()), summary.seeds
    for name in ("summary.json", "telemetry.jsonl", "baseline.json", "report.md", "curves.png"):
        assert (run_dir / name).exists(), name
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["checkpoints"]["files"] <= 4  # keep_last 3 plus the best
    assert saved["checkpoints"]["bytes"] > 0


def test_the_example_runs_through_esper_run_by_import_path(tmp_path: Path) -> None:
    """The README's command, as a user types it: examples/grow_your_own.py through `esper run`."""
    done = _esper_run(tmp_path, "--recipe", EXAMPLE, "--epochs", "3", "--device", "cpu", "--run-id", "cli")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"({EXAMPLE}, 3 epochs, cpu)" in done.stdout
    assert (tmp_path / "home" / "runs" / "cli" / "summary.json").exists()
    bad = _esper_run(tmp_path, "--recipe", "tests.helpers.user_model:nope")
    assert bad.returncode == 2 and "has no function 'nope'" in bad.stderr and "Traceback" not in bad.stderr


def test_the_transformer_example_runs_through_esper_run(tmp_path: Path) -> None:
    """examples/grow_a_transformer.py as the README runs it: one epoch through `esper run`."""
    recipe = "examples.grow_a_transformer:recipe"
    done = _esper_run(tmp_path, "--recipe", recipe, "--epochs", "1", "--device", "cpu", "--run-id", "tf")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"({recipe}, 1 epochs, cpu)" in done.stdout
    summary = json.loads((tmp_path / "home" / "runs" / "tf" / "summary.json").read_text())
    assert set(summary["seeds"]) == {"encoder.layers.0", "encoder.layers.1"}


def _esper_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``esper run ARGS`` from the repository root in its own ESPER_HOME and temporary Prefect.

    The console script, as a user runs it: unlike ``python -m``, it does not put the working
    directory on sys.path, so recipes given by import path are found from it all the same.
    """
    env = {**os.environ, "ESPER_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    esper = str(Path(sys.executable).with_name("esper"))
    return subprocess.run([esper, "run", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
