"""TamiyoService: graph + GNN forward + the deciding policy + the risk engine in one call."""

from __future__ import annotations

import pytest
import torch

from esper_core.contracts import CommandType, SeedOperation
from esper_core.tamiyo.config import PeriodicPolicyConfig, PolicyCompileConfig, ScheduledGermination, TamiyoConfig
from esper_core.tamiyo.model import ACTION_NAMES, TamiyoGNN, TamiyoGNNConfig
from esper_core.tamiyo.risk import RiskConfig
from esper_core.tamiyo.service import SHADOW_NOTE, TamiyoService
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history

SMALL = TamiyoGNNConfig(hidden_dim=32)
EAGER = PolicyCompileConfig(enabled=False)  # compiling is tested in test_build.py


@pytest.fixture
def service() -> TamiyoService:
    torch.manual_seed(0)
    return TamiyoService(TamiyoConfig(policy="heuristic", gnn=SMALL))


def test_decide_returns_heuristic_command_with_gnn_scores(service: TamiyoService) -> None:
    # Epoch 1 with slot0 dormant and nothing tried yet: the probe germinates.
    history = synthetic_history(num_epochs=2, num_layers=3, num_slots=1)
    decision = service.decide(history, synthetic_candidates(3), run_id="run-1", total_epochs=10)
    command = decision.command
    assert command.issued_by == "heuristic" and command.run_id == "run-1" and command.epoch == 1
    assert (command.command_type, command.seed_operation) == (CommandType.SEED, SeedOperation.GERMINATE)
    assert (command.slot_id, command.blueprint_id) == ("slot0", "bp0")
    assert command.reason.endswith(SHADOW_NOTE) and command.risk_rule is None
    assert set(command.scores) == {f"gnn.{name}" for name in ACTION_NAMES}
    assert decision.action_probs == {name: command.scores[f"gnn.{name}"] for name in ACTION_NAMES}
    assert sum(decision.action_probs.values()) == pytest.approx(1.0, abs=1e-5)
    assert decision.gnn_latency_ms > 0.0 and 0.0 < decision.coverage <= 1.0
    assert decision.policy == "heuristic" and decision.log_prob is None and decision.proposal == command
    assert not decision.compiled and not decision.compile_enabled and decision.compile_fallbacks == 0


def test_decide_waits_while_seed_in_flight(service: TamiyoService) -> None:
    history = synthetic_history(num_epochs=3, num_layers=3, num_slots=2)  # slot1 TRAINING
    decision = service.decide(history, synthetic_candidates(3), run_id="run-1")
    assert decision.command.command_type is CommandType.WAIT
    assert "in flight" in decision.command.reason


def test_empty_history_raises(service: TamiyoService) -> None:
    with pytest.raises(ValueError, match="history is empty"):
        service.decide([], synthetic_candidates(), run_id="run-1")


def test_the_shipped_policy_decides_once_served_and_the_rule_says_why_until_then() -> None:
    torch.manual_seed(0)
    service = TamiyoService(TamiyoConfig(policy="shipped", compile=EAGER))
    history, candidates = synthetic_history(num_epochs=2, num_slots=3), synthetic_candidates(3)
    unserved = service.decide(history, candidates, run_id="r")
    assert unserved.policy == "heuristic" and unserved.proposal.issued_by == "heuristic"
    assert unserved.fallback == "shipped policy 'zoo-1' was not loaded"
    service.shipped_refused = "shipped policy 'zoo-1' cannot serve: test"
    assert service.decide(history, candidates, run_id="r").fallback == service.shipped_refused
    service.swap_policy(service.state_dict(), version="zoo-1/v1")
    served = service.decide(history, candidates, run_id="r")
    assert served.policy == "gnn" and served.fallback is None and served.log_prob is not None
    assert served.proposal.issued_by == "gnn:zoo-1/v1" and served.policy_version == "zoo-1/v1"


