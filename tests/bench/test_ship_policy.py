"""bench.ship_policy: a saved zoo training becomes a shipped policy that serves, or is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.ship_policy import ship
from esper_core.simic.shipping import require_current_inputs
from esper_core.tamiyo import shipped

# A real training's chosen version, committed with its descriptor (docs/zoo.md).
SAVED = Path(__file__).resolve().parents[2] / "baselines" / "zoo" / "trainings" / "zoo-full-c"


def test_a_saved_training_ships_byte_for_byte_with_a_provenance_that_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest, path = ship(SAVED, name="zoo-test", directory=tmp_path)
    descriptor = json.loads((SAVED / "policy.json").read_text())
    assert digest == descriptor["sha256"]
    assert path.read_bytes() == (SAVED / "weights.pt").read_bytes()
    record = json.loads((tmp_path / "zoo-test.json").read_text())
    assert record["selection"]["chosen"]["label"] == descriptor["chosen_label"]
    assert record["command"].startswith("python -m bench.zoo_policy")
    # What serving reads: the shipped policy passes the check a first use makes.
    monkeypatch.setattr(shipped, "POLICY_DIR", tmp_path)
    monkeypatch.setitem(shipped.SHIPPED, "zoo-test", digest)
    require_current_inputs(shipped.read_shipped("zoo-test"))


def test_weights_changed_after_their_training_saved_them_are_not_shipped(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    shutil.copytree(SAVED, saved)
    data = bytearray((saved / "weights.pt").read_bytes())
    data[-100] ^= 0xFF
    (saved / "weights.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="changed after they were saved"):
        ship(saved, name="zoo-test", directory=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_not_a_saved_training_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="bench.zoo_policy --save"):
        ship(tmp_path, name="zoo-test", directory=tmp_path / "out")
