"""Tier policy: approvals for experimental and high-risk blueprints, quarantine-only high risk."""

from __future__ import annotations

import pytest

from esper_core.contracts import ArtifactStatus, BlueprintTier
from esper_core.karn.entries import default_catalog
from esper_core.karn.policy import (
    APPROVED_TAG,
    HIGH_RISK_REASON,
    ApprovalRequiredError,
    approval_tags,
    needs_approval,
    publish_status,
    require_approval,
)

CATALOG = default_catalog()


@pytest.mark.parametrize("tier", list(BlueprintTier))
def test_approval_by_tier(tier: BlueprintTier) -> None:
    for descriptor in CATALOG.list(tier=tier):
        require_approval(descriptor, [descriptor.blueprint_id], action="compile")
        if tier is BlueprintTier.SAFE:
            require_approval(descriptor, [], action="compile")
            assert not needs_approval(descriptor) and approval_tags(descriptor) == ()
            continue
        assert approval_tags(descriptor) == (APPROVED_TAG,)
        with pytest.raises(ApprovalRequiredError, match=rf"--approve {descriptor.blueprint_id}") as info:
            require_approval(descriptor, ["residual_mlp"], action="germinate")
        assert f"is {tier.value}: germinate it only with an explicit approval" in str(info.value)
        assert isinstance(info.value, ValueError)


def test_high_risk_is_published_quarantined() -> None:
    for descriptor in CATALOG.list():
        status, reason = publish_status(descriptor)
        if descriptor.tier is BlueprintTier.HIGH_RISK:
            assert (status, reason) == (ArtifactStatus.QUARANTINED, HIGH_RISK_REASON)
        else:
            assert (status, reason) == (ArtifactStatus.ACTIVE, None)
