"""Task variation for Simic's training episodes: deterministic draws, real hosts at other widths,
training subsets and label noise on real data (bundled and a user's streamed data set), and
clear refusals of what a recipe cannot vary."""

from __future__ import annotations

import pytest
import torch

from esper_core.data import DataSpec, DataSplits, Split, load_dataset
from esper_core.run.build import build_host, load_run_data
from esper_core.run.recipes import get_recipe
from esper_core.run.task import EpisodeTask, vary_dataset
from esper_core.simic.records import DecisionState
from esper_core.studies.episodes import episode_config
from esper_core.studies.simic_train import PLANS, get_plan
from esper_core.studies.variation import TaskVariation

VARIED = TaskVariation(widths=(0.5, 0.75, 1.0), train_fractions=(0.5, 1.0), label_noise=(0.0, 0.1))


def _params(config: object) -> int:
    host = build_host(config, feature_shape=(64,), num_classes=10)  # type: ignore[arg-type]
    return sum(p.numel() for p in host.parameters())


def _labels(split: object) -> torch.Tensor:
    return torch.stack([torch.as_tensor(split.dataset[i][1]) for i in range(len(split))])  # type: ignore[attr-defined]


def test_the_varied_plan_draws_every_combination_and_the_same_task_again_for_a_seed() -> None:
    assert get_plan("varied").variation == VARIED
    seeds = range(1000, 1080)
    draws = [VARIED.draw(s) for s in seeds]
    assert draws == [VARIED.draw(s) for s in seeds]  # a rerun trains on the same tasks
    assert [d.seed for d in draws] == list(seeds)
    assert {(d.width, d.train_fraction, d.label_noise) for d in draws} == {
        (w, f, n) for w in VARIED.widths for f in VARIED.train_fractions for n in VARIED.label_noise
    }


def test_only_the_varied_plan_varies() -> None:
    assert [name for name, plan in PLANS.items() if plan.variation.varies] == ["varied", "counterfactual-varied"]
    assert TaskVariation().draw(7) == EpisodeTask(seed=7)


def test_a_task_width_scales_the_real_host() -> None:
    base = episode_config("digits-mlp", seed=1000, policy="heuristic")
    narrow = episode_config("digits-mlp", seed=1000, policy="heuristic", task=EpisodeTask(seed=1000, width=0.5))
    assert base.task is None and base.host == get_recipe("digits-mlp").host
    assert narrow.host.hidden == (32, 32) and narrow.task == EpisodeTask(seed=1000, width=0.5)
    # 64->32->32->10 against 64->64->64->10 (the slots hold no seed yet).
    assert (_params(narrow), _params(base)) == (64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10, 2 * (64 * 64 + 64) + 650)


def test_a_training_fraction_keeps_a_fixed_subset_and_leaves_val_and_test_alone() -> None:
    config = episode_config("digits-mlp", seed=1000, policy="heuristic")
    base = load_run_data(config)
    half = load_run_data(episode_config("digits-mlp", seed=1000, policy="heuristic", task=VARIED.draw(1000)))
    task = EpisodeTask(seed=1000, train_fraction=0.5)
    varied = vary_dataset(base, task)
    assert isinstance(varied.train, Split) and isinstance(base.train, Split)
    assert len(varied.train) == round(len(base.train) * 0.5) == 540
    # Every kept sample is one of the training split's, with its own label.
    match = (varied.train.x[:, None, :] == base.train.x[None]).all(dim=-1)  # (kept, n)
    assert (match.sum(dim=1) >= 1).all()
    assert torch.equal(varied.train.y, base.train.y[match.float().argmax(dim=1)])
    assert varied.val is base.val and varied.test is base.test
    assert torch.equal(vary_dataset(base, task).train.x, varied.train.x)  # deterministic
    assert not torch.equal(vary_dataset(base, EpisodeTask(seed=1001, train_fraction=0.5)).train.x, varied.train.x)
    assert torch.equal(half.val.x, base.val.x) and torch.equal(half.test.y, base.test.y)


def test_label_noise_flips_exactly_its_share_of_training_labels_to_other_classes() -> None:
    base = load_dataset(get_recipe("digits-mlp").data)
    noisy = vary_dataset(base, EpisodeTask(seed=3, label_noise=0.1))
    assert torch.equal(noisy.train.x, base.train.x)
    flipped = noisy.train.y != base.train.y
    assert int(flipped.sum()) == round(len(base.train) * 0.1) == 108
    assert noisy.train.y.min() >= 0 and noisy.train.y.max() < 10
    assert torch.equal(noisy.val.y, base.val.y) and torch.equal(noisy.test.y, base.test.y)
    assert vary_dataset(base, EpisodeTask(seed=3)) is base  # the recipe's own task: nothing touched


