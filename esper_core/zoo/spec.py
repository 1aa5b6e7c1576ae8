"""What the zoo draws from (``ZooSpec``) and one drawn host (``ZooMember``).

``draw_member(spec, i)`` draws member ``i`` from its own random stream, seeded by the zoo's seed
and ``i`` alone: the same spec gives the same members whatever ``n`` is asked of
``draw_members``, and member 7 does not change when member 3's family list does. A member is a
frozen record of plain values (it pickles to a Dask worker as is); its model and data are built
from it when a run asks (``esper_core.zoo.recipe``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar, get_args

from esper_core.run.config import RunConfig
from esper_core.zoo.recipe import branch_slots, member_recipe, stream_followable, width_layers
from esper_core.zoo.tasks import TASKS, TaskName, ZooTask

T = TypeVar("T")

Family = Literal["mlp", "cnn1d", "cnn2d", "resnet", "encoder", "decoder", "gru"]
FAMILIES: tuple[Family, ...] = get_args(Family)

SeedKindName = Literal["width", "branch", "depth", "stream"]
SEED_KINDS: tuple[SeedKindName, ...] = get_args(SeedKindName)
# A doubled residual stream widens every layer that meets it, so Kasmina refuses it beside width
# or branch slots in one model (``ModelSpec``); a zoo offers it with depth at most.
_STREAM_ALONE: frozenset[SeedKindName] = frozenset({"width", "branch"})


@dataclass(frozen=True, kw_only=True, slots=True)
class FamilyFacts:
    """What a family can be drawn with.

    Attributes:
        tasks: The tasks whose inputs the family reads.
        max_depth: The deepest it is drawn (a 2-D CNN pools an 8x8 image to 1x1 in three blocks).
        kinds: The seed kinds its models can grow by (``esper_core.zoo.recipe`` names the layers):
            every family has widenable layers and modules for branch seeds; a stack of identical
            blocks (``blocks``) can be deepened; a transformer's residual stream can be doubled.
    """

    tasks: tuple[TaskName, ...]
    max_depth: int
    kinds: tuple[SeedKindName, ...] = ("width", "branch")


FAMILY_FACTS: dict[Family, FamilyFacts] = {
    "mlp": FamilyFacts(tasks=("mnist1d", "digits", "gaussians", "teacher"), max_depth=3),
    "cnn1d": FamilyFacts(tasks=("mnist1d",), max_depth=3),
    "cnn2d": FamilyFacts(tasks=("digits",), max_depth=3),
    "resnet": FamilyFacts(tasks=("digits",), max_depth=3, kinds=("width", "branch", "depth")),
    "encoder": FamilyFacts(tasks=("mnist1d", "digits"), max_depth=2, kinds=SEED_KINDS),
    "decoder": FamilyFacts(tasks=("chars",), max_depth=2, kinds=SEED_KINDS),
    "gru": FamilyFacts(tasks=("mnist1d", "digits"), max_depth=2),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ZooSpec:
    """The choices a zoo draws its members from; each choice of a field is equally likely.

    The defaults draw hosts whose episodes take seconds on one CPU thread (``bench/zoo.py``
    measures them; ``docs/zoo.md`` has the numbers).

    Attributes:
        seed: The zoo's seed: with a member's index, it fixes everything about that member.
        families: Families to draw from (``FAMILIES``).
        tasks: Tasks to draw from (``TASKS``); each family reads only some (``FAMILY_FACTS``).
        depths: Layers (blocks, GRU layers) to draw from, capped per family by its ``max_depth``.
        widths: Hidden units, channels or model widths to draw from (a transformer rounds up to
            a multiple of its 2 heads).
        epochs: Training epochs to draw from.
        batch_sizes: Training batch sizes to draw from.
        lrs: Adam learning rates to draw from.
        train_samples: Training samples of a task to draw from (multiples of 8: MNIST-1D draws
            equal classes); the digits always use their ~1,080.
        separations: ``gaussians`` difficulties to draw from (distance between modes, in noise
            standard deviations: 2 is hard, 5 easy).
        teacher_widths: ``teacher`` difficulties to draw from (hidden units of the labeller).
        kinds: The seed kinds a member's recipe offers, where its family has them
            (``FamilyFacts.kinds``): ``width`` (its widenable layers), ``branch`` (blueprint seeds
            on module outputs, which need compiled kernels), ``depth`` (its stack of blocks
            deepened) and ``stream`` (a transformer's whole width doubled; with depth at most).
            Every family drawn must have at least one of them.
    """

    seed: int = 0
    families: tuple[Family, ...] = FAMILIES
    tasks: tuple[TaskName, ...] = TASKS
    depths: tuple[int, ...] = (1, 2, 3)
    widths: tuple[int, ...] = (8, 16, 32)
    epochs: tuple[int, ...] = (4, 6, 8)
    batch_sizes: tuple[int, ...] = (32, 64)
    lrs: tuple[float, ...] = (3e-3, 1e-2)
    train_samples: tuple[int, ...] = (1000, 2000)
    separations: tuple[float, ...] = (2.0, 3.0, 4.0)
    teacher_widths: tuple[int, ...] = (4, 16, 64)
    kinds: tuple[SeedKindName, ...] = ("width",)

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must lie in [0, 2**32), got {self.seed}")
        _check_choices("families", self.families, allowed=FAMILIES)
        _check_choices("tasks", self.tasks, allowed=TASKS)
        _check_kinds(self.kinds)
        if self.kinds == ("stream",) and set(self.families) - {"decoder"}:
            raise ValueError(
                f"kinds=('stream',) with families {self.families}: only transformers have a stream, and an encoder "
                "whose token features equal its width has none Kasmina can follow (zoo.recipe.stream_followable); "
                "draw kinds=('stream', 'depth') so every member can grow, or families=('decoder',)"
            )
        for name, least in (("depths", 1), ("widths", 2), ("epochs", 1), ("batch_sizes", 2), ("train_samples", 8)):
            values = _check_choices(name, getattr(self, name))
            if any(not isinstance(v, int) or v < least for v in values):
                raise ValueError(f"{name} must be integers >= {least}, got {values}")
        if any(n % 8 for n in self.train_samples):
            raise ValueError(
                f"train_samples must be multiples of 8 (MNIST-1D draws equal classes), got {self.train_samples}"
            )
        if any(b > 512 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes must be <= 512 (the slots' batch_max), got {self.batch_sizes}")
        for name, values in (("lrs", self.lrs), ("separations", self.separations)):
            if any(v <= 0 for v in _check_choices(name, values)):
                raise ValueError(f"{name} must be > 0, got {values}")
        if any(w < 1 for w in _check_choices("teacher_widths", self.teacher_widths)):
            raise ValueError(f"teacher_widths must be >= 1, got {self.teacher_widths}")
        for family in self.families:
            facts = FAMILY_FACTS[family]
            if not set(facts.tasks) & set(self.tasks):
                raise ValueError(
                    f"family {family!r} reads only tasks {facts.tasks}, none of which is in tasks={self.tasks}: "
                    f"add one to tasks, or drop {family!r} from families"
                )
            if not set(facts.kinds) & set(self.kinds):
                raise ValueError(
                    f"family {family!r} grows only by {facts.kinds}, none of which is in kinds={self.kinds}: "
                    f"{_kinds_fix(facts.kinds, self.kinds)}drop {family!r} from families"
                )
            if min(self.depths) > facts.max_depth:
                raise ValueError(
                    f"family {family!r} is at most {facts.max_depth} deep, but depths={self.depths}: "
                    f"add a depth <= {facts.max_depth}, or drop {family!r} from families"
                )


@dataclass(frozen=True, kw_only=True, slots=True)
class ZooMember:
    """One host of the zoo: a family at a depth and width, a task and a training budget.

    ``esper_core.zoo.recipe.member_recipe`` (or ``member.recipe()``) turns it into the
    ``RunConfig`` of an ordinary Esper run.

    Attributes:
        zoo_seed: The seed of the zoo it was drawn from.
        index: Its index in that zoo.
        family: Its architecture family.
        task: Its data.
        depth: Layers, blocks or GRU layers.
        width: Hidden units, channels or model width.
        epochs: Training epochs.
        batch_size: Training batch size.
        lr: Adam's learning rate (cosine decay over the run).
        kinds: The seed kinds its recipe offers.
    """

    zoo_seed: int
    index: int
    family: Family
    task: ZooTask
    depth: int
    width: int
    epochs: int
    batch_size: int
    lr: float
    kinds: tuple[SeedKindName, ...] = ("width",)

    def __post_init__(self) -> None:
        if self.zoo_seed < 0 or self.index < 0:
            raise ValueError(f"zoo_seed and index must be >= 0, got {self.zoo_seed} and {self.index}")
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        facts = FAMILY_FACTS[self.family]
        if self.task.name not in facts.tasks:
            raise ValueError(f"family {self.family!r} reads tasks {facts.tasks}, not {self.task.name!r}")
        if not 1 <= self.depth <= facts.max_depth:
            raise ValueError(f"family {self.family!r} takes depth 1..{facts.max_depth}, got {self.depth}")
        if self.width < 2:
            raise ValueError(f"width must be >= 2 (a width seed needs units to grow from), got {self.width}")
        if self.epochs < 1 or not 2 <= self.batch_size <= 512 or self.lr <= 0:
            raise ValueError(
                f"epochs must be >= 1, batch_size in 2..512 and lr > 0; got epochs {self.epochs}, "
                f"batch_size {self.batch_size}, lr {self.lr}"
            )
        _check_kinds(self.kinds)
        if not (self.widen or self.slots or self.deepen or self.widen_stream):
            raise ValueError(
                f"a {self.family} member with kinds={self.kinds} offers no layer, stack or stream to grow "
                f"(its family grows by {facts.kinds}): {_kinds_fix(facts.kinds, self.kinds)}draw another family"
            )

    @property
    def name(self) -> str:
        """The member's recipe name, e.g. ``zoo0-003-cnn2d-digits-d2w16``."""
        return f"zoo{self.zoo_seed}-{self.index:03d}-{self.family}-{self.task.label}-d{self.depth}w{self.width}"

    @property
    def language_model(self) -> bool:
        """Whether it predicts tokens (``chars``): scored by its loss, its accuracy being 0."""
        return self.task.name == "chars"

    @property
    def widen(self) -> tuple[str, ...]:
        """The layers its recipe lets Tamiyo widen (with ``width`` among its kinds)."""
        return width_layers(self) if "width" in self.kinds else ()

    @property
    def slots(self) -> tuple[str, ...]:
        """The modules its recipe offers branch seeds (with ``branch`` among its kinds)."""
        return branch_slots(self) if "branch" in self.kinds else ()

    @property
    def deepen(self) -> tuple[str, ...]:
        """The stacks its recipe lets Tamiyo deepen (with ``depth`` among its kinds, where its
        family has one)."""
        return ("blocks",) if "depth" in self.kinds and "depth" in FAMILY_FACTS[self.family].kinds else ()

    @property
    def widen_stream(self) -> bool:
        """Whether its recipe lets Tamiyo double the model's width (with ``stream`` among its
        kinds, for a transformer whose stream Kasmina can follow: ``stream_followable``)."""
        return "stream" in self.kinds and "stream" in FAMILY_FACTS[self.family].kinds and stream_followable(self)

    def recipe(self) -> RunConfig:
        """Its recipe: the complete configuration of an ordinary Esper run on it (``member_recipe``)."""
        return member_recipe(self)


def draw_member(spec: ZooSpec, index: int) -> ZooMember:
    """Member ``index`` of the zoo ``spec``, from a random stream of its own.

    Raises:
        ValueError: a negative ``index``.
    """
    if index < 0:
        raise ValueError(f"a member's index must be >= 0, got {index}")
    # A string seed is hashed (SHA-512) by ``random.Random``: a stable stream per (zoo, member).
    rng = random.Random(f"esper-zoo:{spec.seed}:{index}")
    family = rng.choice(spec.families)
    facts = FAMILY_FACTS[family]
    task_name = rng.choice([t for t in spec.tasks if t in facts.tasks])
    task = ZooTask(
        name=task_name,
        seed=rng.randrange(2**32),
        train=rng.choice(spec.train_samples),
        separation=rng.choice(spec.separations) if task_name == "gaussians" else 0.0,
        teacher_width=rng.choice(spec.teacher_widths) if task_name == "teacher" else 0,
    )
    return ZooMember(
        zoo_seed=spec.seed,
        index=index,
        family=family,
        task=task,
        depth=rng.choice([d for d in spec.depths if d <= facts.max_depth]),
        width=rng.choice(spec.widths),
        epochs=rng.choice(spec.epochs),
        batch_size=rng.choice(spec.batch_sizes),
        lr=rng.choice(spec.lrs),
        kinds=spec.kinds,
    )


def draw_members(spec: ZooSpec, n: int, *, start: int = 0) -> list[ZooMember]:
    """Members ``start .. start + n - 1`` of the zoo ``spec`` (Simic's iteration over the zoo).

    Raises:
        ValueError: ``n`` < 1 or a negative ``start``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1 members, got {n}")
    return [draw_member(spec, i) for i in range(start, start + n)]


def _kinds_fix(has: tuple[SeedKindName, ...], kinds: tuple[SeedKindName, ...]) -> str:
    """The start of a fix for a family offered none of ``kinds``: the kinds it has that may join
    them (none beside ``stream`` but ``depth``), or nothing."""
    addable = [k for k in has if k not in kinds and not ("stream" in kinds and k in _STREAM_ALONE)]
    return f"add one of {addable} to kinds, or " if addable else ""


def _check_kinds(kinds: tuple[SeedKindName, ...]) -> None:
    """``kinds`` are seed kinds one model can offer together."""
    _check_choices("kinds", kinds, allowed=SEED_KINDS)
    if "stream" in kinds and _STREAM_ALONE & set(kinds):
        raise ValueError(
            f"kinds={kinds}: a doubled stream widens every layer that meets it, so it cannot share a "
            "model with width or branch slots; draw kinds=('stream',) or ('stream', 'depth'), and the "
            "others in a zoo of their own"
        )


def _check_choices(name: str, values: tuple[T, ...], *, allowed: Sequence[T] = ()) -> tuple[T, ...]:
    """``values`` is a non-empty tuple of distinct choices, each in ``allowed`` when given."""
    if isinstance(values, str) or not isinstance(values, tuple):
        raise ValueError(f"{name} must be a tuple of choices, e.g. {name}=({values!r},)")
    if not values:
        raise ValueError(f"{name} needs at least one choice")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} lists a choice twice: {values}; list each once (choices are equally likely)")
    unknown = [v for v in values if allowed and v not in allowed]
    if unknown:
        raise ValueError(f"{name} has unknown choices {unknown}; choose among {allowed}")
    return values
