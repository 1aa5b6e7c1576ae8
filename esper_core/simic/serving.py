"""Serving Simic's policies: load the chosen version into a running Tamiyo between epochs."""

from __future__ import annotations

import logging

from esper_core.simic.records import IncompatiblePolicyError, PolicyVersion, SimicStore
from esper_core.simic.shipping import publish_shipped, require_current_inputs, shipped_weights
from esper_core.tamiyo.model import TamiyoGNNConfig
from esper_core.tamiyo.service import TamiyoService
from esper_core.tamiyo.shipped import ShippedPolicyError, read_shipped
from esper_core.urza.errors import ArtifactSignatureError, RegistryError, UnsignedArtifactError

log = logging.getLogger(__name__)
_warned: set[str] = set()


def refresh_policy(
    service: TamiyoService, store: SimicStore | None, *, pinned: int | None = None
) -> PolicyVersion | None:
    """Hot-swap the GNN weights ``service`` serves to the pinned or newest stored version.

    Does nothing unless the GNN decides (``policy="gnn"``). Loads weights only when the version
    changed; a registry that cannot be read keeps the weights already served (logged).

    Args:
        service: The running Tamiyo.
        store: Where versions live; None (a registry without SQL) keeps the current weights.
        pinned: A version number to serve instead of the newest.

    Returns:
        The version served now, or None when no trained version is available.

    Raises:
        ValueError: The version's network size differs from the service's (the message says
            which ``TamiyoConfig.gnn`` to use), or the pinned version does not exist.
        IncompatiblePolicyError: The version was trained on other graph feature widths (or
            names) than Tamiyo builds now: retrain with the ``train_policy`` flow.
    """
    if service.config.policy == "shipped":
        return serve_shipped(service, store)
    if service.config.policy != "gnn" or store is None:
        return None
    try:
        policy = store.get_policy(pinned) if pinned is not None else store.latest_policy()
    except RegistryError as e:
        log.warning(
            "could not look up Simic's policy versions (%s); serving %s",
            e,
            service.policy_version or "untrained weights",
        )
        return None
    if policy is None:
        if store.url not in _warned:
            _warned.add(store.url)
            log.warning(
                "no trained Tamiyo policy in %s: the GNN decides with untrained weights; run the train_policy flow",
                store.url,
            )
        return None
    if service.policy_version == policy.label:
        return policy
    policy.require_current_inputs()
    if policy.gnn != service.model.config:
        raise ValueError(
            f"policy {policy.label} was trained with {policy.gnn}, but this Tamiyo runs {service.model.config}: "
            f"set TamiyoConfig.gnn to the stored size or pin another version"
        )
    try:
        weights = store.load_weights(policy)
    except (UnsignedArtifactError, ArtifactSignatureError) as e:
        # Never serve weights that fail verification; the ones already served stay.
        log.error("%s; serving %s", e, service.policy_version or "untrained weights")
        return None
    service.swap_policy(weights, version=policy.label)
    log.info("Tamiyo now serves policy %s (%s)", policy.label, policy.method)
    return policy


def serve_shipped(service: TamiyoService, store: SimicStore | None) -> PolicyVersion | None:
    """Serve the shipped policy ``service.config.shipped``: digest checked, published, verified.

    With a registry database the weights are published there at first use (signed with this
    installation's key, ``simic.shipping``) and served from it, their signature verified; without
    one (a registry without SQL) they are served from the package after the digest check.
    Whatever stops them (a digest that is not the pinned one, inputs this Tamiyo does not build,
    a signature that fails, an unreadable registry) is logged as an error and left in
    ``service.shipped_refused``: the heuristic then decides, and every decision says so, so the
    run is marked degraded. A refusal is final for the service, so that one run never switches
    between the rule and the GNN on the registry's mood.

    Returns:
        The registry version published and served by this call; None when nothing changed
        (served or refused already), when served from the package, or when refused.
    """
    if service.policy_version is not None or service.shipped_refused is not None:
        return None
    name = service.config.shipped
    try:
        version: PolicyVersion | None = None
        if store is None:
            shipped = read_shipped(name)
            require_current_inputs(shipped)
            weights, label, trained = shipped_weights(shipped), name, TamiyoGNNConfig(**shipped.gnn)
        else:
            version = publish_shipped(store, name)
            version.require_current_inputs()
            weights, label, trained = store.load_weights(version), f"{name}/{version.label}", version.gnn
        if (gnn := service.model.config) != trained:
            raise ValueError(
                f"shipped policy {name!r} was trained with {trained}, but this Tamiyo runs {gnn}: "
                "leave TamiyoConfig.gnn at its default to serve it"
            )
    except (
        ShippedPolicyError,
        IncompatiblePolicyError,
        UnsignedArtifactError,
        ArtifactSignatureError,
        RegistryError,
        ValueError,
    ) as e:
        service.shipped_refused = f"shipped policy {name!r} cannot serve: {e}"
        log.error("%s; the heuristic decides this run, which is marked degraded", service.shipped_refused)
        return None
    service.swap_policy(weights, version=label)
    log.info("Tamiyo now serves the shipped policy %s", label)
    return version
