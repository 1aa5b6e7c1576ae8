"""The blueprints Esper ships: seven each for MLP hosts, 2-D and 1-D convolutional hosts, three tiers
each, and five for token features (transformers, embeddings, batch-first LSTMs).

Risk scores order the blueprints within and across tiers: safe ones stay at or below 0.25,
experimental ones sit between 0.3 and 0.6, high-risk ones at 0.75 or above (tests check it).
Every blueprint is non-linear in its input, so none folds into the layer next to its slot.

Versions: ``lowrank_adapter`` and ``pointwise_adapter`` are version 2, the non-linear
``up(GELU(down(x)))``; version 1 was the linear ``up(down(x))``, whose artifacts carry no
``blueprint_version`` parameter and so never match the version 2 parameter key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from torch import nn

from esper_core.contracts import BlueprintDescriptor, BlueprintTier, ParamBound
from esper_core.karn import blueprints as mlp
from esper_core.karn import blueprints_conv as conv
from esper_core.karn import blueprints_tok as tok
from esper_core.karn.catalog import Blueprint, BlueprintBuilder, GradMaxLayers, KarnCatalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.karn.rules import ProfileRule

_SAFE, _EXPERIMENTAL, _HIGH_RISK = BlueprintTier.SAFE, BlueprintTier.EXPERIMENTAL, BlueprintTier.HIGH_RISK

# The GradMax-style initialisation's layers of the ``output(act(input(x)))`` seeds.
_DOWN_UP = GradMaxLayers(input="down", output="up")
_FC = GradMaxLayers(input="fc_in", output="fc_out")
_CONV_IN_OUT = GradMaxLayers(input="conv_in", output="conv_out")


def _int_bound(low: int, high: int, default: int) -> ParamBound:
    return ParamBound(low=low, high=high, default=default, integer=True)


_SIZE_OF: dict[str, Callable[[ShapeProfile, str], int]] = {
    "mlp": mlp.mlp_width,
    "seq": conv.seq_channels,
    "cnn": conv.conv_channels,
    "tok": tok.tok_width,
}
"""The slot size a seed module takes, per host kind: an MLP's width, a conv layer's channels."""


def _builder(
    blueprint_id: str, kind: str, module: Callable[..., nn.Module], param: str | None, *, causal: bool
) -> BlueprintBuilder:
    """``module(size)``, or ``module(size, int(params[param]))`` for a blueprint with a parameter;
    with ``causal``, also ``causal=profile.causal`` (the slot's, never a tunable parameter)."""
    size_of = _SIZE_OF[kind]

    def build(profile: ShapeProfile, params: Mapping[str, float]) -> nn.Module:
        size = size_of(profile, blueprint_id)
        args = (size,) if param is None else (size, int(params[param]))
        return module(*args, causal=profile.causal) if causal else module(*args)

    build.__name__ = f"build_{blueprint_id}"
    return build


def _entry(
    blueprint_id: str,
    name: str,
    tier: BlueprintTier,
    risk: float,
    rule: ProfileRule,
    module: Callable[..., nn.Module],
    description: str,
    *,
    version: int = 1,
    gradmax: GradMaxLayers | None = None,
    causal: bool = False,
    **bounds: ParamBound,
) -> Blueprint:
    """A catalogue entry; ``module`` takes the slot size, then its one integer parameter if any.

    ``version``: bump it when the function of an existing id changes (see ``VERSION_PARAM``).
    ``gradmax``: the module's input and output projections, for blueprints of the form
    ``output(act(input(x)))`` that support the GradMax-style initialisation.
    ``causal``: ``module`` takes ``causal=``, set from the slot's profile (a token seed that mixes
    positions must not read later ones in a causal model).
    """
    if len(bounds) > 1:
        raise ValueError(f"blueprint {blueprint_id!r}: a seed module takes at most one parameter, got {sorted(bounds)}")
    build = _builder(blueprint_id, rule.kind, module, next(iter(bounds), None), causal=causal)
    descriptor = BlueprintDescriptor(
        blueprint_id=blueprint_id,
        name=name,
        tier=tier,
        host_kinds=(rule.kind,),
        description=description,
        risk=risk,
        param_bounds=bounds,
        version=version,
    )
    return Blueprint(descriptor=descriptor, build=build, rule=rule, gradmax=gradmax)


def _mlp_blueprints() -> list[Blueprint]:
    vectors = ProfileRule(kind="mlp")
    return [
        _entry(
            "residual_mlp",
            "Residual MLP",
            _SAFE,
            0.2,
            vectors,
            mlp.ResidualMLP,
            "Two-layer GELU MLP (W -> expansion*W -> W) added as a residual delta; "
            "general-purpose capacity for an under-fitting layer.",
            gradmax=_FC,
            expansion=_int_bound(1, 4, 2),
        ),
        _entry(
            "lowrank_adapter",
            "Low-rank adapter",
            _SAFE,
            0.1,
            vectors,
            mlp.LowRankAdapter,
            "Non-linear rank-r adapter W -> rank -> GELU -> W; the cheapest increment that adds "
            "function (a linear LoRA-style one would fold into the next layer), for tight latency budgets.",
            version=2,
            gradmax=_DOWN_UP,
            rank=_int_bound(1, 32, 4),
        ),
        _entry(
            "bottleneck_mlp",
            "Bottleneck MLP",
            _SAFE,
            0.15,
            ProfileRule(kind="mlp", min_features=2),
            mlp.BottleneckMLP,
            "Non-linear bottleneck W -> W/reduction -> W with GELU; a low-rank adapter that can "
            "bend, for cheap non-linear corrections.",
            gradmax=_DOWN_UP,
            reduction=_int_bound(2, 8, 4),
        ),
        _entry(
            "norm_gate",
            "Normalised gate",
            _EXPERIMENTAL,
            0.4,
            vectors,
            mlp.NormGate,
            "LayerNorm, then a W x W linear map scaled per feature by a sigmoid gate; "
            "for layers whose activations drift in scale.",
        ),
        _entry(
            "glu_block",
            "Gated linear unit",
            _EXPERIMENTAL,
            0.5,
            vectors,
            mlp.GLUBlock,
            "Gated linear unit (value * sigmoid(gate)) of hidden width expansion*W; "
            "multiplicative interactions a plain MLP learns slowly.",
            expansion=_int_bound(1, 4, 2),
        ),
        _entry(
            "token_attention",
            "Token attention",
            _EXPERIMENTAL,
            0.55,
            ProfileRule(kind="mlp", min_features=2 * mlp.TOKEN_WIDTH, multiple_of=mlp.TOKEN_WIDTH),
            mlp.TokenAttention,
            f"Single-head self-attention over the W/{mlp.TOKEN_WIDTH} tokens of a feature vector; "
            "lets distant feature groups interact within one layer.",
            key_dim=_int_bound(4, 32, 8),
        ),
        _entry(
            "wide_mlp",
            "Wide MLP",
            _HIGH_RISK,
            0.8,
            vectors,
            mlp.WideMLP,
            "Three-layer GELU MLP with hidden width up to 8*W; large capacity jump, "
            "costly in latency and prone to over-fitting.",
            expansion=_int_bound(1, 8, 4),
        ),
    ]


def _conv_blueprints() -> list[Blueprint]:
    maps = ProfileRule(kind="cnn")
    return [
        _entry(
            "conv_residual",
            "Conv residual",
            _SAFE,
            0.2,
            maps,
            conv.ConvResidual,
            "Two 3x3 convolutions (C -> expansion*C -> C) with GELU, added as a residual delta; "
            "a ResNet basic block's branch for an under-fitting conv layer.",
            gradmax=_CONV_IN_OUT,
            expansion=_int_bound(1, 4, 1),
        ),
        _entry(
            "depthwise_separable",
            "Depthwise-separable conv",
            _SAFE,
            0.15,
            maps,
            conv.DepthwiseSeparable,
            "Depthwise 3x3 convolution (optionally dilated) then a pointwise 1x1 channel mix; "
            "spatial capacity at a fraction of a full convolution's cost.",
            dilation=_int_bound(1, 3, 1),
        ),
        _entry(
            "pointwise_adapter",
            "Pointwise adapter",
            _SAFE,
            0.1,
            maps,
            conv.PointwiseAdapter,
            "Non-linear low-rank 1x1 bottleneck C -> rank -> GELU -> C; the cheapest channel-mixing "
            "increment for feature maps, no spatial context.",
            version=2,
            gradmax=_DOWN_UP,
            rank=_int_bound(1, 32, 4),
        ),
        _entry(
            "squeeze_excitation",
            "Squeeze-excitation",
            _EXPERIMENTAL,
            0.35,
            ProfileRule(kind="cnn", min_features=2),
            conv.SqueezeExcitation,
            "Re-weights channels from globally pooled context (squeeze -> MLP -> tanh gate); "
            "cheap, but changes every position of the map at once.",
            reduction=_int_bound(1, 16, 4),
        ),
        _entry(
            "group_norm_gate",
            "Group-norm gate",
            _EXPERIMENTAL,
            0.45,
            maps,
            conv.GroupNormGate,
            "GroupNorm over the map, then a 1x1 projection gated per channel and position by a "
            "sigmoid; for conv layers whose activations drift in scale.",
        ),
        _entry(
            "spatial_attention",
            "Spatial attention",
            _EXPERIMENTAL,
            0.6,
            ProfileRule(kind="cnn", min_features=2, max_positions=1024),
            conv.SpatialAttention,
            "Single-head self-attention across the H*W positions of a map (1x1 projections); "
            "global spatial context, cost grows with (H*W)^2.",
            key_dim=_int_bound(4, 64, 16),
        ),
        _entry(
            "wide_conv",
            "Wide conv",
            _HIGH_RISK,
            0.85,
            maps,
            conv.WideConv,
            "Two 3x3 convolutions through up to 8*C channels; a large capacity jump, slow and "
            "memory-hungry on big maps.",
            expansion=_int_bound(1, 8, 4),
        ),
    ]


def _seq_blueprints() -> list[Blueprint]:
    sequences = ProfileRule(kind="seq")

    def one_d(module: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        return functools.partial(module, dims=1)

    return [
        _entry(
            "seq_conv_residual",
            "Sequence conv residual",
            _SAFE,
            0.2,
            sequences,
            one_d(conv.ConvResidual),
            "Two size-3 1-D convolutions (C -> expansion*C -> C) with GELU, added as a residual "
            "delta; a 1-D ResNet block's branch for an under-fitting Conv1d layer.",
            gradmax=_CONV_IN_OUT,
            expansion=_int_bound(1, 4, 1),
        ),
        _entry(
            "seq_depthwise_separable",
            "Sequence depthwise-separable conv",
            _SAFE,
            0.15,
            sequences,
            one_d(conv.DepthwiseSeparable),
            "Depthwise size-3 1-D convolution (optionally dilated for a wider receptive field), GELU, "
            "then a pointwise channel mix; temporal capacity at a fraction of a full convolution's cost.",
            dilation=_int_bound(1, 4, 1),
        ),
        _entry(
            "seq_pointwise_adapter",
            "Sequence pointwise adapter",
            _SAFE,
            0.1,
            sequences,
            one_d(conv.PointwiseAdapter),
            "Non-linear low-rank pointwise bottleneck C -> rank -> GELU -> C at every position; the "
            "cheapest channel-mixing increment for sequences, no temporal context.",
            gradmax=_DOWN_UP,
            rank=_int_bound(1, 32, 4),
        ),
        _entry(
            "seq_squeeze_excitation",
            "Sequence squeeze-excitation",
            _EXPERIMENTAL,
            0.35,
            ProfileRule(kind="seq", min_features=2),
            one_d(conv.SqueezeExcitation),
            "Re-weights channels from context pooled over the sequence (squeeze -> MLP -> tanh gate); "
            "cheap, but changes every position at once.",
            reduction=_int_bound(1, 16, 4),
        ),
        _entry(
            "seq_group_norm_gate",
            "Sequence group-norm gate",
            _EXPERIMENTAL,
            0.45,
            sequences,
            one_d(conv.GroupNormGate),
            "GroupNorm over the sequence, then a pointwise projection gated per channel and position "
            "by a sigmoid; for Conv1d layers whose activations drift in scale.",
        ),
        _entry(
            "seq_attention",
            "Sequence attention",
            _EXPERIMENTAL,
            0.6,
            ProfileRule(kind="seq", min_features=2, max_positions=1024),
            one_d(conv.SpatialAttention),
            "Single-head self-attention across the L positions of a sequence (pointwise "
            "projections); global temporal context, cost grows with L^2.",
            key_dim=_int_bound(4, 64, 16),
        ),
        _entry(
            "seq_wide_conv",
            "Sequence wide conv",
            _HIGH_RISK,
            0.85,
            sequences,
            one_d(conv.WideConv),
            "Two size-3 1-D convolutions through up to 8*C channels; a large capacity jump, slow "
            "and memory-hungry on long sequences.",
            expansion=_int_bound(1, 8, 4),
        ),
    ]


def _tok_blueprints() -> list[Blueprint]:
    tokens = ProfileRule(kind="tok")
    return [
        _entry(
            "tok_mlp",
            "Token MLP",
            _SAFE,
            0.2,
            tokens,
            tok.TokenFFN,
            "A transformer FFN branch per token (LayerNorm, D -> expansion*D -> GELU -> D) added as a "
            "residual delta; general-purpose capacity for an under-fitting transformer block.",
            expansion=_int_bound(1, 4, 2),
        ),
        _entry(
            "tok_adapter",
            "Token adapter",
            _SAFE,
            0.1,
            tokens,
            tok.TokenAdapter,
            "Non-linear low-rank adapter per token, D -> rank -> GELU -> D; the cheapest token "
            "increment, no mixing across positions.",
            rank=_int_bound(1, 32, 8),
        ),
        _entry(
            "tok_attention",
            "Token self-attention",
            _SAFE,
            0.25,
            ProfileRule(kind="tok", min_features=2, max_positions=1024),
            tok.TokenSelfAttention,
            "One pre-norm self-attention head across the L tokens, causal in a causal model "
            "(ModelSpec(causal=True)); context from other positions, cost grows with L^2.",
            causal=True,
            key_dim=_int_bound(4, 64, 16),
        ),
        _entry(
            "tok_glu",
            "Token gated FFN",
            _EXPERIMENTAL,
            0.45,
            tokens,
            tok.TokenGLU,
            "A gated FFN per token (SwiGLU: silu(gate) * value, width expansion*D); multiplicative "
            "feature interactions, half again the parameters of tok_mlp at the same width.",
            expansion=_int_bound(1, 4, 2),
        ),
        _entry(
            "tok_wide_mlp",
            "Token wide MLP",
            _HIGH_RISK,
            0.8,
            tokens,
            tok.TokenWideMLP,
            "Three per-token layers through up to 8*D features; a large capacity jump, slow and prone to over-fitting.",
            expansion=_int_bound(1, 8, 4),
        ),
    ]


def default_blueprints() -> list[Blueprint]:
    """Every blueprint of the shipped catalogue: MLP ones, then 2-D and 1-D convolutional ones,
    then the token ones."""
    return _mlp_blueprints() + _conv_blueprints() + _seq_blueprints() + _tok_blueprints()


@functools.cache
def default_catalog() -> KarnCatalog:
    """The catalogue Esper ships (cached: built once per process)."""
    return KarnCatalog(default_blueprints())