def test_a_users_streamed_data_is_cut_and_relabelled_the_same_way() -> None:
    data = load_dataset(get_recipe("tests.helpers.user_model:recipe").data)
    subset = vary_dataset(data, EpisodeTask(seed=5, train_fraction=0.5))
    noisy = vary_dataset(data, EpisodeTask(seed=5, train_fraction=0.5, label_noise=0.25))
    assert len(subset.train) == len(noisy.train) == 128 and len(data.train) == 256
    # The subset does not depend on the noise rate: exactly a quarter of the same samples flip.
    assert int((_labels(noisy.train) != _labels(subset.train)).sum()) == 32
    x, y = noisy.train.dataset[0]
    assert isinstance(y, torch.Tensor) and y.dtype == torch.int64 and x.shape == (12,)
    assert noisy.val is data.val and noisy.test is data.test


def test_the_task_is_recorded_with_a_decision_and_absent_without_one() -> None:
    plain = DecisionState(history=(), candidates=(), total_epochs=3)
    assert "task" not in plain.to_json()
    task = EpisodeTask(seed=1, width=0.5, label_noise=0.1).to_dict()
    assert DecisionState.from_json(
        DecisionState(history=(), candidates=(), total_epochs=3, task=task).to_json()
    ).task == {
        "seed": 1,
        "width": 0.5,
        "train_fraction": 1.0,
        "label_noise": 0.1,
    }


@pytest.mark.parametrize(
    ("kwargs", "fix"),
    [
        ({"widths": ()}, r"widths needs at least one choice; \(1.0,\) varies nothing"),
        ({"widths": 0.5}, r"widths must be a tuple of choices, e.g. widths=\(0.5,\)"),
        ({"widths": (0.0, 1.0)}, r"widths must be factors > 0"),
        ({"train_fractions": (0.0,)}, r"train_fractions must be shares in \(0, 1\]"),
        ({"train_fractions": (1.5,)}, r"train_fractions must be shares in \(0, 1\]"),
        ({"label_noise": (1.0,)}, r"label_noise must be rates in \[0, 1\)"),
        ({"label_noise": (0.1, 0.1)}, r"label_noise lists a choice twice: \(0.1, 0.1\); list each once"),
    ],
)
def test_a_bad_variation_names_the_fix(kwargs: dict[str, object], fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        TaskVariation(**kwargs)  # type: ignore[arg-type]


def test_a_bad_task_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"train_fraction must lie in \(0, 1\]"):
        EpisodeTask(seed=0, train_fraction=0.0)
    with pytest.raises(ValueError, match=r"label_noise must lie in \[0, 1\)"):
        EpisodeTask(seed=0, label_noise=-0.1)


def test_a_recipe_that_cannot_vary_is_refused_with_the_fix() -> None:
    widths = TaskVariation(widths=(0.5, 1.0))
    with pytest.raises(ValueError, match=r"ModelSpec has no build_scaled; give it build_scaled=lambda factor"):
        widths.check(get_recipe("tests.helpers.user_model:recipe"))
    with pytest.raises(ValueError, match=r"no hidden layer to widen \(hidden=\(\)\): vary it with widths=\(1.0,\)"):
        widths.check(get_recipe("seed-reference"))
    widths.check(get_recipe("digits-mlp"))
    TaskVariation(train_fractions=(0.5,)).check(get_recipe("seed-reference"))

    user = get_recipe("tests.helpers.user_model:recipe")
    splits = user.data.load()  # type: ignore[union-attr]
    user.data = DataSpec(load=lambda: DataSplits(train=splits.train, val=splits.val, test=splits.test), batch_size=32)
    with pytest.raises(ValueError, match=r"declares no num_classes; give DataSplits\(num_classes=...\)"):
        TaskVariation(label_noise=(0.0, 0.1)).check(user)
    with pytest.raises(ValueError, match=r"declares num_classes=None: give DataSplits\(num_classes=...\)"):
        vary_dataset(load_dataset(user.data), EpisodeTask(seed=0, label_noise=0.1))
