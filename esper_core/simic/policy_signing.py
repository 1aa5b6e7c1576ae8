"""Simic's policy versions are signed like Urza's kernels (``esper_core.urza.signing``).

Their weights live in Urza's blob store and are loaded into a running Tamiyo, so someone who
can write the blob store and the database could otherwise swap the controller's weights. A
signature covers the weights' bytes and the version's descriptor: parent, method, blob hash and
size, network size, feature widths and provenance (the graph feature names included).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from esper_core.urza.errors import ArtifactSignatureError, CorruptBlobError, MissingBlobError
from esper_core.urza.signing import ArtifactSigner

RETRAIN = "run the train_policy flow"


def policy_descriptor(
    *,
    parent_version: int | None,
    method: str,
    sha256: str,
    size_bytes: int,
    gnn: dict[str, Any],
    feature_dims: dict[str, int],
    provenance: dict[str, Any],
) -> bytes:
    """Canonical bytes of the fields a policy signature covers."""
    fields = {
        "parent_version": parent_version,
        "method": method,
        "sha256": sha256,
        "size_bytes": size_bytes,
        "gnn": gnn,
        "feature_dims": feature_dims,
        "provenance": provenance,
    }
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str).encode()


def descriptor_of(policy: Any) -> bytes:  # noqa: ANN401  (a PolicyVersion; records imports this module)
    """``policy_descriptor`` of a stored ``PolicyVersion``."""
    return policy_descriptor(
        parent_version=policy.parent_version,
        method=policy.method,
        sha256=policy.sha256,
        size_bytes=policy.size_bytes,
        gnn=dataclasses.asdict(policy.gnn),
        feature_dims=policy.feature_dims,
        provenance=policy.provenance,
    )


def sign_policy(signer: ArtifactSigner, values: dict[str, Any], blob: bytes) -> dict[str, str]:
    """The signature columns of a new ``simic_policies`` row (``values``: its JSON text columns)."""
    descriptor = policy_descriptor(
        parent_version=values["parent_version"],
        method=values["method"],
        sha256=values["sha256"],
        size_bytes=values["size_bytes"],
        gnn=json.loads(values["gnn_config_json"]),
        feature_dims=json.loads(values["feature_dims_json"]),
        provenance=json.loads(values["provenance_json"]),
    )
    return {"signature": signer.sign_bytes(descriptor, blob), "signature_key_id": signer.active.key_id}


def verify_policy(signer: ArtifactSigner, policy: Any, blob: bytes) -> None:  # noqa: ANN401
    """Refuse an unsigned or mis-signed policy version before its weights are unpickled.

    Raises:
        UnsignedArtifactError: Published before signatures (``esper registry resign``).
        ArtifactSignatureError: Its weights or descriptor changed after signing, or its key is unknown.
    """
    signer.verify_bytes(
        f"Simic policy {policy.label}",
        policy.signature,
        policy.signature_key_id,
        descriptor_of(policy),
        blob,
        fix=RETRAIN,
    )


def resign_policies(store: Any, signer: ArtifactSigner, *, dry_run: bool) -> tuple[list[int], list[tuple[int, str]]]:  # noqa: ANN401
    """Sign every policy version that is unsigned or signed with an older key (see ``Urza.resign``).

    Args:
        store: A ``SimicStore``.
        signer: The keys (the active one signs).
        dry_run: Report only.

    Returns:
        The versions (re-)signed, and those refused with why (they do not verify: retrain).
    """
    resigned: list[int] = []
    refused: list[tuple[int, str]] = []
    for policy in store.policies():
        if policy.signature is not None and policy.signature_key_id == signer.active.key_id:
            continue
        try:
            blob = store.blobs.get(policy.sha256)
            if policy.signature is not None:
                verify_policy(signer, policy, blob)
        except (ArtifactSignatureError, CorruptBlobError, MissingBlobError) as e:
            refused.append((policy.version, str(e)))
            continue
        if not dry_run:
            store.set_policy_signature(
                policy.version, signature=signer.sign_bytes(descriptor_of(policy), blob), key_id=signer.active.key_id
            )
        resigned.append(policy.version)
    return resigned, refused
