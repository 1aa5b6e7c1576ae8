"""Deployments on a real local Prefect server with a real process worker (what `make server` runs).

One server for the module (127.0.0.1, a free port, PREFECT_HOME and ESPER_HOME in tmp), every
deployment of prefect.yaml registered with `prefect deploy --all`, flows started with
`prefect deployment run` as a user would, and a worker killed mid-run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from esper_cli.local_prefect import PROJECT_DIR, LocalPrefect, worker_name_prefix
from esper_cli.prefect_processes import pid_alive, stop
from esper_cli.server import Sweeper, sweep_orphans
from esper_core.run.reports import finish_run
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings
from esper_core.telemetry import read_jsonl
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.slow

RECIPE = {"recipe": "seed-reference", "device": "cpu", "seed": 3}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, compiled_home_template: Path) -> Iterator[LocalPrefect]:
    home = tmp_path_factory.mktemp("server") / "esper"
    shutil.copytree(compiled_home_template, home)
    local = LocalPrefect(
        home=home,
        port=_free_port(),
        # Poll for work every second instead of every 10 s, so the tests do not wait on it.
        extra_env={"PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_LOGGING_LEVEL": "INFO"},
    )
    server = local.start_server()
    try:
        local.deploy()
        yield local
    finally:
        stop(server)


@pytest.fixture
def worker(local: LocalPrefect) -> Iterator[list[subprocess.Popen]]:
    """A worker for the test; the test may replace it (the list holds the current one)."""
    current = [local.start_worker()]
    yield current
    stop(current[0])


def _flow_run_logs(client: Any, flow_run_id: UUID) -> list[str]:
    """Every log message of one flow run, page by page (the API returns at most 200 at a time)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    messages: list[str] = []
    while page := client.read_logs(log_filter=log_filter, limit=200, offset=len(messages)):
        messages += [log.message for log in page]
    return messages


def _client_call(local: LocalPrefect, fn):  # noqa: ANN001, ANN202 - a small helper for sync client calls
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: local.api_url}), get_client(sync_client=True) as client:
        return fn(client)


def _params(**extra: object) -> list[str]:
    out = []
    for key, value in {**RECIPE, **extra}.items():
        out += ["--param", f"{key}={value}"]
    return out


def test_deploy_registers_every_deployment(local: LocalPrefect) -> None:
    listing = local.run_cli("deployment", "ls").stdout
    for name in (
        "morphogenesis/default",
        "compile_catalog/default",
        "compile_catalog/dask",
        "benchmark_sweep/nightly",
        "benchmark_sweep/dask",
        "fault_drills/default",
        "train_policy/default",
    ):
        flow, deployment = name.split("/")
        assert flow in listing and deployment in listing, listing


def test_deployment_run_completes_with_its_artifacts(local: LocalPrefect, worker: list[subprocess.Popen]) -> None:
    done = local.run_cli(
        "deployment", "run", "morphogenesis/default", *_params(epochs=3), "--watch", "--watch-timeout", "400"
    )
    assert "Completed" in done.stdout, done.stdout

    keys = _client_call(local, lambda c: {a.key for a in c.read_artifacts()})
    assert {"seed-reference-curves", "seed-reference-seeds", "seed-reference-report"} <= keys, keys
    (run_dir,) = (local.home / "runs").iterdir()
    assert (run_dir / "curves.png").read_bytes().startswith(b"\x89PNG")


