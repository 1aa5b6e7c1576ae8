"""A run's epochs below the flow: a step that dies anywhere is taken up again from the run's
commits and reproduces the uninterrupted run, in the same object or a new one.

What the morphogenesis flow's retries rely on (``tests/flows/test_morphogenesis_flow.py`` checks
them through Prefect), checked here on ``Run`` and ``grow_epoch`` alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from esper_core.contracts import AdaptationCommand
from esper_core.run import Run, RunSpec, finish_run, grow_epoch
from esper_core.run.commits import epoch_tag
from esper_core.run.steps import EpochReport
from esper_core.settings import EsperSettings

EPOCHS = 3


def _spec(run_id: str) -> RunSpec:
    return RunSpec(recipe="seed-reference", epochs=EPOCHS, device="cpu", seed=1, run_id=run_id)


def _same(report: EpochReport) -> tuple[Any, ...]:
    """An epoch's report without its wall-clock time."""
    return (report.epoch, report.train_loss, report.val_loss, report.val_accuracy, report.seeds, report.action)


def _clean(settings: EsperSettings) -> tuple[list[tuple[Any, ...]], float]:
    run = Run.start(_spec("clean"), settings=settings)
    try:
        reports = [_same(grow_epoch(run, epoch)) for epoch in range(EPOCHS)]
        return reports, finish_run(run).test_loss
    finally:
        run.close()


class Died(RuntimeError):
    """The injected failure of a step."""


def test_an_epoch_that_died_before_its_commit_is_trained_again_identically(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean, clean_loss = _clean(compiled_home)
    train = Run.train_epoch
    fired: list[int] = []

    def dies_once_after_training(self: Run) -> Any:  # noqa: ANN401 - the patched method's packet
        packet = train(self)
        if self.epoch == 2 and not fired:  # epoch 1 trained, not committed
            fired.append(self.epoch)
            raise Died
        return packet

    monkeypatch.setattr(Run, "train_epoch", dies_once_after_training)
    run = Run.start(_spec("died"), settings=compiled_home)
    try:
        reports = [_same(grow_epoch(run, 0))]
        with pytest.raises(Died):
            grow_epoch(run, 1)
        assert run.record.dirty  # the live state ran past its last commit
        reports += [_same(grow_epoch(run, epoch)) for epoch in (1, 2)]
        loss = finish_run(run).test_loss
    finally:
        run.close()
    assert fired == [2] and reports == clean and loss == clean_loss


def test_an_epoch_that_died_after_its_trained_commit_is_not_trained_again(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean, clean_loss = _clean(compiled_home)
    train, apply = Run.train_epoch, Run.apply
    trained: list[int] = []
    fired: list[int] = []

    def counted(self: Run) -> Any:  # noqa: ANN401
        trained.append(self.epoch)
        return train(self)

    def dies_once_before_applying(self: Run, command: AdaptationCommand) -> str:
        if self.epoch == 2 and not fired:  # epoch 1 committed as trained, its decision not applied
            fired.append(self.epoch)
            raise Died
        return apply(self, command)

    monkeypatch.setattr(Run, "train_epoch", counted)
    monkeypatch.setattr(Run, "apply", dies_once_before_applying)
    run = Run.start(_spec("died"), settings=compiled_home)
    try:
        reports = [_same(grow_epoch(run, 0))]
        with pytest.raises(Died):
            grow_epoch(run, 1)
        assert run.checkpoints.latest() == epoch_tag(1, "trained")
        reports += [_same(grow_epoch(run, epoch)) for epoch in (1, 2)]
        loss = finish_run(run).test_loss
    finally:
        run.close()
    assert fired == [2] and trained == [0, 1, 2], "an epoch committed as trained was trained again"
    assert reports == clean and loss == clean_loss


def test_a_run_reopened_by_a_new_object_goes_on_from_its_last_commit(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean, clean_loss = _clean(compiled_home)
    run = Run.start(_spec("reopened"), settings=compiled_home)
    try:
        reports = [_same(grow_epoch(run, 0))]
        with monkeypatch.context() as patch:
            patch.setattr(Run, "apply", lambda self, command: (_ for _ in ()).throw(Died()))
            with pytest.raises(Died):
                grow_epoch(run, 1)  # dies with epoch 1 committed as trained, its decision not applied
    finally:
        run.close()
    # A new process: starting the same spec again reopens the run and rewinds the half-done epoch.
    again = Run.start(_spec("reopened"), settings=compiled_home)
    try:
        assert again.epoch == 1 and again.committed_tag == epoch_tag(0, "applied")
        reports += [_same(grow_epoch(again, epoch)) for epoch in (1, 2)]
        loss = finish_run(again).test_loss
    finally:
        again.close()
    assert reports == clean and loss == clean_loss
    assert RunSpec.load(compiled_home.runs_dir / "reopened") == _spec("reopened")


def test_a_resume_planned_in_its_process_plans_once_and_reproduces_the_run(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``esper run --run-id`` and the flow plan the request before they start the run: reopening it
    takes that plan instead of resolving and planning ``run.json`` a second time."""
    from esper_core.run.spec import resolve
    from tests.helpers.planning import count_planning

    clean, clean_loss = _clean(compiled_home)
    run = Run.start(_spec("resumed"), settings=compiled_home)
    try:
        reports = [_same(grow_epoch(run, 0))]
    finally:
        run.close()
    calls = count_planning(monkeypatch)
    planned = resolve(_spec("resumed"))
    run = Run.start(planned.spec, settings=compiled_home, planned=planned)
    try:
        assert calls == {"resolve": 1, "meta_host": 1}
        assert run.plan is planned.plan and run.epoch == 1
        reports += [_same(grow_epoch(run, epoch)) for epoch in (1, 2)]
        loss = finish_run(run).test_loss
    finally:
        run.close()
    assert reports == clean and loss == clean_loss
    # A plan of another request (here another seed) is not the saved run's: that is planned again.
    other = resolve(dataclasses.replace(_spec("resumed"), seed=2))
    run = Run.resume(settings=compiled_home, run_id="resumed", planned=other)
    try:
        assert run.plan is not other.plan and run.config.seed == 1
    finally:
        run.close()
