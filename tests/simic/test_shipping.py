"""The shipped policy: weights in the package, pinned by SHA-256, signed and published at first use."""

from __future__ import annotations

import hashlib
import multiprocessing
from pathlib import Path

import pytest

from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.simic.serving import serve_shipped
from esper_core.simic.shipping import METHOD_PREFIX, publish_shipped, shipped_versions
from esper_core.tamiyo import shipped
from esper_core.tamiyo.config import PolicyCompileConfig, TamiyoConfig
from esper_core.tamiyo.service import TamiyoService
from esper_core.tamiyo.shipped import ShippedPolicyError, provenance, read_shipped
from esper_core.urza.errors import ArtifactSignatureError
from tests.helpers.shipped import make_shipped, publish_in_child


def _store(settings: EsperSettings) -> SimicStore:
    return SimicStore.open(settings.home)


def test_the_package_ships_the_default_policy_with_its_pinned_digest_and_provenance() -> None:
    # The release's promise: the file in the package is the one whose digest is pinned in code.
    policy = read_shipped(shipped.DEFAULT_SHIPPED)
    assert policy.sha256 == shipped.SHIPPED[shipped.DEFAULT_SHIPPED]
    record = provenance(shipped.DEFAULT_SHIPPED)
    # How it was trained and why this version: chosen on the selection seeds, never evaluation's.
    assert record["commit"] and record["command"].startswith("python -m bench.zoo_policy")
    assert record["selection"]["chosen"]["label"] == f"v{record['trained_version']}"
    assert not set(record["seeds"]["selection"]) & set(record["seeds"]["train"])
    assert {"heuristic", "none", "versions"} <= set(record["selection"])


def test_weights_that_are_not_the_released_bytes_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_shipped(tmp_path / "policies", monkeypatch)
    path = tmp_path / "policies" / "zoo-1.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ShippedPolicyError) as e:
        read_shipped("zoo-1")
    message = str(e.value)
    assert hashlib.sha256(bytes(data)).hexdigest() in message and shipped.SHIPPED["zoo-1"] in message
    assert "reinstall Esper" in message
    with pytest.raises(ShippedPolicyError, match="no shipped policy 'zoo-9'; shipped: zoo-1"):
        read_shipped("zoo-9")


def test_a_mismatched_digest_publishes_nothing(
    esper_home: EsperSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_shipped(tmp_path / "policies", monkeypatch)
    monkeypatch.setitem(shipped.SHIPPED, "zoo-1", "0" * 64)
    store = _store(esper_home)
    try:
        with pytest.raises(ShippedPolicyError, match="refusing to serve"):
            publish_shipped(store, "zoo-1")
        assert store.policies() == []
    finally:
        store.close()


def test_first_use_publishes_once_signed_with_this_installations_key(
    esper_home: EsperSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = make_shipped(tmp_path / "policies", monkeypatch)
    store = _store(esper_home)
    try:
        first = publish_shipped(store, "zoo-1")
        again = publish_shipped(store, "zoo-1")
        assert again.version == first.version and len(store.policies()) == 1
        assert first.method == f"{METHOD_PREFIX}zoo-1" and first.provenance["shipped_sha256"] == digest
        assert first.signature is not None and first.signature_key_id == store.signer.active.key_id
        assert shipped_versions(store) == {"zoo-1": first}
        store.load_weights(first)  # the signature verifies
        # Signed here, with this home's key: the same row under another key does not verify.
        (esper_home.home / "signing.key").unlink()
        other = SimicStore.open(esper_home.home)
        try:
            with pytest.raises(ArtifactSignatureError):
                other.load_weights(first)
        finally:
            other.close()
    finally:
        store.close()


def test_two_processes_that_meet_the_shipped_policy_first_publish_it_once(esper_home: EsperSettings) -> None:
    _store(esper_home).close()  # the registry exists; what races is the first use
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(2), ctx.Queue()
    children = [ctx.Process(target=publish_in_child, args=(str(esper_home.home), start, out)) for _ in range(2)]
    for child in children:
        child.start()
    versions = [out.get(timeout=180) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    store = _store(esper_home)
    try:
        assert versions[0] == versions[1]
        assert [p.version for p in store.policies()] == [versions[0]]
    finally:
        store.close()


def _service() -> TamiyoService:
    return TamiyoService(TamiyoConfig(compile=PolicyCompileConfig(enabled=False)))


def test_the_service_serves_the_shipped_weights_from_the_registry(
    esper_home: EsperSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_shipped(tmp_path / "policies", monkeypatch)
    store = _store(esper_home)
    service = _service()
    try:
        served = serve_shipped(service, store)
        assert served is not None and service.policy_version == f"zoo-1/{served.label}"
        assert service.shipped_refused is None
    finally:
        service.close()
        store.close()


def test_a_refused_shipped_policy_leaves_the_service_on_the_rule_and_says_why(
    esper_home: EsperSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_shipped(tmp_path / "policies", monkeypatch)
    monkeypatch.setitem(shipped.SHIPPED, "zoo-1", "0" * 64)
    store = _store(esper_home)
    service = _service()
    try:
        assert serve_shipped(service, store) is None
        assert service.policy_version is None
        assert service.shipped_refused is not None and "refusing to serve" in service.shipped_refused
    finally:
        service.close()
        store.close()
