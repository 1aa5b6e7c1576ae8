"""Drawing the zoo: deterministic members, every family reachable, bad specs refused with their fix."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
import torch

from esper_core.zoo import FAMILIES, FAMILY_FACTS, ZooMember, ZooSpec, ZooTask, draw_member, draw_members
from esper_core.zoo.recipe import stream_followable
from esper_core.zoo.tasks import MODES, SYNTHETIC_CLASSES, gaussian_means


def test_the_same_seed_draws_the_same_members_and_a_member_does_not_depend_on_how_many() -> None:
    spec = ZooSpec(seed=3)
    assert draw_members(spec, 6) == draw_members(ZooSpec(seed=3), 6)
    assert draw_members(spec, 3) == draw_members(spec, 6)[:3]
    assert draw_members(spec, 2, start=4) == draw_members(spec, 6)[4:]
    assert draw_members(ZooSpec(seed=4), 6) != draw_members(spec, 6)
    assert [m.index for m in draw_members(spec, 6)] == list(range(6))


def test_every_family_and_choice_is_drawn_and_each_member_fits_its_family() -> None:
    members = draw_members(ZooSpec(seed=0), 200)
    assert {m.family for m in members} == set(FAMILIES)
    assert {m.task.label for m in members} >= {"mnist1d", "digits", "chars"}
    assert any(m.task.name == "gaussians" for m in members) and any(m.task.name == "teacher" for m in members)
    for m in members:
        facts = FAMILY_FACTS[m.family]
        assert m.task.name in facts.tasks and 1 <= m.depth <= facts.max_depth
    assert len({m.name for m in members}) == len(members)  # a name identifies a member


def test_a_restricted_spec_draws_only_what_it_allows() -> None:
    spec = ZooSpec(seed=1, families=("mlp",), tasks=("gaussians",), depths=(2,), widths=(4,), separations=(2.5,))
    for m in draw_members(spec, 10):
        assert (m.family, m.task.name, m.depth, m.width, m.task.separation) == ("mlp", "gaussians", 2, 4, 2.5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"families": ("mlp", "vit")}, r"families has unknown choices \['vit'\]; choose among"),
        ({"families": "mlp"}, r"families must be a tuple of choices, e.g. families=\('mlp',\)"),
        ({"widths": ()}, r"widths needs at least one choice"),
        ({"depths": (1, 1)}, r"depths lists a choice twice"),
        ({"widths": (1, 8)}, r"widths must be integers >= 2"),
        ({"train_samples": (1000, 1001)}, r"train_samples must be multiples of 8"),
        ({"batch_sizes": (1024,)}, r"batch_sizes must be <= 512"),
        ({"lrs": (0.0,)}, r"lrs must be > 0"),
        ({"kinds": ("grow",)}, r"kinds has unknown choices \['grow'\]"),
        (
            {"kinds": ("depth",)},
            r"family 'mlp' grows only by \('width', 'branch'\).*add one of \['width', 'branch'\] to kinds, or drop 'mlp'",
        ),
        (
            {"kinds": ("stream", "depth")},
            r"family 'mlp' grows only by .*kinds=\('stream', 'depth'\): drop 'mlp' from families",
        ),
        ({"kinds": ("stream", "width")}, r"cannot share a model with width or branch slots"),
        ({"kinds": ("stream",), "families": ("encoder", "decoder")}, r"draw kinds=\('stream', 'depth'\)"),
        ({"families": ("decoder",), "tasks": ("mnist1d",)}, r"family 'decoder' reads only tasks \('chars',\).*add one"),
        ({"families": ("gru",), "depths": (3,)}, r"family 'gru' is at most 2 deep.*add a depth <= 2"),
        ({"seed": -1}, r"seed must lie in \[0, 2\*\*32\)"),
    ],
)
def test_a_bad_spec_is_refused_with_what_to_change(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ZooSpec(**change)


def test_depth_and_the_stream_are_offered_where_the_family_has_them() -> None:
    spec = ZooSpec(seed=0, families=("resnet", "encoder", "decoder"), kinds=("stream", "depth"))
    members = draw_members(spec, 12)
    assert {m.family for m in members} == {"resnet", "encoder", "decoder"}
    for m in members:
        host = m.recipe().host
        assert host.deepen == ("blocks",) and host.widen == () and host.slots == ()
        # The resnet's stream is convolutional; an encoder's follows unless its features equal its width.
        assert host.widen_stream == (m.family == "decoder" or (m.family == "encoder" and stream_followable(m)))
    both = draw_member(ZooSpec(seed=0, families=("encoder",), kinds=("width", "depth")), 0)
    assert both.recipe().host.widen == ("blocks.0.fc", "blocks.1.fc")[: both.depth] and both.deepen == ("blocks",)
    # An encoder over 8 features at width 8 has no stream to follow; alone, stream leaves it nothing.
    collided = dataclasses.replace(
        draw_member(ZooSpec(seed=0, families=("encoder",), tasks=("digits",), kinds=("stream", "depth")), 0), width=8
    )
    assert not stream_followable(collided) and not collided.widen_stream
    with pytest.raises(ValueError, match=r"offers no layer, stack or stream to grow"):
        dataclasses.replace(collided, kinds=("stream",))


def test_a_member_that_contradicts_its_family_is_refused() -> None:
    member = draw_member(ZooSpec(seed=0, families=("cnn2d",)), 0)
    with pytest.raises(ValueError, match=r"family 'cnn2d' reads tasks \('digits',\), not 'chars'"):
        dataclasses.replace(member, task=ZooTask(name="chars", seed=0))
    with pytest.raises(ValueError, match=r"family 'cnn2d' takes depth 1..3, got 4"):
        dataclasses.replace(member, depth=4)
    with pytest.raises(ValueError, match=r"a member's index must be >= 0"):
        draw_member(ZooSpec(), -1)


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ({"name": "mnist1d", "train": 1001}, r"multiple of 8.*use 1000"),
        ({"name": "gaussians"}, r"give gaussians a separation > 0"),
        ({"name": "digits", "teacher_width": 4}, r"give teacher a width >= 1.*any other task 0"),
        ({"name": "imagenet"}, r"task name must be one of"),
    ],
)
def test_a_bad_task_is_refused_with_what_to_change(task: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ZooTask(seed=0, **task)


def test_synthetic_tasks_are_the_same_for_the_same_seed_and_differ_for_another() -> None:
    for task in (
        ZooTask(name="gaussians", seed=5, train=64, separation=3.0),
        ZooTask(name="teacher", seed=5, train=64, teacher_width=8),
    ):
        first, again = task.load(), task.load()
        other = dataclasses.replace(task, seed=6).load()
        for split in ("train", "val", "test"):
            a, b = getattr(first, split).tensors, getattr(again, split).tensors
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        assert not torch.equal(first.train.tensors[0], other.train.tensors[0])
        assert len(first.train) == 64 and first.num_classes == SYNTHETIC_CLASSES
        assert set(first.train.tensors[1].tolist()) <= set(range(SYNTHETIC_CLASSES))


def test_the_gaussians_difficulty_is_the_exact_distance_between_every_two_modes() -> None:
    means = gaussian_means(7, 3.0)
    assert means.shape[0] == MODES * SYNTHETIC_CLASSES
    for i, j in itertools.combinations(range(len(means)), 2):
        assert torch.dist(means[i], means[j]).item() == pytest.approx(3.0, abs=1e-4)


def test_a_wider_separation_is_an_easier_task() -> None:
    def nearest_mode_accuracy(separation: float) -> float:
        task = ZooTask(name="gaussians", seed=2, train=8, separation=separation)
        x, y = task.load().test.tensors
        guess = torch.cdist(x, gaussian_means(2, separation)).argmin(dim=1) % SYNTHETIC_CLASSES
        return (guess == y).float().mean().item()

    hard, easy = nearest_mode_accuracy(1.0), nearest_mode_accuracy(6.0)
    assert hard < 0.6 < 0.95 < easy


def test_a_member_is_a_plain_record_that_survives_pickling() -> None:
    import pickle

    member = draw_member(ZooSpec(seed=0), 5)
    assert isinstance(member, ZooMember)
    assert pickle.loads(pickle.dumps(member)) == member