def test_killed_worker_resumes_from_last_committed_epoch(
    local: LocalPrefect, worker: list[subprocess.Popen], tmp_path: Path
) -> None:
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    epochs = 60
    with temporary_settings({PREFECT_API_URL: local.api_url}):
        flow_run = run_deployment("morphogenesis/default", parameters={**RECIPE, "epochs": epochs}, timeout=0)
    run_key = str(flow_run.id).replace("-", "")[:8]
    runs = local.home / "runs"

    def committed_epoch() -> int:
        found = list(runs.glob(f"*-{run_key}/checkpoints/LATEST"))
        tag = found[0].read_text().strip() if found else ""
        return int(tag.split("-")[1]) if tag.startswith("epoch-") else -1

    wait_for(lambda: committed_epoch() >= 3, what="the run to commit epoch 3", timeout_s=300)
    pid = _client_call(local, lambda c: c.read_flow_run(flow_run.id).infrastructure_pid)
    # As a machine or container crash would: the worker and the flow-run process it started
    # (in a session of its own) die at once.
    os.killpg(worker[0].pid, signal.SIGKILL)
    os.killpg(int(pid), signal.SIGKILL)
    worker[0].wait()
    # SIGKILL returns before the process is gone: a worker started while it is still tearing
    # down finds it alive and leaves the run to the 90 s zombie automation, which marks it
    # Crashed with no worker start left to reschedule it (CI saw exactly that).
    wait_for(lambda: not pid_alive(int(pid)), what="the killed flow-run process to be gone", timeout_s=60)
    at_kill = committed_epoch()
    assert at_kill < epochs - 1, "the run finished before the kill; give it more epochs"
    state = _client_call(local, lambda c: c.read_flow_run(flow_run.id).state)
    assert state.type is StateType.RUNNING  # the server cannot know yet

    # What `esper server worker` does at its start: sweep (the run is orphaned), then a worker.
    assert str(flow_run.id) in local.recover_orphans()
    worker[0] = local.start_worker()
    wait_for(
        lambda: _client_call(local, lambda c: c.read_flow_run(flow_run.id).state).is_final(),
        what="the resumed run",
        timeout_s=400,
    )
    final = _client_call(local, lambda c: c.read_flow_run(flow_run.id))
    assert final.state.type is StateType.COMPLETED, final.state.message
    assert final.run_count >= 2

    def resumed() -> list[str]:
        logs = _client_call(local, lambda c: _flow_run_logs(c, flow_run.id))
        return [m for m in logs if m.startswith("resuming run") and run_key in m]

    # The flow-run process sends its logs in batches, which may reach the server after the run's
    # final state does: wait for the line rather than read the logs once.
    wait_for(lambda: bool(resumed()), what="the 'resuming run' log line to reach the server", timeout_s=60)
    lines = resumed()
    assert int(lines[0].split(" at epoch ")[1].split()[0]) >= 3, lines

    (run_dir,) = runs.glob(f"*-{run_key}")
    # Nothing lost, nothing counted twice: one Tolaria packet per epoch, in order.
    packets = read_jsonl(run_dir / "telemetry.jsonl")
    assert [p.epoch for p in packets if p.source == "tolaria"] == list(range(epochs))
    # And the result is exactly that of an uninterrupted run of the same recipe and seed.
    reference = EsperSettings(home=tmp_path / "ref")
    shutil.copytree(local.home, reference.home, ignore=shutil.ignore_patterns("runs", "prefect"))
    session = Run.start(RunSpec(recipe=RECIPE["recipe"], epochs=epochs, device="cpu", seed=3), settings=reference)
    for _ in range(epochs):
        session.train_epoch()
        session.apply(session.decide())
    clean = finish_run(session)
    session.close()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["test_loss"] == clean.test_loss and summary["seeds"] == clean.seeds


