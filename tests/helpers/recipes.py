"""Recipes for tests whose subject is not compilation: the step engine stays eager."""

from __future__ import annotations

import dataclasses

from esper_core.run.config import RunConfig
from esper_core.run.recipes import get_recipe


def eager_recipe(name: str, **overrides: object) -> RunConfig:
    """``get_recipe(name)`` with ``compile='off'``, so no test pays a compile it is not about, on
    the CPU unless ``device=`` says otherwise: the test registry holds CPU kernels, and a test of
    a CUDA path asks for the device (``tests.helpers.runif``)."""
    overrides.setdefault("device", "cpu")
    config = get_recipe(name, **overrides)  # type: ignore[arg-type]
    config.trainer = dataclasses.replace(config.trainer, step=dataclasses.replace(config.trainer.step, compile="off"))
    return config


def seed_reference_approving() -> RunConfig:
    """``seed-reference`` that lists and approves the experimental ``norm_gate`` beside its safe
    ``lowrank_adapter`` (found by import path: ``tests.helpers.recipes:seed_reference_approving``)."""
    config = get_recipe("seed-reference")
    config.blueprints = ("lowrank_adapter", "norm_gate")
    config.approved_blueprints = ("norm_gate",)
    return config
