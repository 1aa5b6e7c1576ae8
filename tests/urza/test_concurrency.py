"""Several processes publishing and reading one registry at once: nothing lost, nothing half-seen.

Real processes on a real database (SQLite file, and PostgreSQL when installed) sharing one blob
store. Publishers overlap on some blobs (idempotency under contention) and each publishes with a
compile run and tags; a reader polls throughout and checks that every artifact it can see is
complete: its blob verifies, its history, tags and lineage are there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from esper_core.contracts import KernelArtifact
from esper_core.urza.service import Urza
from tests.urza.conftest import DESCRIPTOR

pytestmark = pytest.mark.slow

MakeArtifact = Callable[..., KernelArtifact]
ROOT = Path(__file__).resolve().parents[2]
PUBLISHERS, SHARED, OWN = 3, 4, 12

_PUBLISHER = textwrap.dedent(
    """
    import sys
    from esper_core.contracts import KernelArtifact
    from esper_core.urza.records import CompileRun
    from esper_core.urza.service import Urza
    from esper_core.urza.blobs import sha256_hex
    from types import SimpleNamespace

    home, url, template, name, shared, own = sys.argv[1:7]
    urza = Urza.open(home, url)
    run = CompileRun(run_id=name, compiler="torch.export", torch_version="2.13.0", device_kind="cpu", hostname="h")
    urza.store.start_compile_run(run)
    base = KernelArtifact.from_json(template)
    contents = [f"shared-{k}" for k in range(int(shared))] + [f"{name}-{k}" for k in range(int(own))]
    for content in contents:
        blob = (content * 50).encode()
        artifact = base.model_copy(update={"sha256": sha256_hex(blob), "size_bytes": len(blob)})
        urza.publish(SimpleNamespace(artifact=artifact, blob=blob), compile_run_id=name, tags=["approved"])
    urza.store.finish_compile_run(name, state="finished", detail={"published": len(contents)})
    urza.close()
    """
)

_READER = textwrap.dedent(
    """
    import os, sys
    from esper_core.urza.service import Urza

    home, url, stop = sys.argv[1:4]
    urza = Urza.open(home, url)
    seen = polls = 0
    while True:
        done = os.path.exists(stop)
        for artifact in urza.store.list_artifacts():
            record = urza.store.record(artifact.artifact_id)
            assert urza.fetch_blob(artifact), artifact  # verifies the SHA-256
            assert record.history and record.history[0].status.value == "active", record
            assert record.tags == ("approved",), record
            assert record.compile_run is not None, record
        seen = max(seen, len(urza.store.list_artifacts()))
        polls += 1
        if done:
            break
    urza.close()
    print(seen, polls)
    """
)


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_publishers_and_a_reader_in_separate_processes(
    registry_url: str, tmp_path: Path, make_artifact: MakeArtifact
) -> None:
    home = tmp_path / "home"
    urza = Urza.open(home, registry_url)
    urza.register_blueprint(DESCRIPTOR)
    stop = tmp_path / "stop"
    reader = _spawn(_READER, str(home), registry_url, str(stop))
    template = make_artifact().to_json()
    publishers = [
        _spawn(_PUBLISHER, str(home), registry_url, template, f"run-{i}", str(SHARED), str(OWN))
        for i in range(PUBLISHERS)
    ]
    for proc in publishers:
        _, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stderr
    stop.touch()
    out, stderr = reader.communicate(timeout=240)
    assert reader.returncode == 0, stderr
    polls = int(out.split()[1])
    assert polls >= 2, "the reader should have polled while publishers were running"

    artifacts = urza.store.list_artifacts()
    expected = SHARED + PUBLISHERS * OWN
    # Nothing lost, nothing doubled: every blob exactly once, versions 1..N without gaps.
    assert len(artifacts) == expected
    assert len({a.sha256 for a in artifacts}) == expected
    assert sorted(a.version for a in artifacts) == list(range(1, expected + 1))
    for artifact in artifacts:
        assert urza.fetch_blob(artifact)
        record = urza.store.record(artifact.artifact_id or 0)
        assert record.compile_run is not None and record.compile_run.state == "finished"
    assert not [p for p in urza.blobs.root.rglob("*.tmp")], "a finished publish leaves no temp files"
    urza.close()