def test_a_per_minute_cron_fires_and_a_process_worker_completes_its_run(
    local: LocalPrefect, worker: list[subprocess.Popen]
) -> None:
    """The check behind dropping the SQLAlchemy<2.1 pin: with 2.1, Prefect 3.8.8's scheduler
    errored on every loop and cron schedules never fired."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.schedules import CronSchedule

    deployment_id = _client_call(local, lambda c: c.read_deployment_by_name("morphogenesis/default").id)
    (schedule,) = _client_call(
        local,
        lambda c: c.create_deployment_schedules(
            deployment_id,
            [(CronSchedule(cron="* * * * *", timezone="UTC"), True)],
            parameters={**RECIPE, "epochs": 2},
            slug="cron-check",
        ),
    )
    of_deployment = DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))

    def scheduled_runs(client: Any) -> list[Any]:
        runs = client.read_flow_runs(deployment_filter=of_deployment)
        return [r for r in runs if r.auto_scheduled]

    try:
        # The scheduler creates the runs (at most a loop later), the first starts at the next
        # minute, the worker polls every second: a few minutes at most on a loaded machine.
        wait_for(
            lambda: any(r.state_type is StateType.COMPLETED for r in _client_call(local, scheduled_runs)),
            what="a run of the per-minute cron to complete",
            timeout_s=300,
        )
    finally:
        _client_call(local, lambda c: c.delete_deployment_schedule(deployment_id, schedule.id))
        for run in _client_call(local, scheduled_runs):  # no later test's worker may pick one up
            if not run.state or run.state_type in (StateType.SCHEDULED, StateType.PENDING):
                _client_call(local, lambda c, i=run.id: c.delete_flow_run(i))


def _nightly_schedule(client: Any) -> Any:
    (schedule,) = client.read_deployment_by_name("benchmark_sweep/nightly").schedules
    return schedule


def test_redeploy_keeps_the_operators_schedule_switch_and_one_zombie_automation(local: LocalPrefect) -> None:
    from esper_cli.deploy_ops import ZOMBIE_AFTER_S, ZOMBIE_AUTOMATION

    deployment_id = _client_call(local, lambda c: c.read_deployment_by_name("benchmark_sweep/nightly").id)
    first = _client_call(local, _nightly_schedule)
    assert first.active is False and first.slug == "nightly"  # as prefect.yaml registers it
    # An operator switches the nightly sweep on (the UI's toggle makes the same call).
    _client_call(local, lambda c: c.update_deployment_schedule(deployment_id, first.id, active=True))
    try:
        out = local.deploy()
        assert "kept the schedule switch of benchmark_sweep/nightly nightly: on" in out, out
        again = _client_call(local, _nightly_schedule)
        assert again.active is True and again.slug == "nightly"
    finally:
        # Off again: no worker of the other tests may pick up a 03:00 sweep.
        _client_call(local, lambda c: c.update_deployment_schedule(deployment_id, again.id, active=False))

    (automation,) = _client_call(local, lambda c: c.read_automations_by_name(ZOMBIE_AUTOMATION))
    trigger = automation.trigger
    assert trigger.posture == "Proactive" and trigger.within.total_seconds() == ZOMBIE_AFTER_S
    assert trigger.after == {"prefect.flow-run.heartbeat"} and "prefect.flow-run.heartbeat" in trigger.expect
    assert [a.type for a in automation.actions] == ["change-flow-run-state"]
    assert automation.actions[0].state.value == "CRASHED" and automation.enabled


def test_the_server_refuses_a_bad_parameter_before_a_run_exists(local: LocalPrefect) -> None:
    before = _client_call(local, lambda c: len(c.read_flow_runs()))
    with pytest.raises(RuntimeError, match="Validation failed for field 'recipe'"):
        local.run_cli("deployment", "run", "morphogenesis/default", "--param", "recipe=digits-mpl")
    assert _client_call(local, lambda c: len(c.read_flow_runs())) == before


def test_a_sweep_reschedules_only_runs_that_lost_their_process(local: LocalPrefect) -> None:
    """What `esper server` sweeps every 30 s beside a live worker: a run it reschedules runs again,
    so a run that may still run (or is being submitted) must never be touched."""
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Crashed, Pending, Running

    from esper_cli.deploy_ops import ZOMBIE_MESSAGE
    from esper_cli.local_prefect import WORKER_LABEL

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has any more
    alive, here, elsewhere = os.getpid(), worker_name_prefix() + "test", "esper another-machine 0000"
    cases = {  # (state, infrastructure_pid, the worker that ran it): rescheduled?
        "crashed by the zombie automation": ((Crashed(message=ZOMBIE_MESSAGE), gone.pid, None), True),
        "crashed for another reason": ((Crashed(message="the flow raised SystemExit"), gone.pid, here), False),
        "crashed by the automation, alive here": ((Crashed(message=ZOMBIE_MESSAGE), alive, here), False),
        "crashed by the automation elsewhere": ((Crashed(message=ZOMBIE_MESSAGE), alive, elsewhere), True),
        "running here, its process gone": ((Running(), gone.pid, here), True),
        "running here, its process alive": ((Running(), alive, here), False),
        "running without a pid yet": ((Running(), None, here), False),
        "running elsewhere (its pid names no process here)": ((Running(), gone.pid, elsewhere), False),
        "just Pending with its previous execution's pid": ((Pending(), gone.pid, here), False),
    }
    runs = {}
    with temporary_settings({PREFECT_API_URL: local.api_url}):
        for case, ((state, pid, worker_name), _) in cases.items():
            run = run_deployment("fault_drills/default", timeout=0)
            runs[case] = run.id
            if pid is not None:
                _client_call(local, lambda c, r=run, p=pid: c.update_flow_run(r.id, infrastructure_pid=str(p)))
            if worker_name is not None:
                _client_call(local, lambda c, r=run, w=worker_name: c.update_flow_run_labels(r.id, {WORKER_LABEL: w}))
            if state.type is StateType.CRASHED:
                _client_call(local, lambda c, r=run: c.set_flow_run_state(r.id, Running(), force=True))
            _client_call(local, lambda c, r=run, s=state: c.set_flow_run_state(r.id, s, force=True))
    try:
        rescheduled = set(local.recover_orphans())
        assert {case for case, run_id in runs.items() if str(run_id) in rescheduled} == {
            case for case, (_, expected) in cases.items() if expected
        }
        for case, run_id in runs.items():
            (state, _, _), expected = cases[case]
            after = _client_call(local, lambda c, i=run_id: c.read_flow_run(i).state_type)
            assert after is (StateType.SCHEDULED if expected else state.type), case
    finally:
        for run_id in runs.values():  # no worker of a later test may run them
            _client_call(local, lambda c, i=run_id: c.delete_flow_run(i))


WORKER_LOOP = """
import sys
from pathlib import Path
from esper_cli.local_prefect import LocalPrefect
from esper_cli.server import run_worker
local = LocalPrefect(home=Path(sys.argv[1]), port=int(sys.argv[2]))
try:
    sys.exit(run_worker(local, sweep_every_s=float(sys.argv[3])))
