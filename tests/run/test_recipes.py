"""Recipes by name and by import path; bad ones fail before any work with what was expected."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from esper_core.data import DataSpec
from esper_core.hosts import HostConfig
from esper_core.karn.entries import default_catalog
from esper_core.kasmina.graft import GrowableModel
from esper_core.run.build import build_trainer
from esper_core.run.config import ModelSpec, RunConfig
from esper_core.run.recipes import RECIPES, get_recipe, is_import_path
from esper_core.settings import EsperSettings


def test_an_import_path_recipe_loads_with_overrides() -> None:
    config = get_recipe("tests.helpers.user_model:recipe", epochs=2, seed=7, device="cpu")
    assert config.recipe == "tests.helpers.user_model:recipe"
    assert (config.epochs, config.seed, config.data.seed, config.trainer.device) == (2, 7, 7, "cpu")
    assert isinstance(config.host, ModelSpec) and config.host.slots == ("stem", "body.1")


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        (
            "no-such-recipe",
            r"unknown recipe 'no-such-recipe'; choose one of \[.*'digits-mlp'.*\] or give your own as 'package.module:function'",
        ),
        ("tests.helpers.user_model:", r"is not an import path: expected 'package.module:function'"),
        ("tests/helpers/user_model.py:recipe", r"is not an import path"),
        (
            "tests.helpers.no_such_module:recipe",
            r"cannot import module 'tests.helpers.no_such_module' from .*ModuleNotFoundError",
        ),
        (
            "tests.helpers.user_model:nope",
            r"module 'tests.helpers.user_model' has no function 'nope'; its functions: \[.*'recipe'",
        ),
        ("tests.helpers.user_model:NOT_CALLABLE", r"'NOT_CALLABLE' is a int, not a function"),
        (
            "tests.helpers.user_model:not_a_config",
            r"returned dict; a recipe function must return esper_core.run.RunConfig",
        ),
    ],
)
def test_a_bad_recipe_says_what_was_expected(recipe: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_recipe(recipe)


def test_builtin_names_are_not_import_paths() -> None:
    assert not any(is_import_path(name) for name in RECIPES)
    assert is_import_path("examples.grow_your_own:recipe")


def test_a_builtin_host_with_user_data_is_refused() -> None:
    with pytest.raises(ValueError, match="give your own model as host=ModelSpec"):
        RunConfig(epochs=1, host=HostConfig(), data=DataSpec(load=lambda: None))  # type: ignore[arg-type,return-value]


def test_a_spec_with_a_string_for_slots_says_how_to_fix_it() -> None:
    with pytest.raises(ValueError, match=r"write \('stem',\)"):
        ModelSpec(build=lambda: None, slots="stem")  # type: ignore[arg-type,return-value]


def test_the_user_model_trains_on_its_dataset_through_the_loader() -> None:
    config = get_recipe("tests.helpers.user_model:recipe", device="cpu")
    trainer = build_trainer(config, catalog=default_catalog(), run_id="t")
    assert isinstance(trainer.model, GrowableModel)
    first = [y.tolist() for _, y in trainer.batches.epoch(0)]
    assert first == [y.tolist() for _, y in trainer.batches.epoch(0)]  # (seed, epoch) fixes the order
    assert first != [y.tolist() for _, y in trainer.batches.epoch(1)]
    result = trainer.train_epoch()
    assert result.packet.val_accuracy > 0.34  # better than chance after one epoch on easy blobs
    assert [layer.name for layer in result.packet.layers] == ["stem", "body.1", "head"]


def test_a_streamed_dataset_gives_the_same_batches_with_workers_and_after_a_restart() -> None:
    """A user's Dataset read by DataLoader workers: same batches as in-process, epoch by epoch,
    and a fresh trainer (a resumed run in a new process) sees the same ones again."""
    config = get_recipe("tests.helpers.user_model:recipe", device="cpu")
    inline = build_trainer(config, catalog=default_catalog(), run_id="a")
    workers = get_recipe("tests.helpers.user_model:recipe", device="cpu")
    workers.trainer = dataclasses.replace(
        workers.trainer, loader=dataclasses.replace(workers.trainer.loader, num_workers=2)
    )
    pooled = build_trainer(workers, catalog=default_catalog(), run_id="b")
    for epoch in (0, 3):
        a = [(x.clone(), y.clone()) for x, y in inline.batches.epoch(epoch)]
        b = list(pooled.batches.epoch(epoch))
        assert len(a) == len(b) == 8  # 256 samples in batches of 32
        assert all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b, strict=True))
    again = build_trainer(config, catalog=default_catalog(), run_id="c")
    assert all(
        torch.equal(ya, yb) for (_, ya), (_, yb) in zip(inline.batches.epoch(3), again.batches.epoch(3), strict=True)
    )


def test_a_model_spec_scales_its_widths_through_build_scaled() -> None:
    spec = get_recipe("mnist1d-cnn").host
    assert isinstance(spec, ModelSpec)
    assert spec.build().channels == 8 and spec.scaled(1.0).build().channels == 8
    assert spec.scaled(2.0).build().channels == 16 and spec.scaled(0.5).build().channels == 4
    assert spec.scaled(2.0).slots == spec.slots
    with pytest.raises(ValueError, match="width factor must be > 0"):
        spec.scaled(0.0)
    fixed = get_recipe("tests.helpers.user_model:recipe").host
    with pytest.raises(ValueError, match="give it build_scaled="):
        fixed.scaled(2.0)
    with pytest.raises(ValueError, match="build_scaled must be a function"):
        ModelSpec(build=torch.nn.Identity, slots=("x",), build_scaled=3)


def test_chars_gpt_growth_is_sized_for_growth_and_leaves_chars_gpt_as_it_was(esper_home: EsperSettings) -> None:
    final, start, chars = get_recipe("chars-gpt-growth"), get_recipe("chars-gpt-growth-start"), get_recipe("chars-gpt")
    assert isinstance(final.host, ModelSpec) and isinstance(start.host, ModelSpec)
    big, small = final.host.build(), start.host.build()
    params = sum(p.numel() for p in big.parameters())
    assert params == 220_672 and sum(p.numel() for p in small.parameters()) == 120_704
    # The start is the same network at half the depth, its stack named ``blocks`` for deepening.
    assert len(big.blocks) == 4 and len(small.blocks) == 2 and start.host.slots == ("blocks.0", "blocks.1")
    data = final.data.load()
    tokens = final.epochs * len(data.train) * data.train[0][0].shape[0]
    assert tokens == 3_145_728 and 10 <= tokens / params <= 20
    assert [final.trainer.lr_factor(e, final.epochs) for e in range(final.epochs)][5:] == pytest.approx([1, 0.55, 0.1])
    assert (start.epochs, start.trainer.lr, start.trainer.lr_schedule) == (final.epochs, final.trainer.lr, "cooldown")
    # chars-gpt and its baselines stay valid: its model, data and schedule are as they were.
    assert (chars.epochs, chars.trainer.lr, chars.trainer.lr_schedule, len(chars.data.load().train)) == (
        10,
        3e-3,
        "cosine",
        2048,
    )
    assert sum(p.numel() for p in chars.host.build().parameters()) == 120_704


def test_a_builtin_host_scales_every_hidden_width() -> None:
    assert HostConfig(hidden=(64, 32)).scaled(0.5).hidden == (32, 16)
    assert HostConfig(hidden=(1, 3)).scaled(0.1).hidden == (1, 1)
    with pytest.raises(ValueError, match="width factor must be > 0"):
        HostConfig().scaled(-1.0)


def test_a_schedule_must_name_the_runs_slots_blueprints_and_epochs() -> None:
    from esper_core.run import ScheduledGermination, TamiyoConfig

    def with_schedule(epoch: int, slot: str, blueprint: str) -> RunConfig:
        config = get_recipe("mnist1d-cnn", epochs=10)
        germination = ScheduledGermination(epoch=epoch, slot=slot, blueprint=blueprint)
        return dataclasses.replace(config, tamiyo=TamiyoConfig(policy="scheduled", schedule=(germination,)))

    assert with_schedule(3, "act2", "seq_conv_residual").tamiyo.schedule[0].slot == "act2"
    with pytest.raises(ValueError, match=r"no slot 'slot1'; slots are \('act2', 'act3'\)"):
        with_schedule(3, "slot1", "seq_conv_residual")
    with pytest.raises(ValueError, match="add it to RunConfig.blueprints"):
        with_schedule(3, "act2", "residual_mlp")
    with pytest.raises(ValueError, match="never happens: the run has epochs 0..9"):
        with_schedule(10, "act2", "seq_conv_residual")
    assert HostConfig(slot_inputs=(2, 1)).slot_ids == ("slot1", "slot2")


def test_the_heuristics_preferred_blueprints_must_be_among_a_listed_runs_blueprints() -> None:
    from esper_core.run import TamiyoConfig
    from esper_core.tamiyo.heuristic import HeuristicConfig

    def preferring(*blueprints: str) -> RunConfig:
        config = get_recipe("mnist1d-cnn", epochs=10)
        return dataclasses.replace(config, tamiyo=TamiyoConfig(heuristic=HeuristicConfig(prefer=blueprints)))

    assert preferring("width-100", "seq_conv_residual").tamiyo.heuristic.prefer == ("width-100", "seq_conv_residual")
    with pytest.raises(ValueError, match="prefer names 'residual_mlp'.*add it to RunConfig.blueprints or drop it"):
        preferring("residual_mlp")
