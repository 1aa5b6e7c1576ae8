"""Each family's smallest member as an Esper recipe: it builds, trains a step, and Esper's own
checks (planning, preflight) accept the width and branch slots it declares."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from esper_core.data import DataSpec
from esper_core.karn.entries import default_catalog
from esper_core.run.build import build_host, load_run_data
from esper_core.run.config import ModelSpec, RunConfig
from esper_core.run.plan import plan_run
from esper_core.run.preflight import check_one_batch
from esper_core.studies.episodes import episode_config
from esper_core.zoo import FAMILIES, FAMILY_FACTS, Family, ZooMember, ZooTask, build_model

# One small task per kind of input, all from seed 0, so MNIST-1D is generated once for the module.
SMALL_TASKS = {
    "mnist1d": ZooTask(name="mnist1d", seed=0, train=200),
    "digits": ZooTask(name="digits", seed=0),
    "chars": ZooTask(name="chars", seed=0, train=200),
}


def smallest(family: Family, *, epochs: int = 2) -> ZooMember:
    """The family's smallest member (depth 1, width 4) on its first task, offering both seed kinds."""
    return ZooMember(
        zoo_seed=0,
        index=0,
        family=family,
        task=SMALL_TASKS[FAMILY_FACTS[family].tasks[0]],
        depth=1,
        width=4,
        epochs=epochs,
        batch_size=32,
        lr=1e-2,
        kinds=("width", "branch"),
    )


@pytest.fixture(scope="module", autouse=True)
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One ESPER_HOME for the module: the data sets are cached once for every test here."""
    home = tmp_path_factory.mktemp("zoo-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ESPER_HOME", str(home))
        yield home


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_trains_a_step_and_its_declared_slots_are_its_own_layers(family: Family) -> None:
    member = smallest(family)
    model = build_model(member)
    names = dict(model.named_modules())
    assert member.widen and member.slots
    assert all(name in names for name in (*member.widen, *member.slots))
    data = member.recipe().data
    assert isinstance(data, DataSpec)
    x, y = data.load().train[:8]
    out = model(x)
    loss = member.recipe().loss(out, y)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())
    # build_scaled: the same architecture, wider.
    assert sum(p.numel() for p in build_model(member, 2.0).parameters()) > sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", FAMILIES)
def test_esper_plans_and_preflights_each_family_with_every_slot_it_declares(family: Family) -> None:
    member = smallest(family)
    config = member.recipe()
    assert isinstance(config, RunConfig) and isinstance(config.host, ModelSpec)
    data = load_run_data(config)
    # Planning builds the host on the meta device, traces every width slot to its consumer and
    # refuses a branch slot that no approved blueprint fits: each raises with its reason.
    plan = plan_run(config, catalog=default_catalog(), data=data)
    assert set(plan.built_slots) == {f"{layer}+width" for layer in member.widen}
    assert set(plan.slots) == set(member.slots)
    assert all(plan.slot_fits[slot] for slot in (*plan.slots, *plan.built_slots))
    check_one_batch(config, data)


def test_a_member_offers_only_the_seed_kinds_its_zoo_asks_for() -> None:
    member = smallest("mlp")
    width_only = ZooMember(**{**_fields(member), "kinds": ("width",)})
    assert width_only.recipe().host.slot_ids == ("fc1+width",)  # type: ignore[union-attr]
    branch_only = ZooMember(**{**_fields(member), "kinds": ("branch",)})
    assert branch_only.recipe().host.slot_ids == ("act1",)  # type: ignore[union-attr]


def test_an_episode_configuration_of_a_member_is_a_copy_with_the_seed_and_policy_set() -> None:
    recipe = smallest("cnn2d").recipe()
    config = episode_config(recipe, seed=3, policy="heuristic", epochs=5)
    assert (config.seed, config.data.seed, config.epochs, config.tamiyo.policy) == (3, 3, 5, "heuristic")
    assert config.trainer.step.compile == "off" and not config.tamiyo.compile.enabled
    assert config.recipe == recipe.recipe == "zoo0-000-cnn2d-digits-d1w4"
    # The member's own recipe is untouched.
    assert (recipe.seed, recipe.data.seed, recipe.epochs) == (0, 0, 2)


def _fields(member: ZooMember) -> dict[str, object]:
    return {name: getattr(member, name) for name in ZooMember.__dataclass_fields__}


def test_a_members_episode_configuration_pickles_for_a_worker_process() -> None:
    config = episode_config(smallest("gru").recipe(), seed=1, policy="heuristic")
    copy = pickle.loads(pickle.dumps(config))
    assert (copy.recipe, copy.seed, copy.host.slot_ids) == (config.recipe, 1, config.host.slot_ids)  # type: ignore[union-attr]
    x, _ = copy.data.load().train[:2]  # type: ignore[union-attr]
    assert torch.equal(x, config.data.load().train[:2][0])  # type: ignore[union-attr]


@pytest.mark.parametrize("family", FAMILIES)
def test_each_width_slot_widens_its_layer_in_place_and_the_model_still_trains(family: Family) -> None:
    member = smallest(family)
    config = member.recipe()
    data = load_run_data(config)
    host = build_host(config, feature_shape=data.feature_shape, num_classes=data.num_classes)
    before = sum(p.numel() for p in host.parameters())
    width_slots = [slot for sid, slot in host.slots().items() if sid.endswith("+width")]
    assert len(width_slots) == len(member.widen)
    for slot in width_slots:
        # What a restore (and, by the same resize, a merge) does: the layer and its consumer at twice the units.
        slot.kind.restore_architecture(slot, 2 * slot.kind.architecture(slot), None)
    assert sum(p.numel() for p in host.parameters()) > before
    x, y = data.train.head(8)
    config.loss(host(x), y).backward()
