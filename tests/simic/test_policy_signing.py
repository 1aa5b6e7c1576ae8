"""Simic's policy versions are signed: swapped weights or an edited row never reach Tamiyo."""

from __future__ import annotations

import io
import json

import pytest
import torch
from sqlalchemy import update

from esper_core.simic.models import PolicyRow
from esper_core.simic.policy_signing import resign_policies
from esper_core.simic.records import SimicStore
from esper_core.simic.serving import refresh_policy
from esper_core.tamiyo.config import PolicyCompileConfig, TamiyoConfig
from esper_core.tamiyo.model import POLICY_FORMAT, TamiyoGNN, TamiyoGNNConfig
from esper_core.tamiyo.service import TamiyoService
from esper_core.urza.errors import ArtifactSignatureError, UnsignedArtifactError
from esper_core.urza.signing import ArtifactSigner, SigningKey

SMALL = TamiyoGNNConfig(hidden_dim=8, num_layers=1)


def _publish(store: SimicStore, seed: int = 0) -> int:
    torch.manual_seed(seed)
    return store.publish_policy(TamiyoGNN(SMALL).state_dict(), gnn=SMALL, method="imitation", provenance={}).version


def _rewrite(store: SimicStore, version: int, **columns: object) -> None:
    with store.engine.begin() as conn:
        conn.execute(update(PolicyRow).where(PolicyRow.version == version).values(**columns))


def _no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a refused policy reached torch.load")

    monkeypatch.setattr(torch, "load", refuse)


def test_a_published_policy_is_signed_and_loads(store: SimicStore) -> None:
    policy = store.get_policy(_publish(store))
    assert policy.signature is not None and policy.signature_key_id == store.signer.active.key_id
    assert set(store.load_weights(policy)) == set(TamiyoGNN(SMALL).state_dict())


def test_swapped_weights_are_refused_before_unpickling(store: SimicStore, monkeypatch: pytest.MonkeyPatch) -> None:
    version = _publish(store)
    buffer = io.BytesIO()
    torch.manual_seed(7)
    torch.save(TamiyoGNN(SMALL).state_dict(), buffer)
    evil = buffer.getvalue()
    _rewrite(store, version, sha256=store.blobs.put(evil), size_bytes=len(evil))
    _no_unpickling(monkeypatch)
    with pytest.raises(ArtifactSignatureError, match="Simic policy v1 is refused.*train_policy"):
        store.load_weights(store.get_policy(version))


def test_an_edited_row_is_refused(store: SimicStore) -> None:
    version = _publish(store)
    _rewrite(store, version, method="ppo")
    with pytest.raises(ArtifactSignatureError, match="does not match"):
        store.load_weights(store.get_policy(version))


def test_tamiyo_keeps_its_weights_when_the_newest_policy_is_mis_signed(store: SimicStore) -> None:
    service = TamiyoService(TamiyoConfig(policy="gnn", gnn=SMALL, compile=PolicyCompileConfig(enabled=False)))
    _publish(store)
    assert refresh_policy(service, store) is not None and service.policy_version == "v1"
    v2 = _publish(store, seed=1)
    # Forged provenance that still claims the current format: only the signature can tell.
    _rewrite(store, v2, provenance_json=json.dumps({"policy_format": POLICY_FORMAT, "runs": ["forged"]}))
    assert refresh_policy(service, store) is None and service.policy_version == "v1"


def test_unsigned_and_old_key_versions_are_resigned(store: SimicStore) -> None:
    old = _publish(store)
    tampered = _publish(store, seed=1)
    legacy = _publish(store, seed=2)
    _rewrite(store, legacy, signature=None, signature_key_id=None)
    _rewrite(store, tampered, method="ppo")
    with pytest.raises(UnsignedArtifactError, match="esper registry resign"):
        store.load_weights(store.get_policy(legacy))
    rotated = ArtifactSigner(SigningKey("new-key", b"n" * 40), [store.signer.active])
    resigned, refused = resign_policies(store, rotated, dry_run=False)
    assert resigned == [old, legacy] and [v for v, _ in refused] == [tampered]
    # The old key can go now.
    new_only = SimicStore(store.engine, store.blobs, url=store.url, signer=ArtifactSigner(rotated.active))
    assert new_only.get_policy(old).signature_key_id == "new-key"
    new_only.load_weights(new_only.get_policy(old))
    new_only.load_weights(new_only.get_policy(legacy))
