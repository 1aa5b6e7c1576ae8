"""Signed artifacts: Urza refuses an unsigned or mis-signed artifact before anything loads it.

The threat is someone who can write both the blob store and the database (the SHA-256 rows catch
corruption, not them): each test changes the registry the way they could, with plain SQL and
files, and checks that the kernel never reaches a deserialiser.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from esper_cli.main import main
from esper_core.contracts import KernelArtifact
from esper_core.karn.entries import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina import loader
from esper_core.kasmina.loader import load_for_slot
from esper_core.pipeline import compile_job, job_for, publish_kernel
from esper_core.settings import EsperSettings
from esper_core.tezzeret.compiler import CompiledKernel
from esper_core.tezzeret.config import TezzeretConfig
from esper_core.urza import schema
from esper_core.urza.blobs import sha256_hex
from esper_core.urza.errors import ArtifactSignatureError, UnsignedArtifactError
from esper_core.urza.models import ArtifactRow
from esper_core.urza.service import Urza
from esper_core.urza.signing import KEY_FILE_NAME, ArtifactSigner, SigningKey, local_key
from esper_core.urza.sql import upgrade_schema
from esper_core.urza.sql_rows import to_row
from tests.urza.revisions import migrate

PROFILE = ShapeProfile(feature_shape=(8,), batch_max=16)
KEY_A = SigningKey("key-a", b"a" * 40)
KEY_B = SigningKey("key-b", b"b" * 40)


@pytest.fixture(scope="module")
def kernel() -> CompiledKernel:
    catalog = default_catalog()
    return compile_job(
        catalog, job_for(catalog, "lowrank_adapter", PROFILE.name), "cpu", config=TezzeretConfig(timing_iters=2)
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "esper"


@pytest.fixture
def published(home: Path, registry_url: str, kernel: CompiledKernel) -> Iterator[KernelArtifact]:
    urza = Urza.open(home, registry_url, signer=ArtifactSigner(KEY_A))
    try:
        yield publish_kernel(urza, default_catalog(), kernel)
    finally:
        urza.close()


def _sql(url: str, statement: str, **values: object) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(statement), values)
    engine.dispose()


def _no_deserialising(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a refused artifact reached the deserialiser")

    for name in ("decode_exported", "decode_bundle", "_load_eager"):
        monkeypatch.setattr(loader, name, refuse)


def _refused(urza: Urza, error: type[Exception], match: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_deserialising(monkeypatch)
    with pytest.raises(error, match=match):
        load_for_slot(urza, "lowrank_adapter", PROFILE, catalog=default_catalog(), prewarm=False)
    [event] = urza.drain_events()
    assert event.name == "urza.signature.refused" and event.level.value == "error"
    assert urza.drain_events() == []


def test_published_artifacts_are_signed_and_load(
    home: Path, registry_url: str, published: KernelArtifact, kernel: CompiledKernel
) -> None:
    assert published.signature_key_id == "key-a" and published.signature is not None
    urza = Urza.open(home, registry_url, signer=ArtifactSigner(KEY_A))
    try:
        loaded = load_for_slot(urza, "lowrank_adapter", PROFILE, catalog=default_catalog(), prewarm=False)
        assert loaded.artifact.signature == published.signature
        # Publishing the same blob again keeps the row and its signature.
        assert publish_kernel(urza, default_catalog(), kernel) == published
    finally:
        urza.close()


def test_a_swapped_blob_with_a_matching_row_is_refused(
    home: Path, registry_url: str, published: KernelArtifact, monkeypatch: pytest.MonkeyPatch
) -> None:
    urza = Urza.open(home, registry_url, signer=ArtifactSigner(KEY_A))
    try:
        # Another program in the blob store, and the row pointed at it: every SHA-256 check passes.
        evil = urza.blobs.get(published.sha256) + b"\x00payload"
        urza.blobs.put(evil)
        _sql(
            registry_url,
            "UPDATE artifacts SET sha256 = :sha, size_bytes = :size WHERE id = :id",
            sha=sha256_hex(evil),
            size=len(evil),
            id=published.artifact_id,
        )
        _refused(urza, ArtifactSignatureError, "does not match its blob and descriptor", monkeypatch)
    finally:
        urza.close()


def test_a_tampered_descriptor_row_is_refused(
    home: Path, registry_url: str, published: KernelArtifact, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = json.loads(published.guard.to_json())
    guard["batch_max"] = 4096  # would let Kasmina call the kernel on batches it was never checked for
    _sql(
        registry_url,
        "UPDATE artifacts SET guard_json = :g WHERE id = :id",
        g=json.dumps(guard),
        id=published.artifact_id,
    )
    urza = Urza.open(home, registry_url, signer=ArtifactSigner(KEY_A))
    try:
        _refused(urza, ArtifactSignatureError, r"esper registry quarantine \d+", monkeypatch)
    finally:
        urza.close()


def test_a_signature_by_another_key_is_refused(
    home: Path, registry_url: str, published: KernelArtifact, monkeypatch: pytest.MonkeyPatch
) -> None:
    del published
    # The same key id with another secret: a forged signature.
    forger = Urza.open(home, registry_url, signer=ArtifactSigner(SigningKey("key-a", b"f" * 40)))
    try:
        _refused(forger, ArtifactSignatureError, "does not match", monkeypatch)
    finally:
        forger.close()
    stranger = Urza.open(home, registry_url, signer=ArtifactSigner(KEY_B))
    try:
        _refused(stranger, ArtifactSignatureError, "key 'key-a', which this installation does not hold", monkeypatch)
    finally:
        stranger.close()


def test_a_rotated_key_verifies_until_everything_is_resigned(
    home: Path, registry_url: str, published: KernelArtifact
) -> None:
    rotated = Urza.open(home, registry_url, signer=ArtifactSigner(KEY_B, [KEY_A]))
    try:
        load_for_slot(rotated, "lowrank_adapter", PROFILE, catalog=default_catalog(), prewarm=False)
        report = rotated.resign(dry_run=True)
        assert (report.resigned, report.current, report.dry_run) == ((published.artifact_id,), (), True)
        assert rotated.store.get(published.artifact_id or 0).signature_key_id == "key-a"
        report = rotated.resign()
        assert (report.key_id, report.resigned, report.refused) == ("key-b", (published.artifact_id,), ())
        assert rotated.resign().current == (published.artifact_id,)
    finally:
        rotated.close()
    # The old key can go now.
    new_only = Urza.open(home, registry_url, signer=ArtifactSigner(KEY_B))
    try:
        loaded = load_for_slot(new_only, "lowrank_adapter", PROFILE, catalog=default_catalog(), prewarm=False)
        assert loaded.artifact.signature_key_id == "key-b"
    finally:
        new_only.close()


def test_resign_never_launders_a_tampered_artifact(home: Path, registry_url: str, published: KernelArtifact) -> None:
    _sql(registry_url, "UPDATE artifacts SET fallback_reason = 'x' WHERE id = :id", id=published.artifact_id)
    rotated = Urza.open(home, registry_url, signer=ArtifactSigner(KEY_B, [KEY_A]))
    try:
        report = rotated.resign()
        [(artifact_id, why)] = report.refused
        assert artifact_id == published.artifact_id and "does not match" in why and report.resigned == ()
        assert rotated.store.get(artifact_id).signature_key_id == "key-a"
    finally:
        rotated.close()


def test_already_signed_never_vouches_for_a_row_changed_after_signing(
    home: Path, registry_url: str, published: KernelArtifact
) -> None:
    # Signed with the key that signs now, then its descriptor changed: resign must not call it
    # "already signed", and verify must list it.
    urza = Urza.open(home, registry_url, signer=ArtifactSigner(KEY_A))
    try:
        assert urza.verify_all().verified == (published.artifact_id,) and urza.resign(dry_run=True).refused == ()
        _sql(registry_url, "UPDATE artifacts SET fallback_reason = 'x' WHERE id = :id", id=published.artifact_id)
        report = urza.resign(dry_run=True)
        assert report.current == () and [i for i, _ in report.refused] == [published.artifact_id]
        verified = urza.verify_all()
        [(artifact_id, why)] = verified.refused
        assert verified.verified == () and artifact_id == published.artifact_id and "does not match" in why
    finally:
        urza.close()


def test_a_legacy_unsigned_row_is_refused_until_resigned(
    home: Path, registry_url: str, kernel: CompiledKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A registry an Esper without signatures wrote (revision 0004), holding one real kernel.
    migrate(registry_url, "0004")
    descriptor = default_catalog().get("lowrank_adapter").descriptor
    _sql(
        registry_url,
        "INSERT INTO blueprints (blueprint_id, name, tier, descriptor_json, created_at) "
        "VALUES (:id, :name, :tier, :d, CURRENT_TIMESTAMP)",
        id=descriptor.blueprint_id,
        name=descriptor.name,
        tier=descriptor.tier.value,
        d=descriptor.to_json(),
    )
    row = to_row(kernel.artifact, version=1)
    columns = [
        c.name
        for c in ArtifactRow.__table__.columns
        if c.name not in ("id", "signature", "signature_key_id", "created_at")
    ]
    _sql(
        registry_url,
        f"INSERT INTO artifacts ({', '.join(columns)}, created_at) "
        f"VALUES ({', '.join(':' + c for c in columns)}, CURRENT_TIMESTAMP)",
        **{c: getattr(row, c) for c in columns},
    )
    assert upgrade_schema(registry_url) == ("0004", schema.head_revision())
    urza = Urza.open(home, registry_url, signer=ArtifactSigner(KEY_A))
    try:
        urza.blobs.put(kernel.blob)
        [legacy] = urza.store.list_artifacts()
        assert legacy.signature is None  # the migration vouches for nothing
        _refused(urza, UnsignedArtifactError, "not signed.*esper registry resign", monkeypatch)
        monkeypatch.undo()
        assert urza.resign().resigned == (legacy.artifact_id,)
        load_for_slot(urza, "lowrank_adapter", PROFILE, catalog=default_catalog(), prewarm=False)
        # An unsigned copy made before (a checkpoint's) is served by its row, now signed...
        assert urza.fetch_blob(legacy) == kernel.blob
        # ...but only if it describes the same kernel.
        other = legacy.model_copy(update={"fallback_reason": "x"})
        with pytest.raises(UnsignedArtifactError):
            urza.fetch_blob(other)
    finally:
        urza.close()


def test_cli_resign_signs_with_the_configured_key(
    esper_home: EsperSettings,
    kernel: CompiledKernel,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    urza = Urza.open(esper_home.home)  # no key configured: the local key, made now
    try:
        stored = publish_kernel(urza, default_catalog(), kernel)
    finally:
        urza.close()
    local_id = (esper_home.home / KEY_FILE_NAME).read_text().partition(":")[0]
    assert stored.signature_key_id == local_id
    monkeypatch.setenv("ESPER_SIGNING_KEY", "prod-1:" + "p" * 40)
    assert main(["registry", "resign", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["key_id"], report["resigned"], report["refused"]) == ("prod-1", [stored.artifact_id], [])
    assert main(["registry", "resign"]) == 0
    assert "signed 0 artifact(s) with key prod-1; 1 already signed with it" in capsys.readouterr().out


def test_bad_keys_are_refused_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ESPER_HOME", str(tmp_path))
    monkeypatch.setenv("ESPER_SIGNING_KEY", "no-separator")
    with pytest.raises(ValueError, match="ESPER_SIGNING_KEY must be '<key id>:<secret>'"):
        ArtifactSigner.from_settings(EsperSettings())
    monkeypatch.setenv("ESPER_SIGNING_KEY", "prod:short")
    with pytest.raises(ValueError, match="at least 32 are needed.*secrets.token_hex"):
        ArtifactSigner.from_settings(EsperSettings())
    monkeypatch.delenv("ESPER_SIGNING_KEY")
    key = local_key(tmp_path)
    (tmp_path / KEY_FILE_NAME).chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        ArtifactSigner.from_settings(EsperSettings())
    (tmp_path / KEY_FILE_NAME).chmod(0o600)
    assert ArtifactSigner.from_settings(EsperSettings()).active == key


_FIRST_USE = """
import sys, time
from pathlib import Path
from esper_core.urza.signing import local_key
go = Path(sys.argv[2])
while not go.exists():  # start together: every process finds no key file
    time.sleep(0.001)
