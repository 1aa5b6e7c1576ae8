"""Recipes: a run is a recipe plus a few overrides, never a pile of flags.

A recipe is a Python function that returns the complete ``RunConfig``. The built-in ones are
named (``esper recipes list``); a user's is found by import path, ``package.module:function``
(the module is imported from the working directory, e.g. ``examples.grow_your_own:recipe``).
``get_recipe("digits-mlp", epochs=3)`` returns the complete, validated configuration.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import re
import sys
from collections.abc import Callable
from typing import Annotated, Literal

import torch
from pydantic import StringConstraints
from torch.utils.data import TensorDataset

from esper_core.data import DataConfig, DataSpec, DataSplits
from esper_core.datasets.chars import VOCAB_SIZE, CharCorpusConfig, load_chars
from esper_core.datasets.mnist1d import PUBLISHED_SEED, MNIST1DConfig, load_mnist1d
from esper_core.hosts import HostConfig
from esper_core.models.chars_gpt import CharGPT, next_char_loss
from esper_core.models.mnist1d import MNIST1DCNN, MNIST1DMLP
from esper_core.run.config import ModelSpec, RunConfig
from esper_core.tamiyo.config import ScheduledGermination, TamiyoConfig
from esper_core.tamiyo.heuristic import HeuristicConfig
from esper_core.tolaria.config import TrainerConfig


def digits_mlp() -> RunConfig:
    """The default: a 64-64 MLP on the bundled 8x8 digits with two seed slots.

    40 epochs: the host has converged by then (test accuracy over 5 seeds, host alone: 95.4 % at
    10 epochs, 96.4 % at 20, 96.8 % at 40, 97.0-97.2 % at 60-80), and with the heuristic both slots
    go through a whole seed lifecycle; at 10 only the first seed does.
    """
    return RunConfig(
        recipe="digits-mlp",
        epochs=40,
        data=DataConfig(name="digits", batch_size=64),
        host=HostConfig(kind="mlp", hidden=(64, 64), slot_inputs=(1, 2)),
        trainer=TrainerConfig(lr=0.05, momentum=0.9),
        tamiyo=TamiyoConfig(heuristic=HeuristicConfig(probe_epoch=1, blend_epochs=2)),
        # Named: its baselines were measured with these two (all fitting would add bottleneck_mlp).
        blueprints=("residual_mlp", "lowrank_adapter"),
    )


def seed_reference() -> RunConfig:
    """The seeds' Phase 0 workload: Linear(16 -> 4), 16 samples, batch 4 (4 steps an epoch)."""
    return RunConfig(
        recipe="seed-reference",
        epochs=6,
        data=DataConfig(name="seed-reference", batch_size=4),
        host=HostConfig(kind="mlp", hidden=(), slot_inputs=(0,), batch_max=64),
        trainer=TrainerConfig(lr=0.05, momentum=0.9, val_batch_size=64),
        tamiyo=TamiyoConfig(heuristic=HeuristicConfig(probe_epoch=1, blend_epochs=1)),
        blueprints=("lowrank_adapter",),
    )


def digits_cnn() -> RunConfig:
    """A 16-32 channel CNN on the digits as 1x8x8 images; slots on the conv1 and classifier inputs."""
    return RunConfig(
        recipe="digits-cnn",
        epochs=10,
        data=DataConfig(name="digits", batch_size=32, image=True),
        host=HostConfig(kind="cnn", hidden=(16, 32), slot_inputs=(1, 2)),
        trainer=TrainerConfig(lr=0.05, momentum=0.9),
        tamiyo=TamiyoConfig(heuristic=HeuristicConfig(probe_epoch=1, blend_epochs=2)),
        # Vector blueprints fit the classifier's input slot, conv_residual the conv slot.
        blueprints=("residual_mlp", "lowrank_adapter", "conv_residual"),
    )


MNIST1D_TEST = 10_000
"""Test signals of the MNIST-1D recipes: the published 1,000 first, then more from the same
generator, so a difference of a few tenths of a point can be resolved (binomial SD at 80 %:
0.4 points)."""


