"""The plan of a run, computed once: data shape, slots, the kernels it needs and what each costs.

Planning needs no weights: the host is built on the meta device (a user's model too), so the
slots' shapes come from a dry forward. The plan is handed to compilation (which kernels to build),
to the session (each blueprint's parameter cost and capacity at each slot profile, for Tamiyo's
candidates) and to readiness checks (are all kernels published?), so a run loads its data and probes its
model once.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

import torch

from esper_core.data import Dataset, load_dataset
from esper_core.hosts import Host
from esper_core.karn.capacity import SeedCapacity, seed_capacity
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.policy import require_approval
from esper_core.karn.profiles import ShapeProfile
from esper_core.pipeline import CompileJob
from esper_core.run.build import build_host
from esper_core.run.config import RunConfig
from esper_core.run.recipes import get_recipe
from esper_core.tamiyo.candidates import CandidateCapacity
from esper_core.tezzeret.config import Backend


@dataclass(frozen=True, kw_only=True, slots=True)
class RunPlan:
    """What a run needs before it trains.

    Attributes:
        recipe: The recipe the plan was made for.
        feature_shape: Shape of one input sample.
        slots: Slot id -> shape profile name, in slot order.
        jobs: Every (blueprint, slot profile) kernel the run may germinate.
        param_costs: ``(blueprint_id, profile)`` -> parameters the seed adds there.
        capacities: ``(blueprint_id, profile)`` -> what the seed adds there (parameters, FLOPs
            per sample, linear or not); filled by ``plan_run``, empty in compile-only plans.
    """

    recipe: str
    feature_shape: tuple[int, ...]
    slots: dict[str, str]
    jobs: tuple[CompileJob, ...]
    param_costs: dict[tuple[str, str], int]
    capacities: dict[tuple[str, str], SeedCapacity] = field(default_factory=dict)

    @property
    def profiles(self) -> list[str]:
        """Distinct slot profiles, in slot order."""
        return list(dict.fromkeys(self.slots.values()))

    def candidate_capacity(self, blueprint_id: str, profiles: Iterable[str]) -> tuple[CandidateCapacity, ...]:
        """What ``blueprint_id`` adds at each of ``profiles`` that was measured (Tamiyo's candidates)."""
        return tuple(
            CandidateCapacity(profile=p, parameters=c.parameters, flops_per_sample=c.flops_per_sample, linear=c.linear)
            for p in profiles
            if (c := self.capacities.get((blueprint_id, p))) is not None
        )


def meta_host(config: RunConfig, feature_shape: tuple[int, ...], num_classes: int | None) -> Host:
    """The run's host built on the meta device: its slots and shapes, no memory for weights."""
    with torch.device("meta"):
        return build_host(config, feature_shape=feature_shape, num_classes=num_classes)


def plan_run(
    config: RunConfig,
    *,
    catalog: KarnCatalog,
    data: Dataset | None = None,
    backend: Backend | str = Backend.EXPORT,
    approved: Collection[str] = (),
) -> RunPlan:
    """Plan ``config``: its slots, the kernels to compile for them and their parameter costs.

    Args:
        config: The run's configuration.
        catalog: The Karn catalogue.
        data: The run's data if already loaded (else it is loaded for its shape).
        backend: Tezzeret backend of every job.
        approved: Experimental / high-risk blueprint ids explicitly approved for compiling.

    Raises:
        ValueError: a blueprint Karn does not know, or one that fits none of the slots (the
            message names it and the fix); a slot the model cannot take (see ``GrowableModel``).
        ApprovalRequiredError: a non-safe blueprint that ``approved`` does not name.
    """
    data = data or load_dataset(config.data)
    plan = _plan(
        config,
        catalog=catalog,
        feature_shape=data.feature_shape,
        num_classes=data.num_classes,
        backend=backend,
        approved=approved,
    )
    capacities = {key: _capacity(catalog, *key) for key in plan.param_costs}
    return dataclasses.replace(plan, capacities=capacities)


@functools.lru_cache(maxsize=256)
def _capacity(catalog: KarnCatalog, blueprint_id: str, profile: str) -> SeedCapacity:
    """``seed_capacity`` at the catalogue's default parameters, once per process: it builds and
    probes the real module (10-300 ms a recipe), and a catalogue is immutable."""
    return seed_capacity(catalog, blueprint_id, ShapeProfile.parse(profile))


@functools.lru_cache(maxsize=16)
def recipe_feature_shape(recipe: str) -> tuple[int, ...]:
    """Shape of one input sample of ``recipe``'s data, loaded once per process and recipe.

    The compile planning and the readiness check of one flow run both need it; neither should
    load the data set again (the shape does not depend on the seed or any override).
    """
    return load_dataset(get_recipe(recipe).data).feature_shape


def plan_compile_jobs(
    config: RunConfig,
    *,
    feature_shape: tuple[int, ...],
    catalog: KarnCatalog,
    backend: Backend | str = Backend.EXPORT,
    approved: Collection[str] = (),
) -> list[CompileJob]:
    """The compile jobs of ``plan_run`` for data of ``feature_shape`` (the data is not loaded).

    Raises:
        ValueError, ApprovalRequiredError: as ``plan_run``.
    """
    # The class count sizes only a built-in host's classifier, never a slot.
    plan = _plan(
        config, catalog=catalog, feature_shape=feature_shape, num_classes=2, backend=backend, approved=approved
    )
    return list(plan.jobs)


def _plan(
    config: RunConfig,
    *,
    catalog: KarnCatalog,
    feature_shape: tuple[int, ...],
    num_classes: int | None,
    backend: Backend | str,
    approved: Collection[str],
) -> RunPlan:
    host = meta_host(config, feature_shape, num_classes)
    slots = {sid: slot.profile.name for sid, slot in host.slots().items()}
    profiles = [ShapeProfile.parse(p) for p in dict.fromkeys(slots.values())]
    jobs: list[CompileJob] = []
    costs: dict[tuple[str, str], int] = {}
    for blueprint_id in config.blueprints:
        entry = catalog.get(blueprint_id)
        require_approval(entry.descriptor, approved, action="compile")
        fitting = [p for p in profiles if entry.supports(p)]
        if not fitting:
            raise ValueError(
                f"recipe {config.recipe} lists {blueprint_id}, which supports {entry.describe_profiles()}, "
                f"but its slots are {[p.name for p in profiles]}: remove it from the recipe"
            )
        params = tuple(sorted(catalog.resolve_params(blueprint_id).items()))
        for p in fitting:
            jobs.append(
                CompileJob(
                    blueprint_id=blueprint_id,
                    profile=p.name,
                    params=params,
                    backend=Backend(backend).value,
                    approved=blueprint_id in approved,
                )
            )
            with torch.device("meta"):
                module = catalog.build(blueprint_id, p)
            costs[(blueprint_id, p.name)] = sum(t.numel() for t in module.parameters())
    return RunPlan(
        recipe=config.recipe,
        feature_shape=feature_shape,
        slots=slots,
        jobs=tuple(jobs),
        param_costs=costs,
    )