except KeyboardInterrupt:  # as `esper` exits after Ctrl-C
    sys.exit(130)
"""
"""`esper server worker` with a sweep every ``argv[3]`` s instead of ``ORPHAN_SWEEP_S``."""


def test_a_running_worker_reschedules_a_run_whose_worker_died_after_it_started(
    local: LocalPrefect, worker: list[subprocess.Popen], tmp_path: Path
) -> None:
    """`esper server worker` sweeps while its worker runs: a run whose flow-run process dies
    together with another worker (an OOM kill, a crash) goes on from its last commit on this
    worker, with no worker start, and only once."""
    import psutil
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: local.api_url}):
        # Long enough never to finish here: the test stops it once it has gone on.
        flow_run = run_deployment("morphogenesis/default", parameters={**RECIPE, "epochs": 50000}, timeout=0)
    run_key = str(flow_run.id).replace("-", "")[:8]

    def read() -> Any:
        return _client_call(local, lambda c: c.read_flow_run(flow_run.id))

    def committed_epoch() -> int:
        found = list((local.home / "runs").glob(f"*-{run_key}/checkpoints/LATEST"))
        tag = found[0].read_text().strip() if found else ""
        return int(tag.split("-")[1]) if tag.startswith("epoch-") else -1

    def rescheduled() -> list[str]:
        """The loop's lines that say it rescheduled this run."""
        lines = log.read_text(errors="replace").splitlines()
        return [line for line in lines if line.startswith("rescheduled") and str(flow_run.id) in line]

    # The fixture's worker runs it (the only worker of the pool yet) and commits.
    wait_for(lambda: committed_epoch() >= 1, what="the run to commit on the first worker", timeout_s=300)
    pid = int(read().infrastructure_pid)
    assert pid in {p.pid for p in psutil.Process(worker[0].pid).children(recursive=True)}

    log = tmp_path / "worker-loop.log"
    with open(log, "wb") as out:
        loop = subprocess.Popen(
            [sys.executable, "-c", WORKER_LOOP, str(local.home), str(local.port), "1"],
            cwd=PROJECT_DIR,
            env=local.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: "Ctrl-C stops it" in log.read_text() or loop.poll() is not None,
            what="the second worker to start (after its first sweep)",
            timeout_s=300,
        )
        assert loop.poll() is None, log.read_text(errors="replace")[-4000:]
        # As a machine's OOM killer or a crash would: the first worker and its flow run die at once.
        os.killpg(worker[0].pid, signal.SIGKILL)
        os.killpg(pid, signal.SIGKILL)
        worker[0].wait()
        wait_for(lambda: not pid_alive(pid), what="the killed flow-run process to be gone", timeout_s=60)
        at_kill = committed_epoch()

        # No worker starts now: the running loop's sweep reschedules the run, its worker runs it.
        wait_for(rescheduled, what=f"the loop to reschedule the run (its output: {log})", timeout_s=120)
        wait_for(lambda: committed_epoch() > at_kill + 2, what="the run to go on from its commit", timeout_s=300)
        resumed = read()
        assert resumed.state_type is StateType.RUNNING and resumed.run_count >= 2, resumed.state
        assert int(resumed.infrastructure_pid) in {p.pid for p in psutil.Process(loop.pid).children(recursive=True)}
        # Once: a sweep while the worker submitted it again (its pid still the dead one) left it alone.
        assert len(rescheduled()) == 1, log.read_text()

        # Ctrl-C stops the loop, its worker and the flow run.
        children = psutil.Process(loop.pid).children(recursive=True)
        loop.send_signal(signal.SIGINT)
        loop.wait(timeout=120)
        wait_for(
            lambda: not any(pid_alive(p.pid) for p in children),
            what="the loop's worker and flow run to stop",
            timeout_s=60,
        )
        # Nothing lost, nothing run twice: one Tolaria packet per committed epoch, in order.
        (run_dir,) = (local.home / "runs").glob(f"*-{run_key}")
        packets = read_jsonl(run_dir / "telemetry.jsonl")
        epochs = [p.epoch for p in packets if p.source == "tolaria"]
        assert epochs == list(range(len(epochs))), "an epoch was lost or trained twice"
    finally:
        if loop.poll() is None:
            stop(loop)
        _client_call(local, lambda c: c.delete_flow_run(flow_run.id))  # no later worker may pick it up


