"""Runs decided by the shipped policy, pinned to another, falling back loudly, capped."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from esper_core.run import Run, RunSpec, finish_run, grow_epoch
from esper_core.run.reports import RunSummary
from esper_core.run.spec import check_resume, plan_spec
from esper_core.settings import EsperSettings
from esper_core.tamiyo import shipped
from esper_core.tamiyo.config import TamiyoConfig, with_policy
from esper_core.tamiyo.heuristic import HeuristicConfig
from esper_core.tamiyo.risk import RiskConfig
from esper_core.telemetry import read_jsonl
from esper_core.tolaria.flops import forward_flops
from esper_core.tolaria.loop import count_parameters
from tests.helpers.shipped import make_shipped


def _run(settings: EsperSettings, spec: RunSpec) -> RunSummary:
    run = Run.start(spec, settings=settings)
    try:
        for epoch in range(run.epoch, run.config.epochs):
            grow_epoch(run, epoch)
        return finish_run(run)
    finally:
        run.close()


def _events(settings: EsperSettings, run_id: str, name: str) -> list[dict[str, object]]:
    packets = read_jsonl(settings.runs_dir / run_id / "telemetry.jsonl")
    return [{"message": e.message, **e.attributes} for p in packets for e in p.events if e.name == name]


def test_the_rule_decides_by_default_until_a_shipped_policy_is_measured_better() -> None:
    # zoo-1 lost to the heuristic on mnist1d-mlp-width by 1.9 points [-3.2, -0.7] over 8 paired
    # seeds (baselines/zoo/shipped-zoo-1-vs-heuristic): promoting it is a measured decision.
    config = TamiyoConfig()
    assert config.policy == "heuristic" and config.shipped == shipped.DEFAULT_SHIPPED


def test_a_run_pinned_to_the_shipped_policy_is_decided_by_it_and_records_it(
    esper_home: EsperSettings,
) -> None:
    spec = RunSpec(recipe="mnist1d-mlp-width", epochs=3, device="cpu", seed=0, run_id="default", policy="shipped")
    summary = _run(esper_home, spec)
    digest = shipped.SHIPPED[shipped.DEFAULT_SHIPPED]
    assert summary.degraded == () and summary.policy_fallbacks == 0
    assert summary.policy is not None and summary.policy["policy"] == "shipped"
    assert summary.policy["sha256"] == digest and summary.policy["served"].startswith("zoo-1/v")
    commands = _events(esper_home, "default", "tamiyo.command")
    assert commands and all(c["issued_by"].startswith("gnn:zoo-1/v") for c in commands), commands
    # run.json says who decides, before the run starts: a reader need not wait for the summary.
    saved = json.loads((esper_home.runs_dir / "default" / "run.json").read_text())
    heuristic = json.loads(json.dumps(dataclasses.asdict(spec.config().tamiyo.heuristic)))
    risk = json.loads(json.dumps(dataclasses.asdict(spec.config().tamiyo.risk)))
    assert saved["decides"] == {
        "policy": "shipped",
        "served": None,
        "name": "zoo-1",
        "sha256": digest,
        "heuristic": heuristic,
        "risk": risk,
    }


def test_the_shipped_policy_decides_the_same_on_the_same_seed(esper_home: EsperSettings) -> None:
    first, second = (
        _run(
            esper_home,
            RunSpec(recipe="mnist1d-mlp-width", epochs=4, device="cpu", seed=3, run_id=name, policy="shipped"),
        )
        for name in ("first", "second")
    )
    assert first.commands.get("germinate"), first.commands  # it grew: there were decisions to differ
    assert (first.test_accuracy, first.test_loss, first.total_params, first.commands, first.seeds) == (
        second.test_accuracy,
        second.test_loss,
        second.total_params,
        second.commands,
        second.seeds,
    )


def test_a_run_pins_its_policy_and_a_resume_keeps_it(esper_home: EsperSettings) -> None:
    spec = RunSpec(recipe="mnist1d-mlp-width", epochs=2, device="cpu", seed=0, run_id="pinned", policy="heuristic")
    assert spec.config().tamiyo.policy == "heuristic"
    assert RunSpec(recipe="mnist1d-cnn-grown", policy="zoo-1").config().tamiyo.schedule == ()
    summary = _run(esper_home, spec)
    tamiyo = spec.config().tamiyo
    heuristic, risk = dataclasses.asdict(tamiyo.heuristic), dataclasses.asdict(tamiyo.risk)
    assert summary.policy == {"policy": "heuristic", "served": None, "heuristic": heuristic, "risk": risk}
    assert RunSpec.load(esper_home.runs_dir / "pinned").policy == "heuristic"
    with pytest.raises(ValueError, match="policy must be one of"):
        RunSpec(recipe="mnist1d-mlp-width", policy="zoo-99")


def test_a_run_pins_one_simic_version_by_number() -> None:
    tamiyo = RunSpec(recipe="mnist1d-cnn-grown", policy="gnn:3").config().tamiyo
    assert (tamiyo.policy, tamiyo.policy_version, tamiyo.schedule) == ("gnn", 3, ())
    for bad in ("gnn:0", "gnn:x", "gnn:", "gnn:\u00b2", "gnn:01"):
        with pytest.raises(ValueError, match="gnn:<N> with a Simic version N >= 1"):
            RunSpec(recipe="mnist1d-cnn-grown", policy=bad)
    # Any other pin drops the version: plain `gnn` serves the newest.
    assert with_policy(tamiyo, "gnn").policy_version is None
    assert with_policy(tamiyo, "heuristic").policy_version is None


def test_a_rule_that_opens_growth_where_the_risk_engine_closes_it_is_refused() -> None:
    with pytest.raises(ValueError, match="grow_from=0.5 opens growth at or after risk.grow_until=0.5"):
        TamiyoConfig(heuristic=HeuristicConfig(grow_from=0.5), risk=RiskConfig(grow_until=0.5))


def test_a_run_is_not_resumed_by_a_controller_whose_defaults_changed_since_it_started(
    esper_home: EsperSettings,
) -> None:
    spec = RunSpec(recipe="digits-mlp", epochs=2, device="cpu", seed=0, run_id="older", policy="heuristic")
    run = Run.start(spec, settings=esper_home)
    grow_epoch(run, 0)
    run.close()
    path = esper_home.runs_dir / "older" / "run.json"
    fields = json.loads(path.read_text())
    probe = fields["decides"]["heuristic"]["probe_epoch"]
    assert probe == spec.config().tamiyo.heuristic.probe_epoch
    # As a version whose default probe came an epoch later would have recorded it.
    fields["decides"]["heuristic"]["probe_epoch"] = probe + 1
    path.write_text(json.dumps(fields))
    with pytest.raises(
        ValueError, match=rf"older was decided by heuristic=.*'probe_epoch': {probe + 1}.*now resolves to heuristic="
    ):
        Run.resume(settings=esper_home, run_id="older")
    with pytest.raises(ValueError, match="older was decided by heuristic="):
        # ``esper run --run-id`` checks it before any work, on the request it planned.
        check_resume(
            path.parent, plan_spec("digits-mlp", epochs=2, device="cpu", seed=0, run_id="older", policy="heuristic")
        )
    # A threshold a later version added (here: one the record lacks) refuses nothing.
    fields["decides"]["heuristic"]["probe_epoch"] = probe
    del fields["decides"]["heuristic"]["prefer"]
    path.write_text(json.dumps(fields))
    check_resume(
        path.parent, plan_spec("digits-mlp", epochs=2, device="cpu", seed=0, run_id="older", policy="heuristic")
    )
    # A run.json from before the thresholds were recorded resumes as ever.
    del fields["decides"]["heuristic"]
    path.write_text(json.dumps(fields))
    resumed = Run.resume(settings=esper_home, run_id="older")
    assert resumed.epoch == 1
    resumed.close()


def test_a_run_whose_shipped_policy_cannot_serve_is_decided_by_the_rule_and_degraded(
    esper_home: EsperSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_shipped(tmp_path / "policies", monkeypatch)
    (tmp_path / "policies" / "zoo-1.pt").write_bytes(b"not the released weights")
    spec = RunSpec(recipe="mnist1d-mlp-width", epochs=3, device="cpu", seed=0, run_id="fell", policy="shipped")
    summary = _run(esper_home, spec)
    assert summary.policy is not None and summary.policy["served"] is None
    assert summary.policy_fallbacks == 3
    assert len(summary.degraded) == 1 and "heuristic because shipped policy 'zoo-1' cannot serve" in summary.degraded[0]
    assert "refusing to serve" in summary.degraded[0]
    commands = _events(esper_home, "fell", "tamiyo.command")
    assert all(c["issued_by"] != "gnn" and not str(c["issued_by"]).startswith("gnn:") for c in commands), commands
    assert "**Degraded:**" in (esper_home.runs_dir / "fell" / "report.md").read_text()


def test_a_growth_cap_refuses_the_germination_that_would_pass_it(esper_home: EsperSettings) -> None:
    # mnist1d-cnn-grown doubles conv1 after epoch 1 and conv3 after epoch 3 (a fixed schedule,
    # so the test does not depend on any policy's choice); five epochs, so the second has an
    # epoch left to train it (no germination comes after a run's last epoch).
    config = RunSpec(recipe="mnist1d-cnn-grown").config()
    host = config.host.build()  # type: ignore[union-attr]
    cap = count_parameters(host)
    capped = _run(
        esper_home, RunSpec(recipe="mnist1d-cnn-grown", epochs=5, device="cpu", seed=0, run_id="capped", max_params=cap)
    )
    free = _run(esper_home, RunSpec(recipe="mnist1d-cnn-grown", epochs=5, device="cpu", seed=0, run_id="free"))
    assert free.total_params > cap  # the germination the cap refuses does grow the network
    assert capped.total_params == cap
    rejected = _events(esper_home, "capped", "kasmina.command.rejected")
    assert [r["slot_id"] for r in rejected] == ["conv1+width", "conv3+width"], rejected
    assert all("growth cap" in str(r["message"]) for r in rejected)
    assert all(stage.startswith("dormant") for stage in capped.seeds.values()), capped.seeds
    with pytest.raises(ValueError, match="max_params must be a positive"):
        RunSpec(recipe="mnist1d-cnn-grown", max_params=0)


def test_a_compute_cap_refuses_the_germination_that_would_pass_it(esper_home: EsperSettings) -> None:
    # The same fixed schedule, capped at the host's own forward FLOPs a sample: doubling conv1
    # passes it; the run stays at the host's cost and says why.
    config = RunSpec(recipe="mnist1d-cnn-grown").config()
    host = config.host.build()  # type: ignore[union-attr]
    signal_length = 40  # MNIST-1D's signals
    cap = forward_flops(host, torch.zeros(1, signal_length))
    spec = RunSpec(recipe="mnist1d-cnn-grown", epochs=5, device="cpu", seed=0, run_id="flops", max_flops=cap)
    capped = _run(esper_home, spec)
    rejected = _events(esper_home, "flops", "kasmina.command.rejected")
    assert [r["slot_id"] for r in rejected] == ["conv1+width", "conv3+width"], rejected
    assert all("FLOPs a sample" in str(r["message"]) and "--max-flops" in str(r["message"]) for r in rejected)
    assert all(stage.startswith("dormant") for stage in capped.seeds.values()), capped.seeds
    assert capped.total_params == count_parameters(host)


def test_a_growth_window_vetoes_the_germination_after_it(esper_home: EsperSettings) -> None:
    # The same fixed schedule (germinations after epochs 1 and 3), growth stopping at half of five
    # epochs (from epoch ceil(2.5) = 3 on): the first germination goes ahead, the second is vetoed.
    spec = RunSpec(recipe="mnist1d-cnn-grown", epochs=5, device="cpu", seed=0, run_id="window", grow_until=0.5)
    windowed = _run(esper_home, spec)
    vetoed = [c for c in _events(esper_home, "window", "tamiyo.command") if c["risk_rule"] == "growth_window"]
    assert len(vetoed) == 1 and "epoch 3 >= 3: growth stops at grow_until=0.5" in str(vetoed[0]["message"]), vetoed
    assert windowed.commands.get("germinate") == 1, windowed.commands
    assert windowed.seeds["conv3+width"].startswith("dormant"), windowed.seeds
    assert not windowed.seeds["conv1+width"].startswith("dormant"), windowed.seeds
