"""Real Prefect flow runs under one session-wide test harness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esper_core.contracts import ArtifactKind
from esper_core.run.session import Run
from esper_core.settings import EsperSettings
from esper_core.telemetry import read_jsonl
from esper_core.urza.service import Urza
from tests.helpers.planning import count_planning
from tests.helpers.waiting import poll

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


def test_a_run_resolves_its_recipe_and_plans_its_host_once(
    esper_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.morphogenesis import morphogenesis

    calls = count_planning(monkeypatch)
    # An empty registry: the readiness check, the compile subflow and the session all run.
    summary = morphogenesis(recipe="seed-reference", epochs=1, device="cpu", seed=0, run_id="once")
    assert summary.epochs == 1
    urza = Urza.open(esper_home.home)
    assert urza.store.list_artifacts(), "the compile subflow never ran"
    urza.close()
    # The recipe's function ran once: the compile and the session took the plan-run task's plan.
    assert calls == {"resolve": 1, "meta_host": 1}


def test_morphogenesis_trains_one_run_on_two_processes(esper_home: EsperSettings) -> None:
    from flows.morphogenesis import morphogenesis

    state = morphogenesis(
        recipe="tests.helpers.user_models:mlp_widen_long",
        epochs=3,
        device="cpu",
        run_id="dp",
        nproc=2,
        return_state=True,
    )
    summary = state.result()
    assert (summary.epochs, summary.processes, summary.batch_per_process) == (3, 2, (32, 32))
    assert summary.seeds == {"fc2+width": "blending (width)"}  # widened after epoch 0, on both ranks
    session = Run.resume(settings=esper_home, run_id="dp")
    assert [c.action for c in session.commands] == ["germinate", "wait", "wait"]
    session.close()
    with pytest.raises(ValueError, match="cannot be shared by 65 processes"):
        morphogenesis(recipe="tests.helpers.user_models:mlp_widen_long", epochs=3, device="cpu", nproc=65)


def test_run_artifacts_show_curves_with_seed_events_and_a_seed_table(compiled_home: EsperSettings) -> None:
    from prefect.client.orchestration import get_client

    from flows.morphogenesis import morphogenesis

    summary = morphogenesis(recipe="seed-reference", epochs=4, device="cpu", seed=0)
    assert summary.run_id.endswith(tuple("0123456789abcdef"))  # named after the flow run
    with get_client(sync_client=True) as client:
        latest = {a.key: a for a in sorted(client.read_artifacts(), key=lambda a: a.created)}
    curves, seeds, report = (latest[f"seed-reference-{k}"] for k in ("curves", "seeds", "report"))
    assert curves.type == "image" and str(curves.data).startswith("data:image/png;base64,")
    # Uploaded from a background thread, yet filed under the task and flow run that made them.
    assert len({(a.flow_run_id, a.task_run_id) for a in (curves, seeds, report)}) == 1 and curves.task_run_id
    # The report names the curves artifact instead of uploading the same PNG a second time.
    assert "artifact `seed-reference-curves`" in str(report.data) and "base64" not in str(report.data)
    rows = json.loads(seeds.data) if isinstance(seeds.data, str) else seeds.data
    assert [r["slot"] for r in rows] == list(summary.seeds) and all(r["stages"] for r in rows), rows


def test_retried_grow_task_reproduces_the_run(compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.morphogenesis import morphogenesis

    clean = morphogenesis(recipe="seed-reference", epochs=3, device="cpu", seed=1, run_id="clean")

    original = Run.train_epoch
    failed = []

    def flaky(self: Run):
        packet = original(self)
        if self.epoch == 2 and not failed:  # die after training, before the commit
            failed.append(True)
            raise RuntimeError("injected worker failure")
        return packet

    monkeypatch.setattr(Run, "train_epoch", flaky)
    retried = morphogenesis(recipe="seed-reference", epochs=3, device="cpu", seed=1, run_id="retried")
    assert failed, "the injected failure never fired"
    assert retried.test_loss == clean.test_loss and retried.seeds == clean.seeds
    packets = read_jsonl(compiled_home.runs_dir / "retried" / "telemetry.jsonl")
    assert [p.epoch for p in packets if p.source == "tolaria"] == [0, 1, 2]


def test_a_resume_refused_as_bad_input_fails_at_once(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose controller changed since it started is refused (a ``ValueError``) by ``start-run``
    in one process and by ``grow-parallel`` on two, once each: a retry would be refused again."""
    from esper_core.run import ranks
    from esper_core.run import session as sessions
    from esper_core.run.config import RunConfig
    from esper_core.run.spec import RunSpec, check_same_controller
    from flows.morphogenesis import morphogenesis

    Run.start(
        RunSpec(recipe="seed-reference", epochs=2, device="cpu", seed=0, run_id="older"), settings=compiled_home
    ).close()
    path = compiled_home.runs_dir / "older" / "run.json"
    fields = json.loads(path.read_text())
    fields["decides"]["heuristic"]["probe_epoch"] += 1  # as a version with another default recorded it
    path.write_text(json.dumps(fields))
    checks: list[str] = []

    def counted(run_dir: Path, config: RunConfig) -> None:
        checks.append(run_dir.name)
        check_same_controller(run_dir, config)

    monkeypatch.setattr(sessions, "check_same_controller", counted)
    monkeypatch.setattr(ranks, "check_same_controller", counted)
    for nproc in (1, 2):
        checks.clear()
        with pytest.raises(ValueError, match="older was decided by heuristic="):
            morphogenesis(recipe="seed-reference", epochs=2, device="cpu", seed=0, run_id="older", nproc=nproc)
        assert checks == ["older"], f"nproc={nproc}: the refusal was retried"


