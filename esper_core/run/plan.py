"""The plan of a run, computed once: data shape, slots, the kernels it needs and what each costs.

Planning needs no weights: the host is built on the meta device (a user's model too), so the
slots' shapes come from a dry forward. The plan is handed to compilation (which kernels to build),
to the session (each blueprint's parameter cost and capacity at each slot profile, for Tamiyo's
candidates) and to readiness checks (are all kernels published?), so a run loads its data and probes its
model once: ``esper_core.run.spec`` makes it once per run and hands it on.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

import torch

from esper_core.contracts.enums import BlueprintTier
from esper_core.data import Dataset, load_dataset
from esper_core.hosts import Host
from esper_core.karn.capacity import SeedCapacity, seed_capacity
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.depth import DEPTH_MENU
from esper_core.karn.entries import default_catalog
from esper_core.karn.policy import needs_approval, require_approval
from esper_core.karn.profiles import ShapeProfile
from esper_core.karn.stream import STREAM_MENU
from esper_core.karn.width import WIDTH_MENU
from esper_core.kasmina.kinds import SeedKind
from esper_core.kasmina.slot import SeedSlot
from esper_core.pipeline import CompileJob
from esper_core.run.build import build_host
from esper_core.run.config import RunConfig
from esper_core.run.recipes import get_recipe
from esper_core.tamiyo.candidates import BlueprintCandidate, CandidateCapacity
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
        blueprints: The blueprints the run may germinate (listed by the recipe, or every
            approved one that fits a slot), in catalogue or recipe order.
        slot_fits: Slot id -> the blueprints that fit it (Tamiyo's candidates for that slot).
        capacities: ``(blueprint_id, profile)`` -> what the seed adds there (parameters, FLOPs
            per sample, linear or not); filled by ``plan_run``, empty in compile-only plans.
        built_slots: Slot id -> the layer it grows, for slots whose kind builds its seeds from
            the host (``SeedKind.compiled`` False: a width slot of ``ModelSpec.widen``). They
            are not in ``slots`` (no kernel is compiled for them); ``slot_fits`` offers them their
            kind's menu, and ``param_costs[(entry, profile)]`` is the most an entry adds at any of
            them (at the host's starting shape).
        built_candidates: Tamiyo's candidates for the built slots: each menu entry, with the
            profiles of the slots that offer it; always available (no registry involved). Their
            costs are the starting host's: a run offers ``built_candidates(slots)`` of its live
            slots instead, whose costs follow the host as it grows.
    """

    recipe: str
    feature_shape: tuple[int, ...]
    slots: dict[str, str]
    jobs: tuple[CompileJob, ...]
    param_costs: dict[tuple[str, str], int]
    blueprints: tuple[str, ...] = ()
    slot_fits: dict[str, tuple[str, ...]] = field(default_factory=dict)
    capacities: dict[tuple[str, str], SeedCapacity] = field(default_factory=dict)
    built_slots: dict[str, str] = field(default_factory=dict)
    built_candidates: tuple[BlueprintCandidate, ...] = ()

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
            message names it and the blueprints that fit); a slot the model cannot take (see
            ``GrowableModel``) or whose seeds could not start under ``config.kasmina`` (see
            ``SeedKind.check_config``).
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
    _check_every_slot_fits(config, catalog, plan)
    # A built seed's capacity depends on the layer it grows, not on a profile: it has none here.
    built = {profile for c in plan.built_candidates for profile in c.shape_profiles}
    capacities = {key: _capacity(catalog, *key) for key in plan.param_costs if key[1] not in built}
    return dataclasses.replace(plan, capacities=capacities)


@functools.lru_cache(maxsize=256)
def _capacity(catalog: KarnCatalog, blueprint_id: str, profile: str) -> SeedCapacity:
    """``seed_capacity`` at the catalogue's default parameters, once per process: it builds and
    probes the real module (10-300 ms a recipe), and a catalogue is immutable."""
    return seed_capacity(catalog, blueprint_id, ShapeProfile.parse(profile))


