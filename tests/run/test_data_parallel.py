"""Data-parallel runs: real gloo process groups on CPU, against the single-process run.

The recipes are ``tests/helpers/user_models.py``'s ``mlp_grown`` (a width seed merged and a
branch seed culled within 8 epochs, two seeds training at once) and ``mlp_widen_long`` (40 epochs
to stop in the middle).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from esper_core.contracts import AdaptationCommand, CommandType, SeedOperation, SeedStage
from esper_core.data import DatasetSplit, Split
from esper_core.run import ranks
from esper_core.run.commits import epoch_tag, epochs_applied
from esper_core.run.ranks import LAUNCHES_FILE, ParallelRunFailed, launch
from esper_core.run.recipes import get_recipe
from esper_core.run.reports import finish_run
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec, check_parallel
from esper_core.run.steps import grow_epoch
from esper_core.settings import EsperSettings
from esper_core.tolaria.checkpoint import CheckpointStore
from esper_core.tolaria.collective import Solo, state_digest
from esper_core.tolaria.staging import BatchSource, LoaderConfig
from tests.helpers.waiting import wait_for

GROWN = "tests.helpers.user_models:mlp_grown"
LONG = "tests.helpers.user_models:mlp_widen_long"
REPO = Path(__file__).resolve().parents[2]


def _solo(settings: EsperSettings, recipe: str, run_id: str) -> Run:
    session = Run.start(RunSpec(recipe=recipe, device="cpu", run_id=run_id), settings=settings)
    while session.epoch < session.config.epochs:
        grow_epoch(session, session.epoch)
    return session


# ---------------------------------------------------------------------- the collective


def test_a_process_group_sums_weighs_broadcasts_and_catches_divergence(tmp_path: Path) -> None:
    mp.start_processes(
        _exchange, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True, start_method="spawn"
    )
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (r0["leader"], r1["leader"]) == (True, False) and r0["world"] == 2
    for seen in (r0, r1):
        # 1/4 * 1 + 3/4 * 2 and 1/4 * 10 + 3/4 * 20; the parameter without a gradient keeps none.
        assert seen["grads"] == [[1.75] * 3, [17.5] * 4, None]
        assert seen["rows"] == [1.5] * 6 and seen["sum"] == 3.0
        assert seen["broadcast"] == {"from": 0} and seen["gather"] == [0, 10]
        assert seen["running_mean"] == [0.5, 0.5]
        assert "ranks [1] hold a different model from rank 0 at after a bad step" in seen["diverged"]
    assert r0["inside"] != r1["inside"]  # each rank its own dropout masks
    assert r0["after"] == r1["after"]  # and back on the shared stream afterwards


def _exchange(rank: int, store: str, out: str) -> None:
    from tests.helpers.ranks import exchange

    exchange(rank, store, out)


def test_one_process_exchanges_nothing() -> None:
    solo = Solo()
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.ones(2)
    solo.sum_gradients([p], weight=1.0)
    assert p.grad.tolist() == [1.0, 1.0] and solo.leader and solo.world == 1
    before = torch.get_rng_state()
    with solo.rank_rng(salt=1):
        assert torch.equal(torch.get_rng_state(), before)  # a single process keeps its own stream
    assert solo.gather("x") == ["x"] and solo.broadcast(3) == 3


@pytest.mark.parametrize("streamed", [False, True], ids=["in-memory", "dataset"])
def test_the_ranks_shards_make_up_every_global_batch(streamed: bool) -> None:
    n, batch = 70, 16  # the last batch holds 6
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    split = Split(x=x, y=torch.arange(n))
    if streamed:
        split = DatasetSplit(dataset=torch.utils.data.TensorDataset(x, torch.arange(n)))

    def batches(rank: int, world: int) -> list[list[int]]:
        source = BatchSource(
            split, device=torch.device("cpu"), batch_size=batch, seed=5, config=LoaderConfig(), shard=(rank, world)
        )
        return [y.tolist() for _, y in source.epoch(2)]

    whole = batches(0, 1)
    for world in (2, 3):
        shards = [batches(r, world) for r in range(world)]
        for step, full in enumerate(whole):
            parts = [s[step] for s in shards]
            assert sorted(sum(parts, [])) == sorted(full)
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_a_run_the_processes_cannot_share_is_refused_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    config = get_recipe(LONG)  # batch 64 over 1,000 samples: the last batch holds 40
    check_parallel(config, 2, train_samples=1000)
    with pytest.raises(ValueError, match=r"batch_size 64 cannot be shared by 65 processes.*--nproc 64 or fewer"):
        check_parallel(config, 65, train_samples=1000)
    with pytest.raises(ValueError, match=r"last batch of each epoch holds 40 .* fewer than --nproc 50"):
        check_parallel(config, 50, train_samples=1000)
    with pytest.raises(ValueError, match="nproc must be >= 1"):
        check_parallel(config, 0, train_samples=1000)
    with pytest.raises(ValueError, match="nproc must be >= 1"):
        RunSpec(run_id="r", recipe=LONG, nproc=0)
    # The CUDA guard, checked on a machine without a GPU: one GPU a process.
    monkeypatch.setattr("esper_core._capabilities.cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    config.trainer = dataclasses.replace(config.trainer, device="cuda")  # the recipe's own is shared
    with pytest.raises(ValueError, match=r"--nproc 2 on CUDA needs one GPU per process, but 1 are visible"):
        check_parallel(config, 2, train_samples=1000)


def test_a_command_one_rank_cannot_apply_is_undone_on_every_rank(esper_home: EsperSettings) -> None:
    """Rank 0's half of the agreement: rank 1 (scripted) refused the germination that applied here."""

    class RankOneRefuses(Solo):
        world = 2

        def gather(self, obj: object) -> list[object]:
            return [obj, "rejected: kasmina missed its deadline"]

    session = Run.start(RunSpec(recipe=LONG, device="cpu", run_id="agree"), settings=esper_home)
    session.train_epoch()
    session.commit(epoch_tag(0, "trained"))
    before = state_digest(session.trainer.model)
    session.collective = RankOneRefuses()
    command = AdaptationCommand(
        run_id="agree",
        epoch=0,
        command_type=CommandType.SEED,
        seed_operation=SeedOperation.GERMINATE,
        slot_id="fc2+width",
        blueprint_id="width-50",
        issued_by="test",
        reason="widen fc2 on every rank",
    )
    outcome = session.apply(command)
    assert outcome == "rejected: rank 1: kasmina missed its deadline"
    assert session.manager.slots["fc2+width"].stage is SeedStage.DORMANT
    assert state_digest(session.trainer.model) == before
    session.close()


