"""The control loop without Prefect: Tolaria trains, Tamiyo decides, Kasmina applies, commits."""

from __future__ import annotations

import json

import pytest

from esper_core.contracts import CommandType, SeedStage
from esper_core.run.commits import START_TAG, epoch_tag
from esper_core.run.reports import finish_run
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings
from esper_core.telemetry import read_jsonl


def _loop(session: Run, epochs: int) -> list:
    commands = []
    for epoch in range(session.epoch, epochs):
        session.train_epoch()
        session.commit(epoch_tag(epoch, "trained"))
        command = session.decide()
        session.apply(command)
        session.commit(epoch_tag(epoch, "applied"))
        commands.append(command)
    return commands


def test_digits_run_grows_a_seed_and_writes_every_output(compiled_home: EsperSettings) -> None:
    session = Run.start(
        RunSpec(recipe="digits-mlp", epochs=4, device=None, run_id="loop", policy="heuristic"), settings=compiled_home
    )
    commands = _loop(session, 4)
    germinate = [c for c in commands if c.action == "germinate"]
    assert germinate and germinate[0].issued_by == "heuristic" and germinate[0].reason
    assert any(s.stage is not SeedStage.DORMANT for s in session.history[-1].seeds)
    summary = finish_run(session)
    session.close()
    run_dir = compiled_home.runs_dir / "loop"
    assert json.loads((run_dir / "summary.json").read_text())["test_accuracy"] == summary.test_accuracy
    packets = read_jsonl(run_dir / "telemetry.jsonl")
    assert {p.source for p in packets} == {"tolaria", "tamiyo", "kasmina"}
    assert sum(1 for p in packets if p.source == "tolaria") == 4  # one per epoch, none twice
    baseline = json.loads((run_dir / "baseline.json").read_text())
    assert baseline["latency"]["train_epoch"]["samples"] == 4
    assert "| epoch |" in (run_dir / "report.md").read_text()


def test_a_retried_step_restores_and_reproduces(compiled_home: EsperSettings) -> None:
    session = Run.start(RunSpec(recipe="seed-reference", epochs=3, device=None, run_id="retry"), settings=compiled_home)
    _loop(session, 2)
    committed = epoch_tag(1, "applied")
    first = session.train_epoch()  # then the task "dies" before committing
    session.ensure_at(committed)
    assert session.epoch == 2 and len(session.history) == 2
    again = session.train_epoch()
    assert again == first.model_copy(update={"timestamp": again.timestamp, "epoch_latency_ms": again.epoch_latency_ms})
    session.commit(epoch_tag(2, "trained"))
    packets = read_jsonl(compiled_home.runs_dir / "retry" / "telemetry.jsonl")
    assert [p.epoch for p in packets if p.source == "tolaria"] == [0, 1, 2]
    session.close()


def test_reopening_a_run_resumes_after_the_last_applied_epoch(compiled_home: EsperSettings) -> None:
    session = Run.start(
        RunSpec(recipe="seed-reference", epochs=3, device=None, run_id="resume"), settings=compiled_home
    )
    _loop(session, 1)
    session.train_epoch()
    session.commit(epoch_tag(1, "trained"))  # crashed before epoch 1's decision was applied
    session.close()
    reopened = Run.start(RunSpec(recipe="seed-reference", device=None, run_id="resume"), settings=compiled_home)
    assert reopened.committed_tag == epoch_tag(0, "applied") and reopened.epoch == 1
    reopened.close()


def test_unknown_recipe_and_missing_run_errors(compiled_home: EsperSettings) -> None:
    with pytest.raises(ValueError, match="unknown recipe 'nope'; choose one of"):
        Run.start(RunSpec(recipe="nope", device=None), settings=compiled_home)
    with pytest.raises(ValueError, match="no run 'ghost'"):
        Run.resume(settings=compiled_home, run_id="ghost")


def test_germinating_without_a_published_kernel_is_rejected_not_fatal(esper_home: EsperSettings) -> None:
    # Pinned to the rule, whose WAIT says why (no candidate); the GNN's reason is its numbers.
    spec = RunSpec(recipe="seed-reference", epochs=2, device=None, run_id="empty", policy="heuristic")
    session = Run.start(spec, settings=esper_home)
    assert session.committed_tag == START_TAG
    _loop(session, 2)
    assert session.control.candidates() == []
    waits = [c for c in session.commands if c.command_type is CommandType.WAIT]
    assert len(waits) == 2 and "no" in waits[-1].reason.lower()
    session.close()


@pytest.mark.slow
def test_same_recipe_and_seed_give_identical_runs(compiled_home: EsperSettings) -> None:
    # The first run measures eager vs compiled (real Inductor) and caches the choice; the second
    # reuses it. Both switch at the same step, so their losses agree exactly.
    losses = []
    for run_id in ("first", "second"):
        session = Run.start(
            RunSpec(recipe="seed-reference", epochs=5, device=None, run_id=run_id), settings=compiled_home
        )
        _loop(session, 5)
        losses.append([p.train_loss for p in session.history])
        session.close()
    assert losses[0] == losses[1]