def mnist1d_splits(*, seed: int = PUBLISHED_SEED) -> DataSplits:
    """MNIST-1D: the published 4,000 training signals, 1,000 for validation and 10,000 for test,
    generated locally (never downloaded) and cached under ``$ESPER_HOME/cache/datasets``.

    ``seed`` draws another data set of the same sizes from the same generator (every split
    changes): a benchmark that draws one per model seed covers the data's spread as well as the
    initialisation's. The recipes keep the published one."""
    data = load_mnist1d(MNIST1DConfig(num_test=MNIST1D_TEST, seed=seed))
    return DataSplits(
        train=TensorDataset(*data.train),
        val=TensorDataset(*data.val),
        test=TensorDataset(*data.test),
        num_classes=10,
    )


def _mnist1d(name: str, host: ModelSpec, blueprints: tuple[str, ...]) -> RunConfig:
    # Adam at 1e-2 with cosine decay, batch 100: the set-up of bench/mnist1d.py (after the paper's repository).
    return RunConfig(
        recipe=name,
        epochs=60,
        host=host,
        data=DataSpec(load=mnist1d_splits, batch_size=100, name="mnist1d"),
        trainer=TrainerConfig(optimizer="adam", lr=1e-2, lr_schedule="cosine", val_batch_size=512),
        # The lowest-risk widening (25 %), not the default doubling: over these 60 epochs the
        # doubling rule chosen on the zoo's 4-8 epoch runs kept doubling on every plateau (the CNN
        # to 4,175 parameters, 3.3x the 25 % step's training FLOPs), and the static x2 network
        # was as accurate on 63 % of its FLOPs (baselines/growth/width-rules-doubling,
        # docs/transfer.md).
        tamiyo=TamiyoConfig(heuristic=HeuristicConfig(probe_epoch=5, blend_epochs=3, prefer=())),
        blueprints=blueprints,
    )


def _mnist1d_cnn_at(factor: float, *, channels: int) -> MNIST1DCNN:
    return MNIST1DCNN(channels=max(1, round(channels * factor)))


def _mnist1d_mlp_at(factor: float, *, width: int) -> MNIST1DMLP:
    return MNIST1DMLP(width=max(1, round(width * factor)))


def mnist1d_cnn() -> RunConfig:
    """A narrow 1-D CNN on MNIST-1D (8 channels: ~78 % alone, the paper's 25: ~91 %), seeds on
    the (C, L) outputs of its second and third convolutions: room to grow."""
    host = ModelSpec(
        build=functools.partial(MNIST1DCNN, channels=8),
        build_scaled=functools.partial(_mnist1d_cnn_at, channels=8),
        slots=("act2", "act3"),
    )
    return _mnist1d("mnist1d-cnn", host, ("seq_conv_residual", "seq_pointwise_adapter", "seq_depthwise_separable"))


def mnist1d_mlp() -> RunConfig:
    """A narrow MLP on MNIST-1D (width 32: ~55 % alone, width 100: ~65 %), seeds on the
    outputs of both hidden layers."""
    host = ModelSpec(
        build=functools.partial(MNIST1DMLP, width=32),
        build_scaled=functools.partial(_mnist1d_mlp_at, width=32),
        slots=("act1", "act2"),
    )
    return _mnist1d("mnist1d-mlp", host, ("residual_mlp", "lowrank_adapter"))


def mnist1d_cnn_width() -> RunConfig:
    """``mnist1d-cnn`` grown in width only: each of its three convolutions may gain channels
    (width slots ``conv1+width`` .. ``conv3+width``), and no branch slot is offered."""
    host = ModelSpec(
        build=functools.partial(MNIST1DCNN, channels=8),
        build_scaled=functools.partial(_mnist1d_cnn_at, channels=8),
        widen=("conv1", "conv2", "conv3"),
    )
    return _mnist1d("mnist1d-cnn-width", host, ())


