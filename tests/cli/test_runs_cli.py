"""``esper runs list|show|verify``: the runs in ESPER_HOME and whether their checkpoints are intact."""

from __future__ import annotations

import json
import shutil

import pytest

from esper_cli.main import main
from esper_core.run import Run, RunSpec, finish_run, grow_epoch
from esper_core.run.commits import epoch_tag
from esper_core.run.recipes import get_recipe
from esper_core.settings import EsperSettings
from tests.helpers.checkpoints import flip


@pytest.fixture
def two_runs(compiled_home: EsperSettings) -> EsperSettings:
    """``done``: 2 epochs of 2, finished; ``half``: 1 epoch of 2."""
    for run_id, epochs in (("done", 2), ("half", 1)):
        run = Run.start(
            RunSpec(recipe="seed-reference", epochs=2, device="cpu", seed=1, run_id=run_id), settings=compiled_home
        )
        try:
            for epoch in range(epochs):
                grow_epoch(run, epoch)
            if epochs == 2:
                finish_run(run)
        finally:
            run.close()
    return compiled_home


def test_runs_list_shows_each_runs_progress(two_runs: EsperSettings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "list", "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["done"]["status"] == "finished" and rows["done"]["epochs_done"] == 2
    assert rows["half"]["status"] == "unfinished" and rows["half"]["last_commit"] == epoch_tag(0, "applied")
    assert main(["runs", "list"]) == 0
    out = capsys.readouterr().out
    assert "seed-reference" in out and "1/2" in out and "2/2" in out


def test_runs_list_reads_the_recipes_epoch_count_from_run_json_or_else_the_recipe(
    esper_home: EsperSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that leaves its epochs to its recipe: ``run.json`` records the count resolved
    (``total_epochs``); a folder written before it did is resolved from its recipe."""
    run = Run.start(RunSpec(recipe="seed-reference", device="cpu", run_id="new"), settings=esper_home)
    try:
        grow_epoch(run, 0)
    finally:
        run.close()
    epochs = get_recipe("seed-reference").epochs
    saved = json.loads((esper_home.runs_dir / "new" / "run.json").read_text())
    assert saved["epochs"] is None and saved["total_epochs"] == epochs
    old = esper_home.runs_dir / "old"
    shutil.copytree(esper_home.runs_dir / "new", old)
    del saved["total_epochs"]
    (old / "run.json").write_text(json.dumps(saved | {"run_id": "old"}))
    assert main(["runs", "list", "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert {run_id: (r["epochs_done"], r["epochs"]) for run_id, r in rows.items()} == {
        "new": (1, epochs),
        "old": (1, epochs),
    }


def test_runs_list_on_an_empty_home(esper_home: EsperSettings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "list"]) == 0
    assert "no runs under" in capsys.readouterr().out


def test_runs_verify_exit_codes(two_runs: EsperSettings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "verify", "done"]) == 0
    assert "intact" in capsys.readouterr().out
    damaged = two_runs.runs_dir / "done" / "checkpoints" / f"{epoch_tag(1, 'applied')}.pt"
    flip(damaged)
    assert main(["runs", "verify", "done"]) == 1
    err = capsys.readouterr().err
    assert f"damaged: {damaged}" in err and "esper run --run-id done" in err
    assert main(["runs", "verify", "half"]) == 0  # the other run is untouched
    assert main(["runs", "verify", "no-such-run"]) == 2
    err = capsys.readouterr().err
    assert "no run 'no-such-run'" in err and str(two_runs.runs_dir) in err and "esper runs list" in err


def test_runs_show_lists_the_spec_and_each_checkpoint(
    two_runs: EsperSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    flip(two_runs.runs_dir / "half" / "checkpoints" / f"{epoch_tag(0, 'applied')}.pt")
    assert main(["runs", "show", "half", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["spec"]["recipe"] == "seed-reference" and shown["spec"]["epochs"] == 2
    statuses = {c["tag"]: c["status"] for c in shown["checkpoints"]}
    assert statuses[epoch_tag(0, "applied")] == "damaged" and statuses[epoch_tag(0, "trained")] == "intact"
    assert main(["runs", "show", "half"]) == 0
    assert "damaged" in capsys.readouterr().out
    assert main(["runs", "show", "nope"]) == 2


def test_a_stopped_run_says_so_until_it_goes_on(two_runs: EsperSettings, capsys: pytest.CaptureFixture[str]) -> None:
    from esper_core.run.stops import record_stop

    half = two_runs.runs_dir / "half"
    record = record_stop(half, reason="SIGTERM to the flow run", resume=("esper run --run-id half",))
    assert record is not None and record.last_commit == epoch_tag(0, "applied") and record.epochs_done == 1
    assert main(["runs", "list", "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["half"]["status"] == "stopped" and rows["done"]["status"] == "finished"
    assert main(["runs", "show", "half"]) == 0
    out = capsys.readouterr().out
    assert "SIGTERM to the flow run" in out and "resume   esper run --run-id half" in out
    # Going on clears it: the run is no longer stopped.
    Run.resume(settings=two_runs, run_id="half").close()
    assert main(["runs", "list", "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["half"]["status"] == "unfinished"
    # A run that never got a folder has nothing to record.
    assert record_stop(two_runs.runs_dir / "never-started", reason="x", resume=()) is None
