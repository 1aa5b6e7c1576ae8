"""Checks before any work: each common mistake is one line naming the fix, exit 2, nothing created."""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from esper_core.determinism import capture_rng
from esper_core.run.preflight import PreflightError, check_one_batch, preflight
from esper_core.run.spec import plan_spec
from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.tamiyo.model import TamiyoGNN, TamiyoGNNConfig

REPO = Path(__file__).resolve().parents[2]


def _esper_run(home: Path, *args: str, verbose: bool = False, **env: str) -> subprocess.CompletedProcess[str]:
    """``esper run ARGS`` as a user types it, in ``home`` and a temporary Prefect home."""
    environ = {**os.environ, "ESPER_HOME": str(home), "PREFECT_HOME": str(home.parent / "prefect"), **env}
    environ.pop("PREFECT_API_URL", None)
    esper = [str(Path(sys.executable).with_name("esper")), *(["-v"] if verbose else [])]
    return subprocess.run([*esper, "run", *args], cwd=REPO, env=environ, capture_output=True, text=True, timeout=300)


def _one_line_exit_2(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [line] = [x for x in done.stderr.splitlines() if x.strip()]
    return line


def _nothing_in_prefect(prefect_home: Path) -> bool:
    """No flow run exists, and no temporary server of this Prefect home is left running.

    The command's temporary server starts beside its checks (``TemporaryServer``), so it may
    have created Prefect's database before a check failed; it must hold no flow run, and the
    server must be gone with the command.
    """
    servers = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if "uvicorn" in " ".join(process.info["cmdline"] or ()) and (
                process.environ().get("PREFECT_HOME") == str(prefect_home)
            ):
                servers.append(process.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    assert not servers, f"temporary servers left running: {servers}"
    db = prefect_home / "prefect.db"
    if not db.exists():
        return True
    with contextlib.closing(sqlite3.connect(db)) as connection:
        try:
            return connection.execute("select count(*) from flow_run").fetchone()[0] == 0
        except sqlite3.OperationalError:  # not migrated yet: certainly no flow run
            return True


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_targets_the_loss_cannot_take_are_refused_before_any_flow_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    line = _one_line_exit_2(_esper_run(home, "--recipe", "tests.helpers.user_model:wrong_targets", "--device", "cpu"))
    assert "one training batch failed on cpu" in line and "RunConfig.loss" in line and "targets" in line
    assert not (home / "runs").exists() and _nothing_in_prefect(tmp_path / "prefect")  # no run, no flow run
    verbose = _esper_run(home, "--recipe", "tests.helpers.user_model:wrong_targets", "--device", "cpu", verbose=True)
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr and "mse_loss" in verbose.stderr


def test_a_registry_on_a_closed_port_is_refused_naming_the_setting(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://esper@127.0.0.1:{_closed_port()}/esper"
    line = _one_line_exit_2(
        _esper_run(tmp_path / "home", "--recipe", "seed-reference", "--device", "cpu", ESPER_REGISTRY_URL=url)
    )
    assert "does not answer" in line and "ESPER_REGISTRY_URL" in line
    assert _nothing_in_prefect(tmp_path / "prefect")


def test_a_home_that_cannot_be_a_folder_is_refused_naming_the_setting(tmp_path: Path) -> None:
    # A path that cannot be made a folder (a file there): what permissions cannot show as root.
    home = tmp_path / "home"
    home.write_text("not a folder")
    line = _one_line_exit_2(_esper_run(home, "--recipe", "seed-reference", "--device", "cpu"))
    assert "is not writable" in line and "set ESPER_HOME" in line
    assert home.read_text() == "not a folder" and _nothing_in_prefect(tmp_path / "prefect")


def test_the_library_check_says_the_same(esper_home: EsperSettings) -> None:
    esper_home.home.parent.mkdir(parents=True, exist_ok=True)
    esper_home.home.write_text("not a folder")
    planned = plan_spec("seed-reference", device="cpu")
    with pytest.raises(PreflightError, match=r"ESPER_HOME .* is not writable .*set ESPER_HOME"):
        preflight(planned.config, planned.data, settings=esper_home)


def test_the_batch_check_leaves_every_random_state_and_takes_no_step(esper_home: EsperSettings) -> None:
    planned = plan_spec("digits-mlp", device="cpu")
    torch.manual_seed(123)
    before = capture_rng()
    check_one_batch(planned.config, planned.data)
    after = capture_rng()
    assert torch.equal(before["torch"], after["torch"]) and before["python"][2] == after["python"][2]
    assert torch.equal(before["python"][1], after["python"][1]) and torch.equal(before["numpy"][1], after["numpy"][1])


def test_a_loss_that_is_not_a_scalar_is_refused(esper_home: EsperSettings) -> None:
    planned = plan_spec("seed-reference", device="cpu")
    planned.config.loss = lambda out, y: torch.nn.functional.cross_entropy(out, y, reduction="none")
    with pytest.raises(PreflightError, match="not a scalar"):
        check_one_batch(planned.config, planned.data)


def test_a_pinned_simic_version_must_be_in_the_registry_and_of_this_tamiyo(tmp_path: Path) -> None:
    home = tmp_path / "home"
    line = _one_line_exit_2(_esper_run(home, "--recipe", "digits-mlp", "--device", "cpu", "--policy", "gnn:7"))
    assert "policy gnn:7: no policy version 7" in line and "esper policy tune" in line
    assert not (home / "runs").exists() and _nothing_in_prefect(tmp_path / "prefect")
    # Stored, but trained for another network size than the recipe's Tamiyo.
    settings = EsperSettings(home=home)
    store = SimicStore.open(home)
    try:
        other = TamiyoGNNConfig(hidden_dim=32)
        version = store.publish_policy(TamiyoGNN(other).state_dict(), gnn=other, method="imitation", provenance={})
    finally:
        store.close()
    planned = plan_spec("digits-mlp", device="cpu", policy=f"gnn:{version.version}")
    with pytest.raises(
        PreflightError, match=rf"gnn:{version.version} was trained with .*set the recipe's TamiyoConfig.gnn"
    ):
        preflight(planned.config, planned.data, settings=settings)
