"""What Tamiyo may germinate in a run: the plan's blueprints with a kernel in the registry, and
Karn's width menu when the host has width slots (built from the host, no kernel needed)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from esper_core.karn.catalog import KarnCatalog
from esper_core.run.plan import RunPlan
from esper_core.tamiyo.candidates import BlueprintCandidate
from esper_core.tezzeret.compiler import environment_key
from esper_core.urza.service import Urza


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelLookup:
    """The branch blueprints with an active kernel, and what looking them up cost.

    Attributes:
        candidates: One per blueprint with a kernel for at least one of the run's profiles.
        lookup_ms: Mean time of one registry lookup of an active artifact.
    """

    candidates: list[BlueprintCandidate]
    lookup_ms: float


def kernel_candidates(*, plan: RunPlan, catalog: KarnCatalog, urza: Urza, device: torch.device) -> KernelLookup:
    """The plan's blueprints with an active artifact for at least one slot profile.

    Raises:
        RegistryUnavailableError: the registry's database cannot be reached.
    """
    env = environment_key(device)
    out = []
    lookup_s, lookups = 0.0, 0
    for blueprint_id in plan.blueprints:
        start = time.perf_counter()
        # With the catalogue's parameters (which carry the blueprint's version), never an
        # artifact of an older version of the blueprint still in the registry.
        params = catalog.resolve_params(blueprint_id)
        found = {p: urza.store.find_active(blueprint_id, p, env, params) for p in plan.profiles}
        lookup_s += time.perf_counter() - start
        lookups += len(found)
        present = {p: a for p, a in found.items() if a is not None}
        if not present:
            continue
        p95 = max((s.p95_ms for a in present.values() for s in a.latency.values()), default=0.0)
        out.append(
            BlueprintCandidate(
                descriptor=catalog.get(blueprint_id).descriptor,
                shape_profiles=frozenset(present),
                latency_p95_ms=p95,
                param_cost=plan.param_costs[(blueprint_id, next(iter(present)))],
                capacity=plan.candidate_capacity(blueprint_id, present),
            )
        )
    return KernelLookup(candidates=out, lookup_ms=lookup_s * 1e3 / max(lookups, 1))
