"""A run whose growth the registry blocked finishes, but says so: in its summary, its report, the
exit code of ``esper run`` and its Prefect state (issue 37, item 3)."""

from __future__ import annotations

import json

import pytest

from esper_core.settings import EsperSettings
from esper_core.urza.service import Urza


def _corrupt_every_blob(settings: EsperSettings) -> int:
    """Flip one byte in the middle of every kernel blob in the registry; returns how many."""
    urza = Urza.open(settings.home)
    try:
        paths = {urza.blobs.path(a.sha256) for a in urza.store.list_artifacts()}
    finally:
        urza.close()
    for path in paths:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    return len(paths)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_run_that_could_not_grow_ends_degraded_and_says_why(compiled_home: EsperSettings) -> None:
    from flows.morphogenesis import morphogenesis

    assert _corrupt_every_blob(compiled_home) > 0
    # seed-reference's heuristic germinates after epoch 1 (baselines/golden): the kernel is refused.
    # Pinned to the rule: this is about a kernel the registry cannot give, not about who decides.
    state = morphogenesis(
        recipe="seed-reference", epochs=3, device="cpu", seed=0, run_id="blocked", policy="heuristic", return_state=True
    )
    summary = state.result()
    assert state.is_completed() and state.name == "Degraded", state
    assert summary.growth_blocked >= 1 and "registry could not give a kernel" in (state.message or "")
    assert all(stage.startswith("dormant") for stage in summary.seeds.values())  # it never grew
    saved = json.loads((compiled_home.runs_dir / "blocked" / "summary.json").read_text())
    assert saved["degraded"] == list(summary.degraded) and "esper registry verify" in saved["degraded"][0]
    assert "**Degraded:**" in (compiled_home.runs_dir / "blocked" / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_healthy_run_is_completed_not_degraded(compiled_home: EsperSettings) -> None:
    from flows.morphogenesis import morphogenesis

    state = morphogenesis(
        recipe="seed-reference", epochs=3, device="cpu", seed=0, run_id="healthy", policy="heuristic", return_state=True
    )
    summary = state.result()
    assert state.name == "Completed" and summary.degraded == () and summary.growth_blocked == 0
    assert any(not stage.startswith("dormant") for stage in summary.seeds.values()), summary.seeds
