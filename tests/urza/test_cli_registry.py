"""``esper registry list|show|quarantine|retire|tag|gc|upgrade|verify`` on a real registry."""

from __future__ import annotations

import json

import pytest

from esper_cli.main import main
from esper_core.contracts import ArtifactStatus, KernelArtifact
from esper_core.karn.entries import default_catalog
from esper_core.pipeline import compile_job, job_for, publish_kernel
from esper_core.settings import EsperSettings
from esper_core.tezzeret.config import TezzeretConfig
from esper_core.urza.service import Urza


@pytest.fixture
def published(esper_home: EsperSettings) -> KernelArtifact:
    catalog = default_catalog()
    urza = Urza.open(esper_home.home)
    try:
        kernel = compile_job(
            catalog, job_for(catalog, "lowrank_adapter", "f8-b16"), "cpu", config=TezzeretConfig(timing_iters=2)
        )
        stored = publish_kernel(urza, catalog, kernel)
        urza.blobs.put(b"an orphan blob")
    finally:
        urza.close()
    return stored


def test_list_show_and_filters(published: KernelArtifact, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["registry", "list"]) == 0
    assert "lowrank_adapter" in capsys.readouterr().out
    assert main(["registry", "list", "--status", "retired", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["registry", "show", str(published.artifact_id)]) == 0
    out = capsys.readouterr().out
    assert f"artifact #{published.artifact_id}: lowrank_adapter f8-b16 v1" in out
    assert "tezzeret: published active" in out and "guard        (batch 1..16, 8) float32" in out


def test_quarantine_retire_and_history(published: KernelArtifact, capsys: pytest.CaptureFixture[str]) -> None:
    artifact_id = str(published.artifact_id)
    assert main(["registry", "quarantine", artifact_id, "--reason", "G4 regression in run r7"]) == 0
    assert main(["registry", "retire", artifact_id, "--reason", "superseded"]) == 0
    assert main(["registry", "tag", artifact_id, "baseline", "golden"]) == 0
    capsys.readouterr()
    assert main(["registry", "show", artifact_id, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["artifact"]["status"] == ArtifactStatus.RETIRED.value
    assert [h["reason"] for h in record["history"]] == ["published active", "G4 regression in run r7", "superseded"]
    assert record["history"][1]["actor"].startswith("cli:")
    assert record["tags"] == ["baseline", "golden"] and record["blob_present"] is True


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["registry", "show", "999"], "no artifact with id 999"),
        (["registry", "quarantine", "999", "--reason", "x"], "no artifact with id 999"),
        (["registry", "tag", "1", "Not A Tag"], "invalid tag"),
        (["registry", "quarantine", "1", "--reason", " "], "non-empty reason"),
    ],
)
def test_bad_input_is_a_clear_error(
    published: KernelArtifact, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    assert main(argv) == 2
    assert fragment in capsys.readouterr().err
    assert main(["registry", "show", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["artifact"]["status"] == "active", "nothing changed"


@pytest.mark.parametrize("argv", [["registry", "show", "abc"], ["registry", "show", "0"], ["registry", "retire", "1"]])
def test_malformed_arguments_are_refused_by_the_parser(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2


def test_gc_dry_run_then_for_real(published: KernelArtifact, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["registry", "gc", "--dry-run", "--min-age-s", "0", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"] and len(dry["removed"]) == 1 and dry["referenced"] == 1
    assert main(["registry", "gc", "--min-age-s", "0"]) == 0
    assert "removed 1 file(s)" in capsys.readouterr().out
    assert main(["registry", "gc", "--min-age-s", "0"]) == 0
    assert "removed 0 file(s)" in capsys.readouterr().out


def test_upgrade_is_idempotent(esper_home: EsperSettings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["registry", "upgrade"]) == 0
    assert "upgraded from empty to" in capsys.readouterr().out
    assert main(["registry", "upgrade"]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_verify_exits_1_listing_a_kernel_whose_blob_was_changed(
    published: KernelArtifact, esper_home: EsperSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["registry", "verify", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"verified": [published.artifact_id], "refused": []}
    urza = Urza.open(esper_home.home)
    blob = urza.blobs.path(published.sha256)
    urza.close()
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    assert main(["registry", "verify"]) == 1
    captured = capsys.readouterr()
    assert "0 artifact(s) verified, 1 refused" in captured.out
    assert f"refused artifact {published.artifact_id}" in captured.err
