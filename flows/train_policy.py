"""train_policy: Simic trains Tamiyo's GNN: demonstrations (the heuristic's or a searched schedule's),
imitation, then PPO."""

from __future__ import annotations

from prefect import flow

from esper_core._capabilities import Device
from esper_core.run.recipes import RecipeRef
from esper_core.studies.simic_train import PlanName, get_plan
from tasks.policy import collect, demonstrate, imitate_policy, improve_policy


@flow(name="train_policy", log_prints=True)
def train_policy(recipes: list[RecipeRef] | None = None, plan: PlanName = "default", device: Device = "cpu") -> int:
    """Train a policy version on ``recipes`` and publish every stage to the registry.

    Running Tamiyos with ``policy="gnn"`` pick the newest version up between epochs.

    Args:
        recipes: Recipes whose episodes it learns from (default: ``digits-mlp``).
        plan: Named training plan (``default``, ``smoke``, ``counterfactual``, ``varied``,
            ``counterfactual-varied``, ``search``, ``search-smoke``): episodes, iterations, sizes,
            reward, whether each episode draws its own task, and who demonstrates (the heuristic,
            or the best fixed schedule a search finds).
        device: ``cpu`` or ``cuda`` for the episodes.

    Returns:
        The final policy version.
    """
    recipes = recipes or ["digits-mlp"]
    p = get_plan(plan)
    demonstrations = [run_id for recipe in recipes for run_id in demonstrate(recipe, plan, device=device)]
    version = imitate_policy(demonstrations, plan)
    for iteration in range(p.iterations):
        rollouts = [
            run_id
            for recipe in recipes
            for run_id in collect(
                recipe, plan, "gnn", p.seeds("rollouts", iteration), explore=True, policy_version=version, device=device
            )
        ]
        version = improve_policy(version, rollouts, demonstrations, plan)
    print(f"Tamiyo policy v{version} trained on {recipes} ({plan} plan)")
    return version