@functools.lru_cache(maxsize=16)
def recipe_feature_shape(recipe: str) -> tuple[int, ...]:
    """Shape of one input sample of ``recipe``'s data, loaded once per process and recipe.

    Planning without a run (``check_recipe``, a catalogue compile) needs it, the same recipe
    often more than once a process; none should load the data set again (the shape does not
    depend on the seed or any override).
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
    for slot in host.slots().values():
        slot.kind.check_config(slot, config.kasmina)
    built_slots = {sid: slot for sid, slot in host.slots().items() if not slot.kind.compiled}
    slot_profiles = {sid: slot.profile for sid, slot in host.slots().items() if sid not in built_slots}
    fits = slot_blueprints(config, catalog=catalog, slot_profiles=slot_profiles, approved=approved)
    fits.update({sid: slot.kind.menu for sid, slot in built_slots.items()})
    # In the recipe's (or the catalogue's) order, as Tamiyo's candidates always were.
    blueprints = tuple(b for b in (config.blueprints or catalog.ids) if any(b in bs for bs in fits.values()))
    _check_schedule_fits(config, fits)
    _check_preferred(config, catalog)
    profiles = list(dict.fromkeys(slot_profiles.values()))
    jobs: list[CompileJob] = []
    costs: dict[tuple[str, str], int] = {}
    for blueprint_id in blueprints:
        entry = catalog.get(blueprint_id)
        params = tuple(sorted(catalog.resolve_params(blueprint_id).items()))
        for p in profiles:
            if not entry.supports(p):
                continue
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
    costs.update(_built_costs(built_slots.values()))
    return RunPlan(
        recipe=config.recipe,
        feature_shape=feature_shape,
        slots={sid: p.name for sid, p in slot_profiles.items()},
        jobs=tuple(jobs),
        param_costs=costs,
        blueprints=blueprints,
        slot_fits=fits,
        built_slots={sid: slot.layer for sid, slot in built_slots.items()},
        built_candidates=built_candidates(built_slots.values()),
    )


def _built_costs(slots: Iterable[SeedSlot]) -> dict[tuple[str, str], int]:
    """``(entry, profile)`` -> the most parameters a menu entry adds at any of ``slots`` (slots
    whose kind builds its seeds from the host), at the host's current shape.

    An entry that cannot start at a slot's current shape is left out there: a kind's
    ``param_cost`` raises ``ValueError`` for it (a grown layer's quarter is no whole number of
    its GroupNorm's groups; a doubled stream's sizes now coincide in a way a further doubling
    cannot follow), as its G0 would refuse it.
    """
    costs: dict[tuple[str, str], int] = {}
    for slot in slots:
        for entry in slot.kind.menu:
            key = (entry, slot.profile_name)
            try:
                cost = slot.kind.param_cost(slot, entry)
            except ValueError:
                continue
            costs[key] = max(cost, costs.get(key, 0))
    return costs


def built_candidates(slots: Iterable[SeedSlot]) -> tuple[BlueprintCandidate, ...]:
    """Each menu entry of the built slots' kinds, with the profiles that offer it (Tamiyo's
    candidates for those slots; no kernel, so no latency), costed at the slots' current shapes:
    a layer widened or a stream doubled makes the next such seed dearer, and the risk engine's
    parameter budget must see that."""
    slots = list(slots)
    costs = _built_costs(slots)
    offered: dict[str, tuple[SeedKind, set[str]]] = {}
    for slot in slots:
        for entry in slot.kind.menu:
            if (entry, slot.profile_name) in costs:
                offered.setdefault(entry, (slot.kind, set()))[1].add(slot.profile_name)
    return tuple(
        BlueprintCandidate(
            descriptor=kind.describe(entry),
            shape_profiles=frozenset(profiles),
            latency_p95_ms=0.0,
            param_cost=max(costs[(entry, p)] for p in profiles),
            kind=kind.slot_kind,
        )
        for entry, (kind, profiles) in offered.items()
    )


def slot_blueprints(
    config: RunConfig,
    *,
    catalog: KarnCatalog,
    slot_profiles: Mapping[str, ShapeProfile],
    approved: Collection[str],
) -> dict[str, tuple[str, ...]]:
    """The blueprints each slot may germinate: those the recipe lists, or, when it lists none,
    every approved one (safe, or named in ``approved``) whose shape profile fits the slot.

    Raises:
        ValueError: a listed blueprint that fits none of the slots (the message names the
            blueprints that do fit).
        UnknownBlueprintError: a listed id Karn does not know.
        ApprovalRequiredError: a listed non-safe blueprint that ``approved`` does not name.
    """
    if config.blueprints:
        listed = [catalog.get(b) for b in config.blueprints]
        for entry in listed:
            require_approval(entry.descriptor, approved, action="compile")
    else:
        listed = [catalog.get(b) for b in catalog.ids if not needs_approval(catalog.get(b).descriptor) or b in approved]
    fits = {sid: tuple(e.blueprint_id for e in listed if e.supports(p)) for sid, p in slot_profiles.items()}
    shapes = ", ".join(f"{sid} {p.feature_shape} ({p.kind})" for sid, p in slot_profiles.items())
    if config.blueprints:
        misfits = [b for b in config.blueprints if not any(b in bs for bs in fits.values())]
        if misfits:
            would = _fitting(catalog, slot_profiles, approved=approved)
            raise ValueError(
                f"recipe {config.recipe} lists {misfits}, which fit none of its slots: {shapes}; "
                f"blueprints that fit: {would}. Remove {misfits} from RunConfig.blueprints, or leave "
                "blueprints out to use every approved blueprint that fits"
            )
    return fits


def _check_every_slot_fits(config: RunConfig, catalog: KarnCatalog, plan: RunPlan) -> None:
    """A run refuses a slot that none of its blueprints fits (compiling a narrowed list does not)."""
    fits = plan.slot_fits
    slot_profiles = {sid: ShapeProfile.parse(p) for sid, p in plan.slots.items()}
    shapes = ", ".join(f"{sid} {p.feature_shape} ({p.kind})" for sid, p in slot_profiles.items())
    empty = [sid for sid, bs in fits.items() if not bs]
    if empty:
        any_tier = {
            sid: bs for sid, bs in _fitting(catalog, slot_profiles, approved=catalog.ids).items() if sid in empty
        }
        raise ValueError(
            f"no blueprint of recipe {config.recipe} fits slot(s) {empty} ({shapes}); blueprints of any tier "
            f"that fit them: {any_tier}. List one in RunConfig.blueprints (approving a non-safe one with "
            "RunConfig.approved_blueprints), or put the slot on an output of another shape (`esper catalog list`)"
        )


def _fitting(
    catalog: KarnCatalog, slot_profiles: Mapping[str, ShapeProfile], *, approved: Collection[str]
) -> dict[str, list[str]]:
    """Slot -> approved blueprints that fit it (for error messages)."""
    return {
        sid: [
            b
            for b in catalog.ids
            if catalog.get(b).supports(p) and (not needs_approval(catalog.get(b).descriptor) or b in approved)
        ]
        for sid, p in slot_profiles.items()
    }


def _check_schedule_fits(config: RunConfig, fits: Mapping[str, tuple[str, ...]]) -> None:
    for g in config.tamiyo.schedule:
        if g.blueprint not in fits.get(g.slot, ()):
            raise ValueError(
                f"scheduled germination at epoch {g.epoch}: blueprint {g.blueprint!r} does not fit slot "
                f"{g.slot!r}; blueprints that fit it: {list(fits.get(g.slot, ()))}"
            )


def _check_preferred(config: RunConfig, catalog: KarnCatalog) -> None:
    """The heuristic's preferred blueprints must exist and be SAFE (the only tier it germinates):
    a misspelt or experimental entry would otherwise be passed over without a word."""
    for blueprint_id in config.tamiyo.heuristic.prefer:
        if blueprint_id in WIDTH_MENU or blueprint_id in DEPTH_MENU or blueprint_id in STREAM_MENU:
            continue  # every entry of the kinds' menus is SAFE
        if blueprint_id not in catalog.ids:
            known = [*WIDTH_MENU, *DEPTH_MENU, *STREAM_MENU, *catalog.ids]
            raise ValueError(
                f"tamiyo.heuristic.prefer names {blueprint_id!r}, which is neither on a seed kind's menu nor in "
                f"Karn's catalogue; choose from {known}"
            )
        tier = catalog.get(blueprint_id).descriptor.tier
        if tier is not BlueprintTier.SAFE:
            raise ValueError(
                f"tamiyo.heuristic.prefer names {blueprint_id!r}, whose tier is {tier.value}: the heuristic "
                "germinates SAFE blueprints only; drop it from prefer"
            )


def check_recipe(config: RunConfig, *, catalog: KarnCatalog | None = None) -> RunPlan:
    """Plan ``config`` (a recipe resolved by ``get_recipe``) before any flow run starts.

    ``esper recipes show`` and the data-parallel launchers call it so that a slot the model
    cannot take, or a listed blueprint that fits none of the slots, is refused with its fix before
    anything starts (a run's ``esper_core.run.spec.plan_spec`` makes the same checks through
    ``plan_run``). The host is built on the meta device; the data is loaded once per process for
    its shape (``recipe_feature_shape``).

    Returns:
        The compile plan: per slot, its profile and the blueprints that fit it.

    Raises:
        ValueError, ApprovalRequiredError: as ``plan_run``.
    """
    catalog = catalog or default_catalog()
    plan = _plan(
        config,
        catalog=catalog,
        feature_shape=recipe_feature_shape(config.recipe),
        # The class count sizes only a built-in host's classifier, never a slot.
        num_classes=2,
        backend=Backend.EXPORT,
        approved=config.approved_blueprints,
    )
    _check_every_slot_fits(config, catalog, plan)
    return plan
