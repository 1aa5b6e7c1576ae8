"""prefect.yaml stays declarative and every entrypoint imports to a Prefect flow."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml
from prefect import Flow

ROOT = Path(__file__).resolve().parents[2]


def _deployments() -> list[dict]:
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]


def test_every_entrypoint_is_a_flow() -> None:
    deployments = _deployments()
    assert {d["entrypoint"].split(":")[1] for d in deployments} >= {"morphogenesis", "compile_catalog"}
    for d in deployments:
        path, name = d["entrypoint"].split(":")
        spec = importlib.util.spec_from_file_location(f"entry_{name}", ROOT / path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert isinstance(getattr(module, name), Flow), d["entrypoint"]


def test_deployments_use_the_shared_pool_and_schema_enforcement() -> None:
    for d in _deployments():
        assert d["work_pool"]["name"] == "esper"
        assert d["enforce_parameter_schema"] is True
