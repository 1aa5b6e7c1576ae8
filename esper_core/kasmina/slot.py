"""A seed slot: the place in the host where a seed's output joins the host's activation.

Shapes: ``x`` is the host activation entering the slot, (B, *feature_shape); a seed maps it to a
delta of the same shape.

Isolation before BLENDING: a TRAINING seed sees ``x.detach()`` and its contribution is
``delta - delta.detach()``, which is exactly zero in value. The host's forward output and its
gradients are therefore bit-identical to a host without the seed, while the seed's parameters
receive the true task gradient of "adding delta here". G3 verifies this numerically.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from esper_core.contracts import BlendMode, SeedStage
from esper_core.karn.profiles import ShapeProfile
from esper_core.kasmina.kinds import BRANCH, SeedKind

# Stages in which the seed's output is blended into the host's forward pass.
BLENDED_STAGES = frozenset({SeedStage.BLENDING, SeedStage.PROBATIONARY, SeedStage.FOSSILIZED})


class SeedSlot(nn.Module):
    """Holds at most one seed module and applies it according to the slot's stage.

    A plain slot takes branch seeds; a subclass that grows the host another way names its kind.
    """

    kind: SeedKind = BRANCH
    """What the seeds of this slot are (``kinds.SeedKind``): the manager asks it, never the type."""
    alpha_t: torch.Tensor

    def __init__(self, *, slot_id: str, layer: str, profile: ShapeProfile) -> None:
        super().__init__()
        self.slot_id = slot_id
        self.layer = layer
        self.profile = profile
        self.stage = SeedStage.DORMANT
        # Alpha lives in a 0-d buffer updated in place, so a compiled step or a captured CUDA graph
        # reads the current value instead of baking in a constant (no recompile per blend epoch).
        self.register_buffer("alpha_t", torch.zeros(()), persistent=False)
        self._alpha = 0.0
        self.blend_mode = BlendMode.RESIDUAL
        self.seed: nn.Module | None = None
        # Set only inside SeedManager.probe(): forces the seed in at this alpha for evaluation.
        self.probe_alpha: float | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        # Every path that gives or takes the slot's seed (germinate, merge, cull, restore, a task
        # of an aggregated step that leaves it out) sets ``seed``: slots that hook into the host
        # follow it here, in one place.
        if name == "seed":
            self._seed_changed()

    def _seed_changed(self) -> None:
        """``seed`` was just set (a slot with hooks on the host adds or removes them)."""

    @property
    def idle(self) -> bool:
        """Whether calling the slot would only hand its input back, unwatched: no seed, and no
        hook of its own, forward or backward (growth signals, activation probes and tracers hook
        an empty slot to read what passes through it). A built-in host skips an idle slot's
        call, ~0.7 us of ``nn.Module.__call__`` each on every forward, a per cent of the digits
        MLP's training step with its two slots. Global module hooks
        (``register_module_forward_hook``) do not see an idle slot."""
        return self.seed is None and not (
            self._forward_hooks or self._forward_pre_hooks or self._backward_hooks or self._backward_pre_hooks
        )

    @property
    def reader(self) -> nn.Module:
        """The module whose input a seed here reads: the slot itself."""
        return self

    @property
    def joiner(self) -> nn.Module:
        """The module whose output a seed here adds to: the slot itself."""
        return self

    @property
    def hook_ids(self) -> frozenset[int]:
        """Ids of hooks the slot itself keeps on the host's modules (a plain slot keeps none)."""
        return frozenset()

    def delta_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        """The shape a seed's output must have for the input ``x`` it reads (G3): that of ``x``."""
        return tuple(x.shape)

    @property
    def profile_name(self) -> str:
        """The shape profile Tamiyo matches blueprints against (``SeedState.shape_profile``)."""
        return self.profile.name

    @property
    def alpha(self) -> float:
        """Blend weight of the seed's output, 0..1 (read without a device sync)."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._alpha = float(value)
        self.alpha_t.fill_(self._alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply_seed(x, x)

    def apply_seed(self, out: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """Add the seed's delta, computed from ``source``, to the host activation ``out`` as the
        stage says (a branch seed reads the activation it joins; a width seed reads the widened
        layer's input and joins its consumer's output)."""
        seed = self.seed
        if seed is None:
            return out
        if self.probe_alpha is not None:
            return self._blend(out, seed(source), self.probe_alpha)
        if self.stage is SeedStage.TRAINING:
            if not self.kind.isolated_training:
                return out
            delta = seed(source.detach())
            return out + (delta - delta.detach())
        if self.stage in BLENDED_STAGES:
            return self._blend(out, seed(source), self.alpha_t)
        return out

    def _blend(self, x: torch.Tensor, delta: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
        if self.blend_mode is BlendMode.CONVEX:
            # The seed's output replaces the activation: x + alpha * (seed(x) - x).
            return torch.lerp(x, delta, alpha)
        return x + alpha * delta

    def extra_repr(self) -> str:
        return f"slot_id={self.slot_id}, layer={self.layer}, profile={self.profile_name}, stage={self.stage.value}"
