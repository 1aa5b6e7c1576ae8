"""A shipped policy's first use: digest checked, then published to Urza signed with this
installation's key, once.

The release pins each shipped policy's SHA-256 (``esper_core.tamiyo.shipped``) but cannot sign
it: the signing key is a secret of each installation. So the first run that serves a shipped
policy checks its digest and publishes it as a Simic policy version signed with the local key;
from then on it is served like any version, its signature verified before its weights are
unpickled. Publishing is idempotent (``SimicStore.publish_policy`` finds the same weights by the
same method and returns their version, in one ``BEGIN IMMEDIATE`` transaction), so two
processes that both meet a shipped policy first get the same version, and a second use
publishes nothing.
"""

from __future__ import annotations

import io

import torch

from esper_core.simic.records import IncompatiblePolicyError, PolicyVersion, SimicStore
from esper_core.tamiyo.graph import FEATURE_DIMS, FEATURE_NAMES
from esper_core.tamiyo.model import POLICY_FORMAT, TamiyoGNNConfig
from esper_core.tamiyo.shipped import REFUSED_FIX, ShippedPolicy, read_shipped

METHOD_PREFIX = "shipped:"
"""A shipped policy's version is published by method ``shipped:<name>``."""


def shipped_weights(shipped: ShippedPolicy) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of a digest-checked shipped policy."""
    state: dict[str, torch.Tensor] = torch.load(io.BytesIO(shipped.weights), weights_only=True)
    return state


def require_current_inputs(shipped: ShippedPolicy) -> None:
    """Refuse a shipped policy trained on other graph inputs than this Esper builds.

    ``publish_policy`` stamps a version with the current format and features, so the check a
    served version gets (``PolicyVersion.require_current_inputs``) must be made here first, on
    what the shipped policy recorded when it was trained.

    Raises:
        IncompatiblePolicyError: Its format, feature widths or feature names differ.
    """
    p = shipped.provenance
    current = {nt: list(names) for nt, names in FEATURE_NAMES.items()}
    if (
        p.get("policy_format") != POLICY_FORMAT
        or p.get("feature_dims") != FEATURE_DIMS
        or p.get("graph_features") != current
    ):
        raise IncompatiblePolicyError(
            f"shipped policy {shipped.name!r} was trained on policy format {p.get('policy_format')} with other graph "
            f"inputs than this Esper builds (format {POLICY_FORMAT}): {REFUSED_FIX}"
        )


def publish_shipped(store: SimicStore, name: str) -> PolicyVersion:
    """The registry version of shipped policy ``name``, published (signed) if this is its first use.

    Raises:
        ShippedPolicyError: Unknown name, or weights that are not the released bytes (nothing
            is published).
        IncompatiblePolicyError: It was trained on other graph inputs than Tamiyo builds now.
        RegistryError: The registry cannot be written.
    """
    shipped = read_shipped(name)
    require_current_inputs(shipped)
    return store.publish_policy(
        shipped_weights(shipped),
        gnn=TamiyoGNNConfig(**shipped.gnn),
        method=f"{METHOD_PREFIX}{name}",
        # The provenance travels with the version (and its signature covers it).
        provenance={"shipped": name, "shipped_sha256": shipped.sha256, "training": shipped.provenance},
    )


def shipped_versions(store: SimicStore) -> dict[str, PolicyVersion]:
    """Shipped policies already published in ``store``, by name (the first version of each)."""
    found: dict[str, PolicyVersion] = {}
    for policy in store.policies():
        if policy.method.startswith(METHOD_PREFIX):
            found.setdefault(policy.method.removeprefix(METHOD_PREFIX), policy)
    return found
