"""A process SIGKILLed between a commit and the send of its telemetry loses nothing.

SIGKILL cannot be deferred (``esper_core.interrupts`` holds only SIGINT and SIGTERM), so the
checkpoint carries the step's telemetry and field reports, and reopening the run sends what the
run folder lacks. A real child process is killed inside that window; the resumed run's files then
hold one Tolaria packet per epoch and every field report once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from esper_core.contracts import FieldReport
from esper_core.run.commits import epoch_tag
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings
from esper_core.telemetry.sinks import read_jsonl

EPOCHS = 6
KILL_AT = 3  # the applied commit of this epoch dies before its send

_CHILD = f"""
import os, signal
from esper_core.run.commits import epoch_tag
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings

session = Run.start(RunSpec(recipe="digits-mlp", device=None, epochs={EPOCHS}, run_id="killed"), settings=EsperSettings())
send = session._send
for epoch in range({EPOCHS}):
    session.train_epoch()
    session.commit(epoch_tag(epoch, "trained"))
    session.apply(session.decide())
    if epoch == {KILL_AT}:
        # The checkpoint is on disk; the process dies before a byte of its telemetry is sent.
        session._send = lambda unsent: os.kill(os.getpid(), signal.SIGKILL)
    session.commit(epoch_tag(epoch, "applied"))
"""


def test_a_run_killed_between_commit_and_send_resends_on_resume(compiled_home: EsperSettings) -> None:
    child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=600, check=False)
    assert child.returncode == -9, child.stderr[-3000:]
    run_dir = compiled_home.runs_dir / "killed"
    before = read_jsonl(run_dir / "telemetry.jsonl")
    # The trained commit of the epoch sent its Tolaria packet; the applied one sent nothing.
    assert [p.epoch for p in before if p.source == "tolaria"] == list(range(KILL_AT + 1))
    assert [p.epoch for p in before if p.source == "tamiyo"] == list(range(KILL_AT)), "killed after the send"

    session = Run.resume(settings=compiled_home, run_id="killed")
    assert session.epoch == KILL_AT + 1  # the killed commit stands
    while session.epoch < EPOCHS:
        epoch = session.epoch
        session.train_epoch()
        session.commit(epoch_tag(epoch, "trained"))
        session.apply(session.decide())
        session.commit(epoch_tag(epoch, "applied"))
    session.close()

    packets = read_jsonl(run_dir / "telemetry.jsonl")
    for source in ("tolaria", "tamiyo"):
        assert [p.epoch for p in packets if p.source == source] == list(range(EPOCHS)), source
    assert len({p.packet_id for p in packets}) == len(packets)  # nothing sent twice
    lines = (run_dir / "field_reports.jsonl").read_text().splitlines()
    ids = [FieldReport.from_json(line).report_id for line in lines]
    assert ids and len(set(ids)) == len(ids)
    assert sorted(ids) == sorted(r.report_id for r in session.reports)


def test_reopening_a_run_whose_commit_was_sent_sends_nothing_again(compiled_home: EsperSettings) -> None:
    session = Run.start(RunSpec(recipe="digits-mlp", epochs=2, device=None, run_id="whole"), settings=compiled_home)
    session.train_epoch()
    session.commit(epoch_tag(0, "trained"))
    session.close()
    telemetry = Path(session.run_dir) / "telemetry.jsonl"
    before = telemetry.read_bytes()
    Run.resume(settings=compiled_home, run_id="whole").close()
    assert telemetry.read_bytes() == before
