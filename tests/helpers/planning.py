"""Count how often a run resolves its recipe and plans its host (the "planned once" tests)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import esper_core.run.plan as plan_module
import esper_core.run.recipes as recipes_module


def count_planning(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """From here on, count recipe resolutions (``resolve``: ``load_recipe``, which calls the recipe's
    function) and meta-host plans (``meta_host``)."""
    calls: Counter[str] = Counter()

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(recipes_module, "load_recipe", counted("resolve", recipes_module.load_recipe))
    monkeypatch.setattr(plan_module, "meta_host", counted("meta_host", plan_module.meta_host))
    return calls