def _files(run_dir: Path) -> dict[Path, bytes]:
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("path", ["launch", "torchrun"])
def test_a_resume_whose_controller_changed_is_refused_before_any_rank_trains(
    esper_home: EsperSettings, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Both data-parallel paths check a resumed run's controller before any rank trains, as
    ``Run.resume`` does: ``launch`` in the parent, before it starts a rank; under torchrun, rank 0
    before the group trains (here a group of one, in this process)."""
    session = Run.start(RunSpec(recipe=LONG, device="cpu", run_id="older"), settings=esper_home)
    grow_epoch(session, 0)
    session.close()
    run_dir = esper_home.runs_dir / "older"
    fields = json.loads((run_dir / "run.json").read_text())
    probe = fields["decides"]["heuristic"]["probe_epoch"]
    fields["decides"]["heuristic"]["probe_epoch"] = probe + 1  # as a version with another default recorded it
    (run_dir / "run.json").write_text(json.dumps(fields))
    stored = _files(run_dir)

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("a rank started training a run whose controller changed")

    monkeypatch.setattr(mp, "start_processes", no_training)
    monkeypatch.setattr(ranks, "train_rank", no_training)
    refused = rf"older was decided by heuristic=.*'probe_epoch': {probe + 1}.*now resolves to heuristic="
    with pytest.raises(ValueError, match=refused):
        if path == "launch":
            launch(RunSpec(run_id="older", recipe=LONG, nproc=2, device="cpu"), esper_home)
        else:
            with socket.socket() as s:  # a free port for the group's rendezvous
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            env = {
                "RANK": "0",
                "LOCAL_RANK": "0",
                "WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            for key, value in env.items():
                monkeypatch.setenv(key, value)
            ranks.join_torchrun(run_id="older", recipe=LONG, settings=esper_home, device="cpu")
    # The run is as it was: no launch recorded, no commit added or rewound, run.json unchanged.
    assert _files(run_dir) == stored
    assert not (run_dir / LAUNCHES_FILE).exists()
    assert epochs_applied(CheckpointStore(run_dir / "checkpoints").latest()) == 1
    assert not torch.distributed.is_initialized()  # the refused group was taken down


# ---------------------------------------------------------------------- whole runs


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 3])
def test_n_processes_train_the_single_process_run(compiled_home: EsperSettings, nproc: int) -> None:
    """Three processes split each batch of 64 as 22 + 21 + 21 and the last one of 40 as 14 + 13 +
    13, so the gradient sum's weights are checked where they are not all alike."""
    launch(RunSpec(run_id="two", recipe=GROWN, nproc=nproc, device="cpu"), compiled_home)
    one = _solo(compiled_home, GROWN, "one")
    two = Run.resume(settings=compiled_home, run_id="two")

    def growth(session: Run) -> list[tuple[int, str, str | None, str | None]]:
        return [(c.epoch, c.action, c.slot_id, c.blueprint_id) for c in session.commands if c.action != "wait"]

    # The same decisions at the same epochs: widen, germinate the branch, fossilise (merge), cull.
    assert growth(two) == growth(one)
    assert {a for _, a, _, _ in growth(two)} >= {"germinate", "fossilize", "cull"}
    # The same curves, to float32 rounding (the sums over the batch run in another order).
    for a, b in zip(one.history, two.history, strict=True):
        assert b.train_loss == pytest.approx(a.train_loss, rel=1e-5)
        assert b.val_loss == pytest.approx(a.val_loss, rel=1e-5)
        assert b.val_accuracy == a.val_accuracy
        assert [s.stage for s in b.seeds] == [s.stage for s in a.seeds]
    # The merged network: fc2 48 -> 72 in both, weights equal to rounding.
    assert two.trainer.model.layer_widths == one.trainer.model.layer_widths == (64, 72, 10)
    for p, q in zip(one.trainer.model.parameters(), two.trainer.model.parameters(), strict=True):
        torch.testing.assert_close(q, p, atol=1e-5, rtol=1e-4)
    summary = finish_run(two)
    shares = {2: (32, 32), 3: (22, 21, 21)}[nproc]
    assert (summary.processes, summary.batch_size, summary.batch_per_process) == (nproc, 64, shares)
    # Rank 0 alone reported: one training packet per epoch, with the processes and their exchanges.
    packets = [json.loads(line) for line in (two.run_dir / "telemetry.jsonl").read_text().splitlines()]
    trained = [
        {m["name"]: m["value"] for m in p["metrics"]}
        for p in packets
        if p["source"] == "tolaria" and any(m["name"] == "tolaria.training.loss" for m in p["metrics"])
    ]
    assert len(trained) == 8
    assert all(m["tolaria.parallel.processes"] == nproc and m["tolaria.parallel.exchange_ms"] > 0 for m in trained)
    one.close()
    two.close()


@pytest.mark.slow
def test_a_killed_rank_fails_the_run_and_it_resumes_on_another_number_of_processes(esper_home: EsperSettings) -> None:
    run_dir = esper_home.runs_dir / "killed"
    script = (
        "from esper_core.run.ranks import launch\nfrom esper_core.run.spec import RunSpec\n"
        "from esper_core.settings import EsperSettings\n"
        f"launch(RunSpec(run_id='killed', recipe={LONG!r}, nproc=2, device='cpu'), EsperSettings())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        checkpoints = CheckpointStore(run_dir / "checkpoints")
        wait_for(
            lambda: (run_dir / LAUNCHES_FILE).exists() and epochs_applied(checkpoints.latest()) >= 3,
            what="the third epoch's commit",
            timeout_s=180.0,
        )
        pids = json.loads((run_dir / LAUNCHES_FILE).read_text())[-1]["pids"]
        os.kill(pids[1], signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "ParallelRunFailed: data-parallel run killed stopped: rank" in out, out[-3000:]
    assert "resume it with `esper run --run-id killed --nproc N`" in out
    stopped_at = epochs_applied(checkpoints.latest())
    assert 3 <= stopped_at < 40
    wait_for(lambda: not any(_alive(pid) for pid in pids), what="every rank to exit", timeout_s=180.0)

    # One process finishes what two started, from the last commit.
    launch(RunSpec(run_id="killed", recipe=LONG, nproc=1), esper_home)
    resumed = Run.resume(settings=esper_home, run_id="killed")
    assert [p.epoch for p in resumed.history] == list(range(40))
    assert [launch["nproc"] for launch in json.loads((run_dir / LAUNCHES_FILE).read_text())] == [2, 1]
    assert json.loads((run_dir / LAUNCHES_FILE).read_text())[-1]["from_epoch"] == stopped_at
    # And the run is the uninterrupted single-process one, to rounding.
    whole = _solo(esper_home, LONG, "whole")
    assert resumed.trainer.model.layer_widths == whole.trainer.model.layer_widths
    assert resumed.history[-1].val_loss == pytest.approx(whole.history[-1].val_loss, rel=1e-3)
    resumed.close()
    whole.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.slow
def test_a_failing_rank_names_itself_and_the_run_stays_at_its_last_commit(esper_home: EsperSettings) -> None:
    """A recipe that cannot be built fails in every rank before training; the launch says so."""
    with pytest.raises(ValueError, match="unknown recipe"):
        launch(RunSpec(run_id="bad", recipe="nope", nproc=2), esper_home)
    assert not (esper_home.runs_dir / "bad").exists()  # refused before anything was written
    # A 1 ms limit fails the ranks' Gloo connect: mostly with an exception, which the launch
    # quotes, but now and then Gloo crashes on it (SIGSEGV: 3 of 30 launches here), which
    # the launch names as the signal. Either way the failing rank is named and the way back given.
    with pytest.raises(ParallelRunFailed, match=r"rank \d (failed: |was killed by SIG[A-Z]+\.).*resume it with"):
        launch(RunSpec(run_id="timeout", recipe=LONG, nproc=2), esper_home, timeout_s=1e-3)


@pytest.mark.slow
def test_torchrun_ranks_train_a_run(esper_home: EsperSettings) -> None:
    """``esper rank`` under torchrun (here one node, two processes): rank 0 creates the run, both
    train it, rank 0 records the launch."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "esper_cli", "rank", "--run-id", "tr", "--recipe", LONG, "--epochs", "3", "--device", "cpu"]
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "run tr: trained on 2 processes" in out.stdout
    session = Run.resume(settings=esper_home, run_id="tr")
    assert [p.epoch for p in session.history] == [0, 1, 2]
    assert session.manager.slots["fc2+width"].stage is not SeedStage.DORMANT  # widened after epoch 0
    session.close()
    launches = json.loads((esper_home.runs_dir / "tr" / LAUNCHES_FILE).read_text())
    assert [(entry["nproc"], entry["backend"]) for entry in launches] == [(2, "gloo")]


def test_esper_rank_outside_torchrun_says_how_to_start_it(capsys: pytest.CaptureFixture[str]) -> None:
    from esper_cli.main import main

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        assert key not in os.environ
    assert main(["rank", "--run-id", "x", "--recipe", LONG]) == 2
    err = capsys.readouterr().err
    assert "start `esper rank` with torchrun" in err and "esper run --nproc 2" in err