def mnist1d_cnn_grown() -> RunConfig:
    """``mnist1d-cnn-width`` grown by the schedule Simic's learned width policy chose: double
    ``conv1`` after epoch 1, double ``conv3`` after epoch 3 (v4 of the policy in
    ``baselines/growth/width-learned-cnn``, on every one of its 20 seeds give or take an epoch;
    it also asked for ``conv2`` in between, which G0 refuses next to a width seed in flight).
    Each seed is fossilised, so merged, when its probation ends. The main job (``make run``): the
    run's summary sets the grown network beside the static frontier of the same parameter count.
    """
    config = mnist1d_cnn_width()
    config.recipe = "mnist1d-cnn-grown"
    config.tamiyo = dataclasses.replace(
        config.tamiyo,
        policy="scheduled",
        schedule=(
            ScheduledGermination(epoch=1, slot="conv1+width", blueprint="width-100"),
            ScheduledGermination(epoch=3, slot="conv3+width", blueprint="width-100"),
        ),
    )
    return config


def mnist1d_mlp_width() -> RunConfig:
    """``mnist1d-mlp`` grown in width only: both hidden layers may gain units."""
    host = ModelSpec(
        build=functools.partial(MNIST1DMLP, width=32),
        build_scaled=functools.partial(_mnist1d_mlp_at, width=32),
        widen=("fc1", "fc2"),
    )
    return _mnist1d("mnist1d-mlp-width", host, ())


CHARS_CONTEXT = 64
"""Characters of context of ``chars-gpt`` (short enough for a CPU)."""
CHARS_TRAIN_WINDOWS = 2048
"""Training windows of ``chars-gpt``: 64 batches of 32 an epoch, a bounded amount of CPU work."""


def chars_splits() -> DataSplits:
    """The standard library's own sources as 64-character windows, split by file, built locally
    and cached under ``$ESPER_HOME/cache/datasets`` (``esper_core.datasets.chars``)."""
    data = load_chars(CharCorpusConfig(context=CHARS_CONTEXT, train_windows=CHARS_TRAIN_WINDOWS))
    return DataSplits(train=TensorDataset(*data.train), val=TensorDataset(*data.val), test=TensorDataset(*data.test))


def chars_gpt_model(factor: float, *, width: int = 64, depth: int = 2, heads: int = 4) -> CharGPT:
    """``chars-gpt``'s model with its width scaled by ``factor`` (a multiple of its heads)."""
    scaled = max(heads, round(width * factor / heads) * heads)  # a multiple of the heads
    return CharGPT(vocab=VOCAB_SIZE, context=CHARS_CONTEXT, width=scaled, depth=depth, heads=heads)


def chars_gpt() -> RunConfig:
    """A 2-block, 64-wide causal transformer LM on the stdlib's own source, character by character;
    seeds on both blocks' (L, D) outputs. Reports loss in nats per character (bits: / ln 2)."""
    host = ModelSpec(
        build=functools.partial(chars_gpt_model, 1.0, width=64, depth=2),
        build_scaled=functools.partial(chars_gpt_model, width=64, depth=2),
        slots=("blocks.0", "blocks.1"),
        input_dtype=torch.long,
        # A language model: no seed may read a later character.
        causal=True,
        batch_max=256,
    )
    return RunConfig(
        recipe="chars-gpt",
        epochs=10,
        host=host,
        data=DataSpec(load=chars_splits, batch_size=32, name="python-chars"),
        loss=next_char_loss,
        trainer=TrainerConfig(optimizer="adam", lr=3e-3, lr_schedule="cosine", val_batch_size=256),
        tamiyo=TamiyoConfig(heuristic=HeuristicConfig(probe_epoch=2, blend_epochs=2)),
    )


CHARS_GROWTH_WINDOWS = 6144
"""Training windows of ``chars-gpt-growth``: 393,216 characters (13 % of the training text) an
epoch, 192 batches of 32."""
CHARS_GROWTH_EPOCHS = 8
"""8 epochs of ``CHARS_GROWTH_WINDOWS``: 3.15 M training characters, 14.3 per parameter of the
4-block network (220,672), inside the 10-20 tokens per parameter where growing pays most
(Mallik et al. 2026), and a few minutes of 2 CPU cores."""
CHARS_GROWTH_DEPTH = 4
"""Blocks of ``chars-gpt-growth``'s final network; its ``-start`` variant has half."""
CHARS_GROWTH_LR = 3e-3
"""Adam's rate of ``chars-gpt-growth``, chosen for the static 4-block network on validation
with selection seeds (``bench/chars_lr.py``, ``baselines/growth/chars-gpt-growth/lr.json``)."""


