"""Simic's learning rules: imitation of recorded decisions, then PPO with the value head as critic.

Both train every head Tamiyo uses: the factorised action distribution (type, slot, blueprint,
blend; ``tamiyo.actions.log_prob``), the value head on returns, and the risk head on field
report outcomes (binary cross-entropy where a report judged the command). The learning-rate head
has no target and never acts (``tamiyo.actions.UNTRAINED_ACTIONS``), so no loss reaches it.

PPO (clipped surrogate, Schulman et al. 2017) runs on the samples of on-policy rollouts: the
behaviour log-probability is the one Tamiyo recorded when she sampled the action; advantages are
GAE(gamma, lambda) over each run with the current critic, normalised per update. A small
imitation term on demonstrations (``bc_coef``) keeps the policy near the heuristic where the few
rollouts say nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from esper_core.simic.dataset import Sample, SampleBatch, collate
from esper_core.tamiyo.actions import log_prob
from esper_core.tamiyo.model import PolicyOutput, TamiyoGNN


@dataclass(kw_only=True, slots=True)
class SimicConfig:
    """Hyperparameters of imitation and PPO.

    Attributes:
        param_penalty: lambda: reward lost per host-sized block of parameters added (0.01 = one
            accuracy point for doubling the host).
        flops_penalty: mu: reward lost per doubling of a run's training FLOPs over its first
            network trained static (0.01 = one accuracy point for a growth that doubles the
            run's training compute; ``esper_core.simic.dataset``). 0 (the default) leaves
            compute free, as every plan before the zoo's trained; learns from ``delta`` rewards
            only (forks do not measure FLOPs).
        gamma: Discount per epoch.
        gae_lambda: GAE lambda.
        lr: Adam learning rate of imitation.
        ppo_lr: Adam learning rate of PPO (lower: a few noisy rollouts must not move the policy far;
            at 3e-3 a third of the ratios were clipped and the critic's error exploded).
        batch_size: Decisions per minibatch.
        imitation_epochs: Passes over the demonstrations.
        ppo_epochs: Passes over each batch of rollouts.
        clip: PPO ratio clip.
        value_coef: Weight of the critic's squared error.
        entropy_coef: Weight of the entropy bonus: the entropy of every head that acted in a
            decision (type; slot, blueprint and blend when used; ``tamiyo.actions.log_prob``).
        risk_coef: Weight of the risk head's cross-entropy.
        bc_coef: Weight of the imitation term during PPO (0 disables).
        max_grad_norm: Gradient clipping.
        seed: Seeds initialisation and shuffling.
    """

    param_penalty: float = 0.01
    flops_penalty: float = 0.0
    gamma: float = 1.0
    gae_lambda: float = 0.9
    lr: float = 3e-3
    ppo_lr: float = 3e-4
    batch_size: int = 64
    imitation_epochs: int = 40
    ppo_epochs: int = 4
    clip: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    risk_coef: float = 0.1
    bc_coef: float = 0.1
    max_grad_norm: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.param_penalty < 0:
            raise ValueError(f"param_penalty must be >= 0, got {self.param_penalty}")
        if self.flops_penalty < 0:
            raise ValueError(
                f"flops_penalty must be >= 0 (a reward per doubling of training FLOPs lost, not gained), "
                f"got {self.flops_penalty}"
            )
        if not (0.0 < self.gamma <= 1.0 and 0.0 <= self.gae_lambda <= 1.0):
            raise ValueError("gamma must lie in (0, 1] and gae_lambda in [0, 1]")
        for name in ("lr", "ppo_lr", "clip", "max_grad_norm"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("batch_size", "imitation_epochs", "ppo_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def returns_and_advantages(samples: Sequence[Sample], values: Tensor, config: SimicConfig) -> tuple[Tensor, Tensor]:
    """GAE advantages and returns (advantage + value) of each sample, computed per run.

    A one-step sample (``Sample.one_step``: a counterfactual reward) is its own episode: its
    return is its reward, with nothing bootstrapped from the run's next decision (see
    ``simic.dataset``), and so is its advantage: the reward already compares the action with
    the baseline branch played from the same state, so a critic's value is no baseline to
    subtract (it would only add the critic's error to an exact contrast).

    Args:
        samples: The samples (any order); runs are chained by epoch.
        values: ``(N,)`` critic values of the samples, same order.
        config: gamma and lambda.

    Returns:
        ``(returns (N,), advantages (N,))``.
    """
    by_run: dict[str, list[int]] = defaultdict(list)  # episode -> sample indices
    for i, s in enumerate(samples):
        by_run[f"{s.run_id}@{s.epoch}" if s.one_step else s.run_id].append(i)
    advantages = torch.zeros(len(samples))
    vals = values.detach().cpu()
    for indices in by_run.values():
        indices.sort(key=lambda i: samples[i].epoch)
        running = 0.0
        for pos in reversed(range(len(indices))):
            i = indices[pos]
            next_value = float(vals[indices[pos + 1]]) if pos + 1 < len(indices) else 0.0
            baseline = 0.0 if samples[i].one_step else float(vals[i])
            delta = samples[i].reward + config.gamma * next_value - baseline
            running = delta + config.gamma * config.gae_lambda * running
            advantages[i] = running
    one_step = torch.tensor([s.one_step for s in samples], dtype=torch.bool)
    return torch.where(one_step, advantages, advantages + vals), advantages


def normalised_advantages(advantages: Tensor, one_step: Tensor) -> Tensor:
    """Advantages scaled to unit spread; those of multi-step samples also centred on their mean.

    A one-step (counterfactual) advantage is a contrast with the baseline branch, and its sign is
    the lesson: centring would flip it for every action scored better than the batch's average
    but still worse than its baseline (on ``mnist1d-cnn`` most forked WAITs scored below growth,
    so centring reinforced the WAITs that lost least).

    Args:
        advantages: ``(N,)`` from ``returns_and_advantages``.
        one_step: ``(N,)`` bool, ``Sample.one_step`` of each.
    """
    centred = advantages - advantages[~one_step].mean() if bool((~one_step).any()) else advantages
    return torch.where(one_step, advantages, centred) / (advantages.std(unbiased=False) + 1e-8)


def imitate(model: TamiyoGNN, demonstrations: Sequence[Sample], config: SimicConfig) -> dict[str, float]:
    """Behaviour cloning of ``demonstrations``, with critic and risk head trained alongside.

    Args:
        model: The policy (trained in place).
        demonstrations: Samples of the policy to imitate.
        config: Hyperparameters.

    Returns:
        Metrics: final loss, agreement of the argmax action with the demonstrations, samples.
    """
    if not demonstrations:
        raise ValueError("no demonstrations to imitate: record some heuristic runs first (collect episodes)")
    device = next(model.parameters()).device
    torch.manual_seed(config.seed)
    returns, _ = returns_and_advantages(demonstrations, torch.zeros(len(demonstrations)), _mc(config))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    model.train()
    loss_value = math.nan
    for _ in range(config.imitation_epochs):
        for idx in _minibatches(len(demonstrations), config):
            batch = collate([demonstrations[i] for i in idx], device)
            out = model(batch.x_dict, batch.edge_index_dict)
            lp, _ = log_prob(out, batch.choices)
            loss = -lp.mean() + config.value_coef * F.mse_loss(out.value, returns[idx].to(device))
            loss = loss + config.risk_coef * _risk_loss(out, batch)
            _step(model, optimizer, loss, config)
            loss_value = loss.item()
    model.eval()
    return {"loss": loss_value, "agreement": agreement(model, demonstrations), "samples": float(len(demonstrations))}


def ppo_update(
    model: TamiyoGNN, rollouts: Sequence[Sample], config: SimicConfig, *, demonstrations: Sequence[Sample] = ()
) -> dict[str, float]:
    """One PPO update on on-policy ``rollouts`` (their behaviour log-probabilities recorded).

    Args:
        model: The policy that produced the rollouts (trained in place).
        rollouts: Samples with ``behaviour_log_prob`` set.
        config: Hyperparameters.
        demonstrations: Samples for the ``bc_coef`` imitation term.

    Returns:
        Metrics: mean reward and return, policy/value losses, clip fraction, approximate KL.
    """
    rollouts = [s for s in rollouts if s.behaviour_log_prob is not None]
    if not rollouts:
        raise ValueError("no on-policy rollouts (GNN decisions with a recorded log-probability) to learn from")
    device = next(model.parameters()).device
    torch.manual_seed(config.seed)
    values = _evaluate_values(model, rollouts, device)
    returns, advantages = returns_and_advantages(rollouts, values, config)
    advantages = normalised_advantages(advantages, torch.tensor([s.one_step for s in rollouts], dtype=torch.bool))
    old_lp = torch.tensor([s.behaviour_log_prob for s in rollouts], dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.ppo_lr)
    model.train()
    stats: dict[str, list[float]] = defaultdict(list)
    demo_iter = _cycle(demonstrations, config, device) if demonstrations and config.bc_coef > 0 else None
    for _ in range(config.ppo_epochs):
        for idx in _minibatches(len(rollouts), config):
            batch = collate([rollouts[i] for i in idx], device)
            out = model(batch.x_dict, batch.edge_index_dict)
            lp, entropy = log_prob(out, batch.choices)
            ratio = torch.exp(lp - old_lp[idx].to(device))
            adv = advantages[idx].to(device)
            surrogate = torch.min(ratio * adv, ratio.clamp(1 - config.clip, 1 + config.clip) * adv)
            policy_loss = -surrogate.mean()
            value_loss = F.mse_loss(out.value, returns[idx].to(device))
            loss = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy.mean()
            loss = loss + config.risk_coef * _risk_loss(out, batch)
            if demo_iter is not None:
                demo = next(demo_iter)
                demo_lp, _ = log_prob(model(demo.x_dict, demo.edge_index_dict), demo.choices)
                loss = loss - config.bc_coef * demo_lp.mean()
            _step(model, optimizer, loss, config)
            with torch.no_grad():
                stats["policy_loss"].append(policy_loss.item())
                stats["value_loss"].append(value_loss.item())
                stats["clip_fraction"].append(((ratio - 1).abs() > config.clip).float().mean().item())
                stats["approx_kl"].append((old_lp[idx].to(device) - lp).mean().item())
                stats["entropy"].append(entropy.mean().item())
    model.eval()
    metrics = {k: sum(v) / len(v) for k, v in stats.items()}
    metrics["mean_reward"] = sum(s.reward for s in rollouts) / len(rollouts)
    metrics["mean_return"] = float(returns.mean())
    metrics["samples"] = float(len(rollouts))
    return metrics


def agreement(model: TamiyoGNN, samples: Sequence[Sample]) -> float:
    """Share of samples whose most likely legal action type is the recorded one."""
    if not samples:
        return math.nan
    device = next(model.parameters()).device
    hits = 0
    with torch.no_grad():
        for start in range(0, len(samples), 256):
            chunk = samples[start : start + 256]
            batch = collate(chunk, device)
            logits = model(batch.x_dict, batch.edge_index_dict).action_logits
            logits = logits.masked_fill(~batch.choices.action_mask, -1e9)
            hits += int((logits.argmax(dim=1) == batch.choices.action).sum())
    return hits / len(samples)


def _mc(config: SimicConfig) -> SimicConfig:
    """The same discount with lambda = 1 and no critic: Monte Carlo returns."""
    return SimicConfig(gamma=config.gamma, gae_lambda=1.0)


def _evaluate_values(model: TamiyoGNN, samples: Sequence[Sample], device: torch.device) -> Tensor:
    model.eval()
    values = []
    with torch.no_grad():
        for start in range(0, len(samples), 256):
            batch = collate(samples[start : start + 256], device)
            values.append(model(batch.x_dict, batch.edge_index_dict).value.float().cpu())
    return torch.cat(values)


def _risk_loss(out: PolicyOutput, batch: SampleBatch) -> Tensor:
    labelled = ~torch.isnan(batch.regressed)
    if not bool(labelled.any()):
        return out.risk.sum() * 0.0
    return F.binary_cross_entropy(out.risk[labelled].float().clamp(1e-6, 1 - 1e-6), batch.regressed[labelled])


def _step(model: TamiyoGNN, optimizer: torch.optim.Optimizer, loss: Tensor, config: SimicConfig) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    optimizer.step()


def _minibatches(n: int, config: SimicConfig) -> Iterator[Tensor]:
    order = torch.randperm(n)
    for start in range(0, n, config.batch_size):
        yield order[start : start + config.batch_size]


def _cycle(samples: Sequence[Sample], config: SimicConfig, device: torch.device) -> Iterator[SampleBatch]:
    while True:
        for idx in _minibatches(len(samples), config):
            yield collate([samples[i] for i in idx], device)
