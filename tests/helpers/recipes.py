"""Recipes for tests whose subject is not compilation: the step engine stays eager."""

from __future__ import annotations

import dataclasses

from esper_core.run.config import RunConfig
from esper_core.run.recipes import get_recipe


def eager_recipe(name: str, **overrides: object) -> RunConfig:
    """``get_recipe(name)`` with ``compile='off'``, so no test pays a compile it is not about."""
    config = get_recipe(name, **overrides)  # type: ignore[arg-type]
    config.trainer = dataclasses.replace(config.trainer, step=dataclasses.replace(config.trainer.step, compile="off"))
    return config
