"""The values ``esper``'s options offer, written out so that parsing imports no library code.

Their sources in ``esper_core`` import torch and much of the library: reading them from there
made every command, ``--help`` and an argument error included, pay about 5 s of imports before
parsing. ``tests/cli/test_choices.py`` keeps each tuple equal to
its source, so adding a recipe, a plan or a device means adding its name here too.
"""

from __future__ import annotations

DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
"""``esper_core._capabilities.DEVICE_CHOICES``."""

PRECISIONS: tuple[str, ...] = ("auto", "off", "bf16", "fp16")
"""``esper_core.tolaria.precision.AMP_CHOICES``."""

HOST_KINDS: tuple[str, ...] = ("mlp", "seq", "cnn", "tok")
"""``esper_core.karn.profiles.HOST_KINDS``."""

BACKENDS: tuple[str, ...] = ("export", "aot_inductor")
"""``esper_core.tezzeret.config.BackendName``."""

BLUEPRINT_TIERS: tuple[str, ...] = ("safe", "experimental", "high_risk")
"""The values of ``esper_core.contracts.BlueprintTier``."""

RECIPES: tuple[str, ...] = (
    "chars-gpt",
    "chars-gpt-growth",
    "chars-gpt-growth-narrow",
    "chars-gpt-growth-start",
    "digits-cnn",
    "digits-mlp",
    "mnist1d-cnn",
    "mnist1d-cnn-grown",
    "mnist1d-cnn-width",
    "mnist1d-mlp",
    "mnist1d-mlp-width",
    "seed-reference",
)
"""The built-in recipe names, sorted: ``sorted(esper_core.run.recipes.RECIPES)``."""

GROWTH_PLANS: tuple[str, ...] = ("default", "full", "smoke")
"""``sorted(esper_core.studies.growth.PLANS)``."""

DEPTH_GROWTH_PLANS: tuple[str, ...] = (
    "budgets",
    "crossover",
    "crossover-budgets",
    "crossover-stacked",
    "default",
    "smoke",
    "widen",
    "widen-budget",
    "widen-crossover",
    "widen-late",
    "widen-points",
    "widen-smooth",
)
"""``sorted(esper_core.studies.depth_growth.PLANS)``."""

SIMIC_PLANS: tuple[str, ...] = (
    "counterfactual",
    "counterfactual-varied",
    "default",
    "search",
    "search-smoke",
    "smoke",
    "varied",
)
"""``sorted(esper_core.studies.simic_train.PLANS)``."""

PINNABLE_POLICIES: tuple[str, ...] = ("shipped", "heuristic", "gnn", "none", "zoo-1")
"""``esper_core.tamiyo.config.pinnable_policies()``: what ``esper run --policy`` takes."""

SHIPPED_POLICIES: tuple[str, ...] = ("zoo-1",)
"""``tuple(sorted(esper_core.tamiyo.shipped.SHIPPED))``: the shipped policies' names."""

ZOO_FAMILIES: tuple[str, ...] = ("mlp", "cnn1d", "cnn2d", "resnet", "encoder", "decoder", "gru")
"""``esper_core.zoo.FAMILIES``, in its order."""
