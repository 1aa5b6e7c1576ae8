"""Models written the way people write them grow end to end from a recipe that names only the
model, the data and the slots (tests/helpers/user_models.py), in a real flow run."""

from __future__ import annotations

import pytest

from esper_core.settings import EsperSettings

pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize(
    ("recipe", "slots"),
    [
        ("cnn", {"features.2", "features.5"}),
        ("transformer", {"encoder.layers.0", "encoder.layers.1"}),
        ("lstm", {"lstm[0]"}),
    ],
)
def test_a_user_model_grows_with_no_blueprint_list(recipe: str, slots: set[str], esper_home: EsperSettings) -> None:
    from flows.morphogenesis import morphogenesis

    # Pinned to the rule: these models offer branch slots only, and the shipped policy (zoo-1) was
    # trained on width slots (docs/zoo.md); what is tested here is the recipe, not who decides.
    summary = morphogenesis(
        recipe=f"tests.helpers.user_models:{recipe}", device="cpu", seed=0, run_id=recipe, policy="heuristic"
    )
    assert summary.commands.get("germinate", 0) >= 1, summary.commands
    assert set(summary.seeds) == slots
    assert any(not stage.startswith("dormant") for stage in summary.seeds.values()), summary.seeds
    assert summary.total_params > summary.host_params
    assert summary.test_accuracy > 0.5