def test_gnn_policy_proposes_a_legal_command_with_its_log_prob() -> None:
    torch.manual_seed(0)
    service = TamiyoService(TamiyoConfig(policy="gnn", gnn=SMALL, compile=EAGER))
    history, candidates = synthetic_history(num_epochs=2, num_slots=3), synthetic_candidates(3)
    decision = service.decide(history, candidates, run_id="r")
    proposal = decision.proposal
    assert proposal.issued_by == "gnn:untrained" and decision.log_prob is not None and decision.log_prob <= 0
    assert {"gnn.value", "gnn.risk", "gnn.log_prob"} <= set(proposal.scores)
    assert decision.value is not None and 0.0 < (decision.predicted_risk or 0.0) < 1.0
    # Same run and epoch, same decision: a retried task decides the same, sampled or not.
    again = service.decide(history, candidates, run_id="r").proposal
    assert (again.action, again.slot_id, again.blueprint_id) == (
        proposal.action,
        proposal.slot_id,
        proposal.blueprint_id,
    )


def test_explore_samples_reproducibly_per_run_and_epoch() -> None:
    torch.manual_seed(0)
    service = TamiyoService(TamiyoConfig(policy="gnn", explore=True, gnn=SMALL, compile=EAGER))
    history, candidates = synthetic_history(num_epochs=2, num_slots=3), synthetic_candidates(3)
    first = [service.decide(history, candidates, run_id=f"r{i}").log_prob for i in range(8)]
    second = [service.decide(history, candidates, run_id=f"r{i}").log_prob for i in range(8)]
    assert first == second and len(set(first)) > 1


def test_random_and_none_policies() -> None:
    history, candidates = synthetic_history(num_epochs=2, num_slots=1), synthetic_candidates(3)
    none = TamiyoService(TamiyoConfig(policy="none", gnn=SMALL)).decide(history, candidates, run_id="r")
    assert none.command.command_type is CommandType.WAIT and none.command.issued_by == "none"
    rand = TamiyoService(TamiyoConfig(policy="random", gnn=SMALL))
    actions = {rand.decide(history, candidates, run_id=f"r{i}").command.action for i in range(20)}
    assert actions == {"wait", "germinate"}


def test_periodic_policy_germinates_every_k_epochs_into_the_first_free_slot() -> None:
    candidates = synthetic_candidates(3)
    service = TamiyoService(TamiyoConfig(policy="periodic", gnn=SMALL, periodic=PeriodicPolicyConfig(every=3)))
    actions = []
    for epochs in range(1, 7):
        history = synthetic_history(num_epochs=epochs, num_slots=2)
        command = service.decide(history, candidates, run_id="r").command
        actions.append(command.action)
        if command.action == "germinate":
            assert command.issued_by == "periodic" and command.slot_id == history[-1].seeds[0].slot_id
            assert command.blueprint_id is not None
    assert actions == ["wait", "wait", "germinate", "wait", "wait", "germinate"]
    with pytest.raises(ValueError, match="every must be >= 1"):
        PeriodicPolicyConfig(every=0)


def test_scheduled_policy_germinates_what_the_schedule_says_and_skips_a_busy_slot() -> None:
    candidates = synthetic_candidates(3)
    dormant = synthetic_history(num_epochs=1, num_slots=2)[-1].seeds[0]
    fitting = next(c.blueprint_id for c in candidates if c.fits(dormant.shape_profile))
    schedule = (
        ScheduledGermination(epoch=1, slot=dormant.slot_id, blueprint=fitting),
        ScheduledGermination(epoch=3, slot="slot1", blueprint=fitting),  # slot1 holds a seed: skipped
    )
    service = TamiyoService(TamiyoConfig(policy="scheduled", gnn=SMALL, schedule=schedule))
    commands = []
    for epochs in range(1, 6):
        history = synthetic_history(num_epochs=epochs, num_slots=2)
        commands.append(service.decide(history, candidates, run_id="r").proposal)
    assert [c.action for c in commands] == ["wait", "germinate", "wait", "wait", "wait"]
    assert (commands[1].slot_id, commands[1].blueprint_id, commands[1].issued_by) == (
        dormant.slot_id,
        fitting,
        "scheduled",
    )
    assert "skipped the germination at epoch 3: slot slot1 is" in commands[3].reason


