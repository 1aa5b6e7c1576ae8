"""Vary the task per Simic training episode, so a policy must read the run's state.

Trained on one recipe's task alone, a policy can score well by replaying a schedule (germinate
at epoch k, fossilise at k + 3) without reading anything. ``TaskVariation`` lists the host
widths, shares of the training data and label-noise rates to draw from; each training episode
draws one of each from its own seed (``draw``), so a rerun trains on the same tasks. Evaluation
never varies: only ``collect_episodes`` draws, for the plan's training episodes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from esper_core.data import DataSpec, load_dataset
from esper_core.hosts import HostConfig
from esper_core.run.config import ModelSpec, RunConfig
from esper_core.run.task import EpisodeTask


@dataclass(kw_only=True, slots=True)
class TaskVariation:
    """What a training episode's task is drawn from (each choice equally likely).

    The default varies nothing: episodes run the recipe's own task, exactly as without it.

    Attributes:
        widths: Host width factors (``HostConfig.scaled`` / ``ModelSpec.scaled``); a recipe whose
            host cannot change width is refused unless this is ``(1.0,)``.
        train_fractions: Shares of the training split to keep (a subset fixed by the episode's
            seed); validation and test are never cut.
        label_noise: Shares of the kept training labels to replace by another class at random;
            validation and test labels are never touched.
    """

    widths: tuple[float, ...] = (1.0,)
    train_fractions: tuple[float, ...] = (1.0,)
    label_noise: tuple[float, ...] = (0.0,)

    def __post_init__(self) -> None:
        for name, bad, what in (
            ("widths", lambda w: w <= 0, "factors > 0 (1.0 is the recipe's width)"),
            ("train_fractions", lambda f: not 0.0 < f <= 1.0, "shares in (0, 1] (1.0 keeps every sample)"),
            ("label_noise", lambda r: not 0.0 <= r < 1.0, "rates in [0, 1) (0.0 flips no label)"),
        ):
            values = getattr(self, name)
            if isinstance(values, str | int | float) or not isinstance(values, Sequence):
                raise ValueError(f"{name} must be a tuple of choices, e.g. {name}=({values!r},)")
            values = tuple(float(v) for v in values)
            setattr(self, name, values)
            if not values:
                raise ValueError(f"{name} needs at least one choice; ({_identity(name)},) varies nothing")
            if any(bad(v) for v in values):
                raise ValueError(f"{name} must be {what}, got {values}")
            if len(set(values)) != len(values):
                raise ValueError(f"{name} lists a choice twice: {values}; list each once (choices are equally likely)")

    @property
    def varies(self) -> bool:
        """Whether any episode's task can differ from the recipe's."""
        return (self.widths, self.train_fractions, self.label_noise) != ((1.0,), (1.0,), (0.0,))

    def draw(self, seed: int) -> EpisodeTask:
        """The task of the episode with ``seed``: one width, fraction and noise rate, from ``seed`` alone."""
        rng = random.Random(seed)
        return EpisodeTask(
            seed=seed,
            width=rng.choice(self.widths),
            train_fraction=rng.choice(self.train_fractions),
            label_noise=rng.choice(self.label_noise),
        )

    def check(self, config: RunConfig) -> None:
        """Refuse a recipe this variation cannot vary, before any episode runs.

        Raises:
            ValueError: Widths other than 1.0 for a host that cannot change width (a ``ModelSpec``
                without ``build_scaled``, or a built-in host with no hidden layer), or label noise
                on a user's data that declares no number of classes.
        """
        if self.widths != (1.0,):
            host = config.host
            if isinstance(host, ModelSpec) and host.build_scaled is None:
                raise ValueError(
                    f"recipe {config.recipe!r} cannot vary its host's width: its ModelSpec has no build_scaled; "
                    "give it build_scaled=lambda factor: MyNet(width=round(32 * factor)), or vary with widths=(1.0,)"
                )
            if isinstance(host, HostConfig) and all(host.scaled(w) == host for w in self.widths):
                raise ValueError(
                    f"recipe {config.recipe!r}'s host has no hidden layer to widen (hidden={host.hidden}): "
                    "vary it with widths=(1.0,)"
                )
        # Only a user's data can lack a class count, and only loading it tells.
        noisy_user_data = self.label_noise != (0.0,) and isinstance(config.data, DataSpec)
        if noisy_user_data and load_dataset(config.data).num_classes is None:
            raise ValueError(
                f"recipe {config.recipe!r}: label noise flips class labels, but its data declares no "
                "num_classes; give DataSplits(num_classes=...), or vary with label_noise=(0.0,)"
            )


def _identity(name: str) -> str:
    return "0.0" if name == "label_noise" else "1.0"
