"""Shared fixtures: an isolated ESPER_HOME per test, a registry compiled once per session, and
one Prefect test harness for the whole session."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from esper_core.data import load_dataset
from esper_core.karn.entries import default_catalog
from esper_core.pipeline import compile_job, publish_kernel
from esper_core.run.plan import plan_compile_jobs
from esper_core.run.recipes import get_recipe
from esper_core.settings import EsperSettings
from esper_core.urza.service import Urza

# Recipes whose kernels the session-wide template registry holds.
TEMPLATE_RECIPES = ("seed-reference", "digits-mlp", "digits-cnn")


@pytest.fixture(scope="session")
def compiled_home_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ESPER_HOME whose registry holds every kernel of TEMPLATE_RECIPES (compiled once)."""
    home = tmp_path_factory.mktemp("esper-template")
    urza = Urza.open(home)
    catalog = default_catalog()
    try:
        for name in TEMPLATE_RECIPES:
            config = get_recipe(name)
            data = load_dataset(config.data)
            for job in plan_compile_jobs(config, feature_shape=data.feature_shape, catalog=catalog):
                publish_kernel(urza, catalog, compile_job(catalog, job, "cpu"))
    finally:
        urza.close()
    return home


@pytest.fixture
def esper_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EsperSettings:
    """An empty ESPER_HOME for this test, exported in the environment."""
    home = tmp_path / "esper"
    monkeypatch.setenv("ESPER_HOME", str(home))
    monkeypatch.delenv("ESPER_REGISTRY_URL", raising=False)
    monkeypatch.delenv("ESPER_PROMETHEUS_PORT", raising=False)
    monkeypatch.delenv("ESPER_PUSHGATEWAY_URL", raising=False)
    monkeypatch.delenv("ESPER_DASK_ADDRESS", raising=False)
    monkeypatch.delenv("ESPER_GROW_TASK_SECONDS", raising=False)
    monkeypatch.delenv("ESPER_SIGNING_KEY", raising=False)
    monkeypatch.delenv("ESPER_SIGNING_KEY_FALLBACKS", raising=False)
    monkeypatch.delenv("ESPER_REGISTRY_OUTAGE_LIMIT_S", raising=False)
    return EsperSettings()


@pytest.fixture
def compiled_home(esper_home: EsperSettings, compiled_home_template: Path) -> EsperSettings:
    """This test's ESPER_HOME, pre-filled with a copy of the compiled template registry."""
    shutil.copytree(compiled_home_template, esper_home.home, dirs_exist_ok=True)
    return esper_home


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One ephemeral Prefect server for every flow test of the session.

    Not autouse: it costs several seconds to start, and most tests never touch Prefect.
    """
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
