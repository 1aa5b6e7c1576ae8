"""Tier policy: what a blueprint's tier allows.

- ``safe``: compiled, published active and germinated freely.
- ``experimental``: compiled and germinated only with an explicit approval naming the blueprint
  (``--approve ID`` on the command line, ``approve=[...]`` in the flow). Its artifacts carry the
  ``approved`` tag so the approval is visible in the registry and checkable at germination.
- ``high_risk``: quarantine-only. Compiling also needs an approval; the artifact is always
  published QUARANTINED, Urza refuses to make it active, and Kasmina refuses to load it.
"""

from __future__ import annotations

from collections.abc import Collection

from esper_core.contracts import ArtifactStatus, BlueprintDescriptor, BlueprintTier

APPROVED_TAG = "approved"
"""Tag on an artifact whose (experimental or high-risk) blueprint was explicitly approved."""

HIGH_RISK_REASON = "high_risk tier: quarantine-only (kept for offline evaluation, never germinated)"


class ApprovalRequiredError(ValueError):
    """An experimental or high-risk blueprint was used without an explicit approval."""


def needs_approval(descriptor: BlueprintDescriptor) -> bool:
    """True for tiers that need an explicit approval (experimental, high-risk)."""
    return descriptor.tier is not BlueprintTier.SAFE


def require_approval(descriptor: BlueprintDescriptor, approved: Collection[str], *, action: str) -> None:
    """Refuse ``action`` on a non-safe blueprint that ``approved`` does not name.

    Args:
        descriptor: The blueprint.
        approved: Blueprint ids explicitly approved for this operation.
        action: What is being done, e.g. ``compile`` (named in the error).

    Raises:
        ApprovalRequiredError: The message says how to approve it.
    """
    if needs_approval(descriptor) and descriptor.blueprint_id not in approved:
        extra = " (its artifacts are published quarantined)" if descriptor.tier is BlueprintTier.HIGH_RISK else ""
        raise ApprovalRequiredError(
            f"blueprint {descriptor.blueprint_id!r} is {descriptor.tier.value}: {action} it only with an "
            f"explicit approval{extra}; pass --approve {descriptor.blueprint_id} (flow parameter "
            f"approve=[{descriptor.blueprint_id!r}]) if you accept its risk {descriptor.risk:.2f}"
        )


def publish_status(descriptor: BlueprintDescriptor) -> tuple[ArtifactStatus, str | None]:
    """The status a freshly compiled artifact of this blueprint may be published with at best.

    Returns:
        ``(QUARANTINED, reason)`` for high-risk blueprints, else ``(ACTIVE, None)``.
    """
    if descriptor.tier is BlueprintTier.HIGH_RISK:
        return ArtifactStatus.QUARANTINED, HIGH_RISK_REASON
    return ArtifactStatus.ACTIVE, None


def approval_tags(descriptor: BlueprintDescriptor) -> tuple[str, ...]:
    """Tags recording an approval on the artifacts of a non-safe blueprint."""
    return (APPROVED_TAG,) if needs_approval(descriptor) else ()