def test_a_sweep_that_cannot_reach_the_server_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    idle = LocalPrefect(home=tmp_path / "esper", port=_free_port())
    assert sweep_orphans(idle, next_in_s=30) == []
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("could not look for flow runs orphaned by a dead worker (ConnectError: "), line
    assert line.endswith("; trying again in 30 s"), line


def test_status_says_whether_each_schedule_is_on(local: LocalPrefect) -> None:
    lines = local.status().splitlines()
    assert lines[0] == f"Prefect server {local.api_url} (UI {local.ui_url})"
    nightly = next(line for line in lines if line.startswith("benchmark_sweep/nightly"))
    assert "nightly (0 3 * * * UTC): " in nightly and nightly.rsplit(": ", 1)[1] in ("on", "off")
    assert any(line.startswith("morphogenesis/default") and "no schedule" in line for line in lines), lines


def test_status_without_a_server_says_how_to_start_one(tmp_path: Path) -> None:
    idle = LocalPrefect(home=tmp_path / "esper", port=_free_port())
    with pytest.raises(ValueError, match=r"no Prefect server answers at .*: start one with `esper server start`"):
        idle.status()


def test_esper_run_uses_the_running_esper_server_of_its_home(local: LocalPrefect, tmp_path: Path) -> None:
    """`esper run` in a home whose `esper server start` runs sends its flow run there (it shows in
    that UI) instead of starting a temporary server; a marker of a dead server is ignored."""
    import psutil

    server = next(p for p in psutil.process_iter(["cmdline"]) if str(local.port) in " ".join(p.info["cmdline"] or ()))
    local.marker.write_text(json.dumps({"api_url": local.api_url, "pid": server.pid}))
    try:
        assert LocalPrefect.running_api_url(local.home) == local.api_url
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ESPER_"))}
        env.update(ESPER_HOME=str(local.home), PREFECT_HOME=str(tmp_path / "unused"), PYTHONPATH=str(PROJECT_DIR))
        done = subprocess.run(
            [sys.executable, "-m", "esper_cli", "-v", "run", "--recipe", "seed-reference", "--epochs", "2"]
            + ["--device", "cpu", "--run-id", "on-the-server"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        assert "temporary server answered" not in done.stderr and "start-up" in done.stderr  # none was started
        runs = _client_call(local, lambda c: c.read_flow_runs())
        assert any(r.parameters.get("run_id") == "on-the-server" for r in runs)
    finally:
        local.marker.unlink(missing_ok=True)
    # A marker left by a server that is gone points nowhere.
    local.marker.write_text(json.dumps({"api_url": "http://127.0.0.1:9/api", "pid": 2**22 + 1}))
    try:
        assert LocalPrefect.running_api_url(local.home) is None
    finally:
        local.marker.unlink(missing_ok=True)


class _RecordingLocal:
    """A ``LocalPrefect`` stand-in that records which thread swept."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def recover_orphans(self) -> list[str]:
        self.threads.append(threading.current_thread())
        return []


def test_sweeps_never_run_on_the_main_thread_where_sigterm_lands() -> None:
    # A Terminated raised inside the API client's serialisers came back as an ordinary exception,
    # which a sweep on the main thread swallowed: SIGTERM was lost. Sweeps run on their own thread.
    local = _RecordingLocal()
    sweeper = Sweeper(local, every_s=3600.0)  # type: ignore[arg-type]
    sweeper.poll()
    sweeper.settle(timeout_s=30.0)
    sweeper.poll()  # not due yet: no second sweep
    sweeper.settle(timeout_s=30.0)
    sweeper.now()
    sweeper.poll()
    sweeper.settle(timeout_s=30.0)
    assert len(local.threads) == 2
    assert all(t is not threading.main_thread() for t in local.threads)