key = local_key(Path(sys.argv[1]))
print(key.key_id, key.secret.decode())
"""


def test_concurrent_first_uses_agree_on_one_key(tmp_path: Path) -> None:
    home, go = tmp_path / "home", tmp_path / "go"
    processes = [
        subprocess.Popen([sys.executable, "-c", _FIRST_USE, str(home), str(go)], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    go.touch()
    outputs = [p.communicate(timeout=120)[0] for p in processes]
    assert all(p.returncode == 0 for p in processes), outputs
    assert len(set(outputs)) == 1, outputs
    key_file = home / KEY_FILE_NAME
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key_file.read_text().replace(":", " ") == outputs[0]
    assert [p.name for p in home.iterdir()] == [KEY_FILE_NAME]  # no temporary file left behind
    assert os.access(key_file, os.R_OK)


def test_a_run_rejects_a_mis_signed_kernel_and_reports_it(compiled_home: EsperSettings) -> None:
    from esper_core.run.commits import epoch_tag
    from esper_core.run.session import Run
    from esper_core.run.spec import RunSpec

    _sql(compiled_home.registry_db_url, "UPDATE artifacts SET signature = :s", s="0" * 64)
    session = Run.start(RunSpec(recipe="digits-mlp", epochs=3, device="cpu", run_id="forged"), settings=compiled_home)
    outcomes = []
    try:
        for epoch in range(3):
            session.train_epoch()
            session.commit(epoch_tag(epoch, "trained"))
            command = session.decide()
            outcomes.append((command.action, session.apply(command)))
            session.commit(epoch_tag(epoch, "applied"))
    finally:
        session.close()
    # The run goes on without the kernel: the germination is rejected, nothing was loaded.
    rejected = [o for a, o in outcomes if a == "germinate"]
    assert rejected and all(o.startswith("rejected:") and "refused before loading" in o for o in rejected)
    assert all(s.blueprint_id is None for s in session.history[-1].seeds)
    lines = (compiled_home.runs_dir / "forged" / "telemetry.jsonl").read_text().splitlines()
    refused = [e for line in lines for e in json.loads(line)["events"] if e["name"] == "urza.signature.refused"]
    assert refused and refused[0]["attributes"]["reason"] == "mismatch"