def chars_growth_splits() -> DataSplits:
    """``chars_splits`` with ``CHARS_GROWTH_WINDOWS`` training windows (the same text and held-out files)."""
    data = load_chars(CharCorpusConfig(context=CHARS_CONTEXT, train_windows=CHARS_GROWTH_WINDOWS))
    return DataSplits(train=TensorDataset(*data.train), val=TensorDataset(*data.val), test=TensorDataset(*data.test))


def _chars_growth(recipe: str, depth: int, *, width: int = 64, heads: int = 4) -> RunConfig:
    host = ModelSpec(
        build=functools.partial(chars_gpt_model, 1.0, width=width, depth=depth, heads=heads),
        build_scaled=functools.partial(chars_gpt_model, width=width, depth=depth, heads=heads),
        slots=tuple(f"blocks.{i}" for i in range(depth)),
        input_dtype=torch.long,
        causal=True,
        batch_max=256,
    )
    return RunConfig(
        recipe=recipe,
        epochs=CHARS_GROWTH_EPOCHS,
        host=host,
        data=DataSpec(load=chars_growth_splits, batch_size=32, name="python-chars-growth"),
        loss=next_char_loss,
        # A constant rate with a cooldown: one schedule family for every arm of a growth
        # benchmark, whatever its length or growth point (the cooldown is the last 2 epochs).
        trainer=TrainerConfig(
            optimizer="adam",
            lr=CHARS_GROWTH_LR,
            lr_schedule="cooldown",
            lr_cooldown_epochs=2,
            lr_final_factor=0.1,
            val_batch_size=256,
        ),
        tamiyo=TamiyoConfig(heuristic=HeuristicConfig(probe_epoch=2, blend_epochs=2)),
    )


def chars_gpt_growth() -> RunConfig:
    """A workload where growth can show: ``chars-gpt``'s model at 4 blocks of width 64 (220,672
    parameters) trained on 14.3 characters per parameter, constant rate with a cooldown; seeds on
    every block's (L, D) output. Loss in bits per character."""
    return _chars_growth("chars-gpt-growth", CHARS_GROWTH_DEPTH)