def _grow_task_runs(flow_run_id: object, expected: int) -> int:
    """How many ``grow`` task runs the server recorded for a flow run (recorded from events, so it may lag)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    run_filter = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    with get_client(sync_client=True) as client:
        return poll(
            lambda: sum(
                1 for r in client.read_task_runs(flow_run_filter=run_filter) if r.name.startswith("grow-from-epoch-")
            ),
            lambda grows: grows >= expected,
            timeout_s=30,
            interval_s=0.2,
        )


def test_grow_tasks_group_epochs_without_changing_the_run(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.morphogenesis import morphogenesis

    args = {"recipe": "seed-reference", "epochs": 3, "device": "cpu", "seed": 2}
    monkeypatch.setenv("ESPER_GROW_TASK_SECONDS", "0")
    each = morphogenesis(**args, run_id="each", return_state=True)
    monkeypatch.setenv("ESPER_GROW_TASK_SECONDS", "3600")
    grouped = morphogenesis(**args, run_id="grouped", return_state=True)
    assert _grow_task_runs(each.state_details.flow_run_id, 3) == 3  # one task per epoch
    assert _grow_task_runs(grouped.state_details.flow_run_id, 1) == 1  # one task for the run
    a, b = each.result(), grouped.result()
    assert (a.test_loss, a.seeds) == (b.test_loss, b.seeds)


def test_retried_grow_task_skips_the_epochs_it_applied(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.morphogenesis import morphogenesis

    monkeypatch.setenv("ESPER_GROW_TASK_SECONDS", "3600")  # one task runs all three epochs
    args = {"recipe": "seed-reference", "epochs": 3, "device": "cpu", "seed": 1}
    clean = morphogenesis(**args, run_id="clean")

    trained: list[int] = []
    fired: list[bool] = []
    train, apply = Run.train_epoch, Run.apply

    def counted(self: Run):
        trained.append(self.epoch)
        return train(self)

    def flaky(self: Run, command):
        if self.epoch == 3 and not fired:  # epoch 2 trained and committed, its command not applied yet
            fired.append(True)
            raise RuntimeError("injected worker failure")
        return apply(self, command)

    monkeypatch.setattr(Run, "train_epoch", counted)
    monkeypatch.setattr(Run, "apply", flaky)
    retried = morphogenesis(**args, run_id="retried")
    assert fired, "the injected failure never fired"
    assert trained == [0, 1, 2], "the retry trained an epoch again"
    assert (retried.test_loss, retried.seeds) == (clean.test_loss, clean.seeds)
    packets = read_jsonl(compiled_home.runs_dir / "retried" / "telemetry.jsonl")
    for source in ("tolaria", "tamiyo"):
        assert [p.epoch for p in packets if p.source == source] == [0, 1, 2], source


def test_negative_grow_task_seconds_is_refused_naming_the_setting(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic import ValidationError

    from flows.morphogenesis import morphogenesis

    monkeypatch.setenv("ESPER_GROW_TASK_SECONDS", "-1")
    with pytest.raises(ValidationError, match="grow_task_seconds"):
        morphogenesis(recipe="seed-reference", epochs=1, device="cpu")


def test_compile_catalog_reuses_published_kernels(compiled_home: EsperSettings) -> None:
    from flows.compile_catalog import compile_catalog

    first = compile_catalog(recipe="seed-reference", device="cpu")
    again = compile_catalog(recipe="seed-reference", device="cpu")
    assert [a.artifact_id for a in first] == [a.artifact_id for a in again]
    assert all(a.version == 1 for a in again)
