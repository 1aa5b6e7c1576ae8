"""The MNIST-1D recipes: narrow hosts grown through the user-model API, on generated data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from esper_core.karn.entries import default_catalog
from esper_core.run.build import build_trainer
from esper_core.run.plan import plan_run
from esper_core.run.recipes import MNIST1D_TEST, RECIPES, get_recipe
from esper_core.settings import EsperSettings
from tests.helpers.recipes import eager_recipe

REPO = Path(__file__).resolve().parents[2]


def test_the_recipes_are_built_in_with_a_large_test_set() -> None:
    assert {"mnist1d-cnn", "mnist1d-mlp"} <= set(RECIPES)
    assert MNIST1D_TEST >= 10_000


@pytest.mark.slow
def test_the_cnn_recipe_plans_seq_slots_and_learns_in_an_epoch(esper_home: EsperSettings) -> None:
    config = get_recipe("mnist1d-cnn", device="cpu")
    plan = plan_run(config, catalog=default_catalog())
    assert plan.feature_shape == (40,)
    assert plan.slots == {"act2": "f8x10-b512", "act3": "f8x5-b512"}  # (C, L) maps of the conv stack
    assert {j.blueprint_id for j in plan.jobs} == set(config.blueprints)
    trainer = build_trainer(eager_recipe("mnist1d-cnn", device="cpu"), catalog=default_catalog(), run_id="m")
    assert (len(trainer.data.train), len(trainer.data.val), len(trainer.data.test)) == (4000, 1000, MNIST1D_TEST)
    packet = trainer.train_epoch().packet
    assert packet.val_accuracy > 0.2  # chance is 0.1
    assert [layer.name for layer in packet.layers] == ["conv1", "conv2", "conv3", "fc"]


@pytest.mark.slow
def test_esper_run_mnist1d_cnn_from_a_fresh_home(tmp_path: Path) -> None:
    """`esper run --recipe mnist1d-cnn --epochs 3`: generates the data, compiles, grows."""
    env = {**os.environ, "ESPER_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    esper = str(Path(sys.executable).with_name("esper"))
    done = subprocess.run(
        [esper, "run", "--recipe", "mnist1d-cnn", "--epochs", "3", "--device", "cpu", "--run-id", "m"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(mnist1d-cnn, 3 epochs, cpu)" in done.stdout
    assert list((tmp_path / "home" / "cache" / "datasets").glob("mnist1d-*.npz"))