def chars_gpt_growth_start() -> RunConfig:
    """``chars-gpt-growth`` at half its depth (2 blocks of ``blocks``, 120,704 parameters), the
    start of a network grown by stacking to the final 4 (``ModelSpec(deepen=("blocks",))``)."""
    return _chars_growth("chars-gpt-growth-start", CHARS_GROWTH_DEPTH // 2)


def chars_gpt_growth_narrow() -> RunConfig:
    """``chars-gpt-growth`` at half its width (32, 2 heads of the same 16 units, 4 blocks: 61,248
    parameters), the start of a network grown to the final one by doubling its width in place
    (``ModelSpec(widen_stream=True)``)."""
    return _chars_growth("chars-gpt-growth-narrow", CHARS_GROWTH_DEPTH, width=32, heads=2)


RECIPES: dict[str, Callable[[], RunConfig]] = {
    "chars-gpt": chars_gpt,
    "chars-gpt-growth": chars_gpt_growth,
    "chars-gpt-growth-narrow": chars_gpt_growth_narrow,
    "chars-gpt-growth-start": chars_gpt_growth_start,
    "digits-mlp": digits_mlp,
    "digits-cnn": digits_cnn,
    "mnist1d-cnn": mnist1d_cnn,
    "mnist1d-mlp": mnist1d_mlp,
    "mnist1d-cnn-width": mnist1d_cnn_width,
    "mnist1d-cnn-grown": mnist1d_cnn_grown,
    "mnist1d-mlp-width": mnist1d_mlp_width,
    "seed-reference": seed_reference,
}


RecipeName = Literal[
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
]
"""The built-in recipe names, for flow parameters the UI offers as a choice; a test keeps it equal
to ``sorted(RECIPES)``, so adding a recipe means adding its name here too."""

RECIPE_IMPORT_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$"
"""A recipe given by import path, ``package.module:function``."""

RecipeRef = RecipeName | Annotated[str, StringConstraints(pattern=RECIPE_IMPORT_PATTERN)]
"""What a flow's ``recipe`` parameter accepts: a built-in name or an import path. Prefect turns it
into the parameter schema, so a deployment refuses anything else before a worker starts."""

IMPORT_PATH = re.compile(RECIPE_IMPORT_PATTERN)
"""``package.module:function``: how a user's recipe is named."""


def is_import_path(recipe: str) -> bool:
    """Whether ``recipe`` names a function by import path rather than a built-in recipe."""
    return IMPORT_PATH.match(recipe) is not None


def recipe_factory(recipe: str) -> Callable[[], RunConfig]:
    """The function behind ``recipe``: a built-in name or ``package.module:function``.

    The module of an import path is imported with the working directory on ``sys.path`` (the
    deployment's directory for a Prefect worker, the shell's for ``esper run``).

    Raises:
        ValueError: an unknown name, a malformed path, a module that cannot be imported, or a
            missing or non-callable function; the message says what was expected.
    """
    factory = RECIPES.get(recipe)
    if factory is not None:
        return factory
    if ":" not in recipe:
        raise ValueError(
            f"unknown recipe {recipe!r}; choose one of {sorted(RECIPES)} or give your own as "
            "'package.module:function' (a function returning esper_core.run.RunConfig)"
        )
    if not is_import_path(recipe):
        raise ValueError(
            f"recipe {recipe!r} is not an import path: expected 'package.module:function', "
            "e.g. 'examples.grow_your_own:recipe'"
        )
    module_name, function_name = recipe.split(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        # Console scripts (esper) do not put the working directory on the path as `python -m` does.
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"recipe {recipe!r}: cannot import module {module_name!r} from {cwd} ({type(e).__name__}: {e}); "
            "run from the directory that contains the package, or install it"
        ) from e
    factory = getattr(module, function_name, None)
    if factory is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(
            f"recipe {recipe!r}: module {module_name!r} has no function {function_name!r}; its functions: {public}"
        )
    if not callable(factory):
        raise ValueError(f"recipe {recipe!r}: {function_name!r} is a {type(factory).__name__}, not a function")
    return factory


def load_recipe(recipe: str) -> RunConfig:
    """Call the recipe's function and check that it returned a ``RunConfig``.

    Raises:
        ValueError: as ``recipe_factory``, or when the function returns something else.
    """
    config = recipe_factory(recipe)()
    if not isinstance(config, RunConfig):
        raise ValueError(
            f"recipe {recipe!r} returned {type(config).__name__}; a recipe function must return "
            "esper_core.run.RunConfig(epochs=..., host=ModelSpec(...), data=DataSpec(...), ...)"
        )
    return config


def get_recipe(
    name: str,
    *,
    epochs: int | None = None,
    device: str | None = None,
    seed: int | None = None,
) -> RunConfig:
    """The recipe ``name`` (built-in or import path) with the few overrides a flow or the CLI may set.

    Raises:
        ValueError: for an unknown recipe (the message lists the known ones), a recipe that
            cannot be loaded, or a bad override.
    """
    return with_overrides(load_recipe(name), recipe=name, epochs=epochs, device=device, seed=seed)


def with_overrides(
    config: RunConfig,
    *,
    recipe: str | None = None,
    epochs: int | None = None,
    device: str | None = None,
    seed: int | None = None,
) -> RunConfig:
    """A copy of ``config`` with ``get_recipe``'s overrides (None keeps the configuration's own).

    For a configuration made in code rather than found by name (a zoo member's,
    ``esper_core.zoo``); ``config`` itself is left as it was. ``seed`` seeds the run and its data's
    shuffle alike.

    Raises:
        ValueError: a bad override (``RunConfig``'s checks).
    """
    trainer = config.trainer if device is None else dataclasses.replace(config.trainer, device=device)
    data = config.data if seed is None else dataclasses.replace(config.data, seed=seed)
    return dataclasses.replace(
        config,
        recipe=config.recipe if recipe is None else recipe,
        epochs=config.epochs if epochs is None else epochs,
        seed=config.seed if seed is None else seed,
        trainer=trainer,
        data=data,
    )
