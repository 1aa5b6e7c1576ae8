"""The width control study: a grown network against the static network of its own *shape*.

The growth benchmark's yardstick is the static frontier: the host with every hidden width scaled
by one factor. A width policy may end at a shape off that line (one layer doubled, the others
kept), and part of what it gains over the frontier may then be the shape, not the growing. This
study trains, from scratch with the recipe's standard initialisation and no growth, the recipe's
host at the given per-layer widths, on the same seeds and test set as a growth benchmark, and
reports the paired difference of one of that benchmark's arms against it. The command is
``python -m bench.width_control``.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics

import torch
from torch import nn

from esper_core.kasmina.width import resize_width, trace_width_site
from esper_core.run.config import ModelSpec
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import episode_config, run_episode
from esper_core.studies.growth import SPLIT_SEED, in_home
from esper_core.telemetry.paired import paired_difference

SIGNAL = (40,)
"""One MNIST-1D signal: the recipes this bench is for."""


def at_widths(
    build: object, widths: dict[str, int], sample_shape: tuple[int, ...], *, input_dtype: torch.dtype = torch.float32
) -> nn.Module:
    """``build()``'s model with each named layer at its width (and its reader's inputs to
    match), every layer then re-initialised by PyTorch's defaults: a static network of that shape.
    ``input_dtype`` is the input's (``torch.long`` for token ids)."""
    assert callable(build)
    model = build()
    for layer, width in widths.items():
        resize_width(model, trace_width_site(model, layer, sample_shape, input_dtype), width)
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Conv1d | nn.Conv2d):
            module.reset_parameters()
    return model


def run(recipe: str, widths: dict[str, int], growth: dict, arm: str) -> dict[str, object]:
    """Train the static shape on the growth result's seeds; pair it with ``arm``'s runs there."""
    grown = growth["results"][recipe]["arms"][arm]["runs"]
    accuracy, params, halted = [], [], 0
    with in_home(None, prefix="esper-width-control-") as home:
        settings = EsperSettings(home=home)
        for entry in grown:
            config = episode_config(recipe, seed=entry["seed"], policy="none", split_seed=SPLIT_SEED, device="cpu")
            host = config.host
            assert isinstance(host, ModelSpec)
            config.host = dataclasses.replace(host, build=functools.partial(at_widths, host.build, widths, SIGNAL))
            result = run_episode(config, settings=settings, run_id=f"control-{recipe}-s{entry['seed']}")
            accuracy.append(100.0 * result.test_accuracy)
            params.append(result.total_params)
            halted += result.halted is not None  # kept in its pair, scored at its last commit
    diff = paired_difference([r["test_acc"] for r in grown], accuracy, higher_is_better=True)
    return {
        "bench": "width_control",
        "recipe": recipe,
        "widths": widths,
        "arm": arm,
        "seeds": [r["seed"] for r in grown],
        "static_shape": {
            "test_accuracy_mean": statistics.fmean(accuracy),
            "params": params[0],
            "runs": accuracy,
            "halted": halted,
        },
        "arm_test_accuracy_mean": statistics.fmean(r["test_acc"] for r in grown),
        "arm_params_mean": statistics.fmean(r["params"] for r in grown),
        "arm_minus_static_shape": diff.as_dict(),
    }