def test_a_bad_schedule_is_refused_with_its_fix() -> None:
    g = ScheduledGermination(epoch=2, slot="slot1", blueprint="bp0")
    with pytest.raises(ValueError, match="needs TamiyoConfig.schedule"):
        TamiyoConfig(policy="scheduled")
    with pytest.raises(ValueError, match="only by policy='scheduled'"):
        TamiyoConfig(policy="heuristic", schedule=(g,))
    with pytest.raises(ValueError, match="share an epoch"):
        TamiyoConfig(policy="scheduled", schedule=(g, ScheduledGermination(epoch=2, slot="slot2", blueprint="bp0")))
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        ScheduledGermination(epoch=-1, slot="slot1", blueprint="bp0")


def test_the_risk_engine_reviews_every_policy() -> None:
    # bp2 is the HIGH_RISK candidate: the random policy may pick it, the engine downgrades it.
    history = synthetic_history(num_epochs=2, num_slots=1)
    service = TamiyoService(TamiyoConfig(policy="random", gnn=SMALL, risk=RiskConfig(quarantined=("bp0",))))
    commands = [service.decide(history, synthetic_candidates(3), run_id=f"r{i}").command for i in range(30)]
    germinations = [c for c in commands if c.action == "germinate"]
    assert germinations and all(c.blueprint_id == "bp1" for c in germinations)
    assert any(c.risk_rule and "blueprint" in c.risk_rule for c in germinations)


def test_swap_policy_changes_what_is_served(service: TamiyoService) -> None:
    history, candidates = synthetic_history(), synthetic_candidates()
    torch.manual_seed(123)
    other = TamiyoService(TamiyoConfig(gnn=SMALL), model=TamiyoGNN(SMALL))
    before = other.decide(history, candidates, run_id="r").action_probs
    other.swap_policy(service.state_dict(), version="v7")
    after = other.decide(history, candidates, run_id="r")
    expected = service.decide(history, candidates, run_id="r").action_probs
    assert after.action_probs == pytest.approx(expected) and before != pytest.approx(expected)
    assert after.policy_version == "v7"


def test_config_rejects_unknown_device_policy_and_misplaced_explore() -> None:
    with pytest.raises(ValueError, match="device"):
        TamiyoConfig(device="tpu-9000")
    with pytest.raises(ValueError, match="policy must be one of"):
        TamiyoConfig(policy="oracle")
    with pytest.raises(ValueError, match="explore"):
        TamiyoConfig(policy="heuristic", explore=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised when CUDA is absent")
def test_config_rejects_cuda_without_a_gpu() -> None:
    with pytest.raises(ValueError, match="set device='cpu'"):
        TamiyoConfig(device="cuda")


def test_shadow_scoring_can_be_left_out_and_added_after_the_decision(service: TamiyoService) -> None:
    history, candidates = synthetic_history(num_epochs=2, num_layers=3, num_slots=1), synthetic_candidates(3)
    bare = service.decide(history, candidates, run_id="run-1", total_epochs=10, shadow=False)
    assert bare.action_probs is None and bare.gnn_latency_ms == 0.0 and not bare.command.scores
    assert not bare.command.reason.endswith(SHADOW_NOTE)
    full = service.decide(history, candidates, run_id="run-1", total_epochs=10)
    shadowed = service.add_shadow(bare, history, candidates, total_epochs=10)
    assert shadowed.command.reason == full.command.reason and shadowed.command.scores == full.command.scores
    assert shadowed.action_probs == full.action_probs and shadowed.proposal == shadowed.command
    assert service.add_shadow(shadowed, history, candidates, total_epochs=10) is shadowed  # scored once


def test_a_failing_shadow_forward_leaves_the_decision_as_it_was(
    service: TamiyoService, caplog: pytest.LogCaptureFixture
) -> None:
    history, candidates = synthetic_history(num_epochs=2, num_layers=3, num_slots=1), synthetic_candidates(3)
    bare = service.decide(history, candidates, run_id="run-1", shadow=False)
    service.policy.model.action_head = None  # type: ignore[assignment]  # the forward now raises
    with caplog.at_level("ERROR", logger="esper_core.tamiyo.service"):
        assert service.add_shadow(bare, history, candidates) is bare
    assert "shadow GNN scoring failed" in caplog.text
