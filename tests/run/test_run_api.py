"""The library's way to run without Prefect, as ``esper_core.run``'s docstring shows it."""

from __future__ import annotations

from esper_core.run import Run, RunSpec, finish_run, grow_epoch, publish_missing_kernels
from esper_core.run.commits import START_TAG
from esper_core.settings import EsperSettings


def test_a_notebook_starts_steps_finishes_and_resumes_a_run(esper_home: EsperSettings) -> None:
    spec = RunSpec(recipe="seed-reference", epochs=3, device="cpu", seed=0, run_id="notebook")
    publish_missing_kernels(esper_home, [spec.config()], device="cpu")  # an empty registry first
    run = Run.start(spec, settings=esper_home)
    try:
        reports = [grow_epoch(run, epoch) for epoch in range(run.epoch, 2)]
    finally:
        run.close()
    assert [r.epoch for r in reports] == [0, 1]
    # A new process (here: a new object) goes on from the run folder's last commit.
    resumed = Run.resume(settings=esper_home, run_id="notebook")
    try:
        assert resumed.epoch == 2 and len(resumed.history) == 2
        reports.append(grow_epoch(resumed, resumed.epoch))
        summary = finish_run(resumed)
    finally:
        resumed.close()
    assert summary.epochs == 3 and summary.run_id == "notebook"
    assert RunSpec.load(esper_home.runs_dir / "notebook") == spec


def test_a_configuration_built_in_code_starts_a_new_run_without_a_run_json(esper_home: EsperSettings) -> None:
    config = RunSpec(recipe="seed-reference", epochs=2, device="cpu", seed=0).config()
    run = Run.start(config, settings=esper_home, run_id="in-code")
    try:
        assert run.config is config and run.epoch == 0 and run.committed_tag == START_TAG
    finally:
        run.close()
    # Nothing to resume from: a study's episode or a rank keeps no request of its own.
    assert (esper_home.runs_dir / "in-code" / "checkpoints").is_dir()
    assert not (esper_home.runs_dir / "in-code" / "run.json").exists()
