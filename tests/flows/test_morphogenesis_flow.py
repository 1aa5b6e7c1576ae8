"""Real Prefect flow runs under one session-wide test harness."""

from __future__ import annotations

import json

import pytest

from esper_core.contracts import ArtifactKind
from esper_core.session import RunSession
from esper_core.settings import EsperSettings
from esper_core.telemetry import read_jsonl
from esper_core.urza.service import Urza

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def test_morphogenesis_compiles_trains_and_grows(esper_home: EsperSettings) -> None:
    from flows.morphogenesis import morphogenesis

    summary = morphogenesis(recipe="seed-reference", epochs=3, device="cpu", seed=0, run_id="flow")
    run_dir = esper_home.runs_dir / "flow"
    assert summary.epochs == 3 and summary.run_dir == str(run_dir)
    assert any(not stage.startswith("dormant") for stage in summary.seeds.values())
    for name in ("summary.json", "telemetry.jsonl", "baseline.json", "report.md"):
        assert (run_dir / name).exists(), name
    urza = Urza.open(esper_home.home)
    artifacts = urza.store.list_artifacts()
    urza.close()
    assert artifacts and all(a.kind is ArtifactKind.EXPORTED for a in artifacts), [a.fallback_reason for a in artifacts]
    assert json.loads((run_dir / "summary.json").read_text())["run_id"] == "flow"
    assert (run_dir / "curves.png").read_bytes().startswith(b"\x89PNG")


def test_run_artifacts_show_curves_with_seed_events_and_a_seed_table(compiled_home: EsperSettings) -> None:
    from prefect.client.orchestration import get_client

    from flows.morphogenesis import morphogenesis

    summary = morphogenesis(recipe="seed-reference", epochs=4, device="cpu", seed=0)
    assert summary.run_id.endswith(tuple("0123456789abcdef"))  # named after the flow run
    with get_client(sync_client=True) as client:
        latest = {a.key: a for a in sorted(client.read_artifacts(), key=lambda a: a.created)}
    curves, seeds, report = (latest[f"seed-reference-{k}"] for k in ("curves", "seeds", "report"))
    assert curves.type == "image" and str(curves.data).startswith("data:image/png;base64,")
    assert "![loss and accuracy](data:image/png;base64," in str(report.data)
    rows = json.loads(seeds.data) if isinstance(seeds.data, str) else seeds.data
    assert [r["slot"] for r in rows] == list(summary.seeds) and all(r["stages"] for r in rows), rows


def test_retried_epoch_task_reproduces_the_run(compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.morphogenesis import morphogenesis

    clean = morphogenesis(recipe="seed-reference", epochs=3, device="cpu", seed=1, run_id="clean")

    original = RunSession.train_epoch
    failed = []

    def flaky(self: RunSession):
        packet = original(self)
        if self.epoch == 2 and not failed:  # die after training, before the commit
            failed.append(True)
            raise RuntimeError("injected worker failure")
        return packet

    monkeypatch.setattr(RunSession, "train_epoch", flaky)
    retried = morphogenesis(recipe="seed-reference", epochs=3, device="cpu", seed=1, run_id="retried")
    assert failed, "the injected failure never fired"
    assert retried.test_loss == clean.test_loss and retried.seeds == clean.seeds
    packets = read_jsonl(compiled_home.runs_dir / "retried" / "telemetry.jsonl")
    assert [p.epoch for p in packets if p.source == "tolaria"] == [0, 1, 2]


def test_compile_catalog_reuses_published_kernels(compiled_home: EsperSettings) -> None:
    from flows.compile_catalog import compile_catalog

    first = compile_catalog(recipe="seed-reference", device="cpu")
    again = compile_catalog(recipe="seed-reference", device="cpu")
    assert [a.artifact_id for a in first] == [a.artifact_id for a in again]
    assert all(a.version == 1 for a in again)
