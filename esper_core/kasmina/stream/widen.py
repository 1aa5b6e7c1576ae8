"""Double a transformer's stream in place, keeping the function it computes.

The widened model computes, on every input, what the model computed before (up to float
rounding): every D-wide activation becomes ``[x, x]``, every head gets a twin, every MLP hidden
unit a twin, and each weight that reads duplicated units splits its column between the two copies
(``plan.StreamPart`` lists the cases; HyperCloning, Samragh et al. 2024, "Scaling Smart:
Accelerating Large Language Model Pre-Training with Small Model Initialization", builds a larger
model from a smaller one the same way). The split is not half and half: two copies that start
equal and read by equal weights get equal gradients and stay twins forever, so the network would
stay the small one. Each column is split ``s`` and ``1 - s`` with ``s`` drawn around one half
(``noise``), which keeps the sum, hence the function, and lets the copies part.

Parameters keep their identity as they grow, so an optimizer training the model keeps them in its
groups; its per-parameter state (Adam's moments) grows with them, each copy taking the moments
of the unit it copies: the widened model goes on training at the step sizes the small one had,
rather than restarting Adam's bias correction (whose first steps are about the learning rate on
every weight).

A tied output head (nanoGPT's ``lm_head.weight is wte.weight``) reads the stream with the
duplicated embedding, ``[E, E] [z, z] = 2 E z``; the LayerNorm right before it is halved instead,
so it reads ``[z / 2, z / 2]``. A tied head whose input no LayerNorm writes is refused.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from esper_core.kasmina.stream.plan import StreamPlan, output_layer, plan_stream

Op = Callable[[torch.Tensor], torch.Tensor]
"""A tensor's growth along one dimension."""

_RTOL = 1e-4
"""How far (relative to its largest logit) the widened model's output may stray from the
model's before in float32: rounding of the split sums (measured: 1e-7 to 1e-5 of it), well below
any trained difference. A half-precision model may stray a few times its own rounding more
(``_rounding_floor``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamWidening:
    """What ``widen_stream`` did.

    Attributes:
        width_before: D before.
        width_after: D after (twice).
        params_before: The model's parameters before.
        params_after: Its parameters after.
        max_change: Largest absolute change of the model's output on the check batch.
        plan: Every part that changed.
    """

    width_before: int
    width_after: int
    params_before: int
    params_after: int
    max_change: float
    plan: StreamPlan


def widen_stream(
    model: nn.Module,
    sample: torch.Tensor,
    *,
    width: int | None = None,
    noise: float = 0.25,
    generator: torch.Generator | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> StreamWidening:
    """Double ``model``'s stream width (d_model, heads, MLP hidden widths) in place.

    Args:
        model: A transformer built from the modules ``plan.plan_stream`` follows.
        sample: A batch of the model's inputs: the output on it is compared before and after.
        width: D; None: the token embeddings' width.
        noise: How far a split column's share strays from one half (uniform in
            ``[1/2 - noise, 1/2 + noise]``); in ``(0, 1/2]``.
        generator: Draws the splits (a seeded one makes the widening reproducible).
        optimizer: The optimizer training ``model``, whose state grows with its parameters.

    Returns:
        What changed (widths, parameter counts, the output's largest change).

    Raises:
        ValueError: a bad ``noise``; a part of the model ``plan_stream`` refuses; a tied head
            with no LayerNorm before it; or the widened model computes something else on
            ``sample`` (a module used in a way the plan could not see). The model is left as it
            was in every case.
    """
    if not 0.0 < noise <= 0.5:
        raise ValueError(f"noise must lie in (0, 0.5], got {noise}: the split shares must stay in [0, 1] and differ")
    plan = plan_stream(model, width=width, output=output_layer(model, tuple(sample.shape[1:]), sample.dtype))
    state = {k: v.clone() for k, v in model.state_dict(keep_vars=False).items()}
    # Sizes kept as plain attributes (in_features, normalized_shape, heads, n_embd, ...).
    sizes = {m: {k: v for k, v in vars(m).items() if type(v) in (int, tuple)} for m in model.modules()}
    stored = _optimizer_state(model, optimizer)
    params_before = sum(p.numel() for p in model.parameters())
    training = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            before, head_norm = _output_and_head_norm(model, sample, plan.width)
            floor = _rounding_floor(model, sample, before)
        split = _Splitter(noise, generator)
        with torch.no_grad():
            _widen(model, plan, split, head_norm, optimizer)
            try:
                after = model(sample)
            except (RuntimeError, ValueError, TypeError, IndexError) as e:
                raise ValueError(
                    f"the model's forward fails once its stream is doubled ({type(e).__name__}: {e}): "
                    f"{_HIDDEN.format(_known(plan))}"
                ) from e
        if after.shape != before.shape:
            raise ValueError(
                f"doubling the stream changed the model's output shape from {tuple(before.shape)} to "
                f"{tuple(after.shape)}: an output layer as wide as the stream ({plan.width}) was taken for part of it"
            )
        change = float((after - before).abs().max())
        scale = float(before.abs().max()) + 1.0
        if change > _RTOL * scale + 4 * floor:
            raise ValueError(
                f"doubling the stream changed the model's output by up to {change:.3g} (largest logit "
                f"{scale - 1:.3g}): {_HIDDEN.format(_known(plan))}"
            )
    except BaseException:
        _restore(model, state, sizes, stored, optimizer)
        raise
    finally:
        for m, flag in training.items():
            m.training = flag
    return StreamWidening(
        width_before=plan.width,
        width_after=2 * plan.width,
        params_before=params_before,
        params_after=sum(p.numel() for p in model.parameters()),
        max_change=change,
        plan=plan,
    )


_HIDDEN = (
    "something in its forward uses the width in a way the plan cannot follow (a weight applied outside its "
    "module, or a width or head count kept under an attribute other than those doubled: {}); keep widths in "
    "the modules' own attributes or read them off the input's shape"
)


def _known(plan: StreamPlan) -> str:
    return ", ".join(sorted({a for _, a in plan.attributes})) or "none found"


def _rounding_floor(model: nn.Module, sample: torch.Tensor, out: torch.Tensor) -> float:
    """How far ``out`` (the model's output in its own precision) lies from the same model's in
    float32: 0 for a float32 or float64 model. Half-precision weights round every split sum far
    more coarsely, so the check allows a few times this, measured rather than assumed."""
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes <= {torch.float32, torch.float64}:
        return 0.0
    reference = copy.deepcopy(model).float()
    return float((reference(sample).float() - out.float()).abs().max())


class _Splitter:
    """Draws the shares ``s`` a split column gives its first copy (``1 - s`` to the second)."""

    def __init__(self, noise: float, generator: torch.Generator | None) -> None:
        self.noise = noise
        self.generator = generator

    def __call__(self, like: torch.Tensor) -> torch.Tensor:
        # Drawn on the CPU, whatever the weights' device: the same shares on every device.
        u = torch.rand(like.shape, generator=self.generator, dtype=torch.float64)
        return (0.5 + self.noise * (2 * u - 1)).to(device=like.device, dtype=like.dtype)


def _output_and_head_norm(model: nn.Module, sample: torch.Tensor, width: int) -> tuple[torch.Tensor, nn.Module | None]:
    """The model's output on ``sample``, and the norm whose output a tied head reads (None when
    no head is tied): an ``nn.LayerNorm`` / ``nn.RMSNorm``, or a module of the user's own whose
    parameters are all per-unit tables of the stream's width (nanoGPT's ``LayerNorm``)."""
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    heads = [m for m in model.modules() if isinstance(m, nn.Linear) and id(m.weight) in embedded]
    if not heads:
        return model(sample), None
    # The tensors are kept alive until the end: a freed tensor's id can be reused by a later one.
    written: list[tuple[nn.Module, torch.Tensor]] = []
    read: list[torch.Tensor] = []
    handles = [
        m.register_forward_hook(lambda mod, _a, out: written.append((mod, out)))
        for m in model.modules()
        if _norm_like(m, width)
    ]
    handles += [h.register_forward_pre_hook(lambda _m, args: read.append(args[0])) for h in heads]
    try:
        out = model(sample)
    finally:
        for h in handles:
            h.remove()
    norms = {next((mod for mod, t in written if t is r), None) for r in read}
    if None in norms or len(norms) != 1:
        raise ValueError(
            "the output head shares the token embedding's weights and does not read a norm's output: "
            "doubling the stream keeps such a head's logits only by halving the norm before it; untie the head or "
            "put a LayerNorm right before it"
        )
    return out, norms.pop()


def _norm_like(module: nn.Module, width: int) -> bool:
    own = list(module.parameters(recurse=False))
    if isinstance(module, nn.LayerNorm | nn.RMSNorm):
        return True
    return bool(own) and all(p.dim() == 1 and p.shape[0] == width for p in own)


@dataclass(frozen=True, slots=True)
class _Growth:
    """How one parameter grows with the stream: its units along ``dup`` twice over (in ``blocks``
    equal parts, each duplicated in place), and, with ``split``, its input columns split in two."""

    param: nn.Parameter
    dup: int | None
    blocks: int = 1
    split: bool = False

    def shape(self, factor: float) -> tuple[int, ...]:
        """The parameter's shape once the stream is ``factor`` times as wide."""
        shape = list(self.param.shape)
        for dim in (*(() if self.dup is None else (self.dup,)), *((1,) if self.split else ())):
            shape[dim] = round(shape[dim] * factor)
        return tuple(shape)


def _growths(model: nn.Module, plan: StreamPlan) -> list[_Growth]:
    """Every parameter ``plan`` changes and how (``plan.StreamPart``'s roles). A tied head's weight
    is its embedding's, listed once."""
    found: list[_Growth] = []
    for part in plan.parts:
        if part.role == "free":
            found.append(_Growth(model.get_parameter(part.name), -1))
            continue
        module = model.get_submodule(part.name)
        if part.role == "embedding":
            found.append(_Growth(_param(module.weight), 1))
        elif part.role == "norm":
            found += [
                _Growth(_param(p), 0)
                for p in (getattr(module, "weight", None), getattr(module, "bias", None))
                if p is not None
            ]
        elif part.role == "mha":
            found.append(_Growth(_param(module.in_proj_weight), 0, part.blocks, split=True))
            if module.in_proj_bias is not None:
                found.append(_Growth(_param(module.in_proj_bias), 0, part.blocks))
        else:
            rows = part.role in ("through", "fused", "writer")
            found.append(_Growth(_param(module.weight), 0 if rows else None, part.blocks, split=part.role != "writer"))
            if rows and module.bias is not None:
                found.append(_Growth(_param(module.bias), 0, part.blocks))
    return found


def _param(t: object) -> nn.Parameter:
    assert isinstance(t, nn.Parameter), type(t)
    return t


def _scale_sizes(model: nn.Module, plan: StreamPlan, factor: float) -> None:
    """The sizes kept as attributes (norms' shapes, attention's widths and heads, the plan's
    attributes, ``Linear`` / ``Embedding`` sizes) at ``factor`` times, after the weights."""
    for part in plan.parts:
        module = None if part.role == "free" else model.get_submodule(part.name)
        if isinstance(module, nn.LayerNorm | nn.RMSNorm):
            module.normalized_shape = (round(module.normalized_shape[0] * factor),)
        elif isinstance(module, nn.MultiheadAttention):
            module.embed_dim = module.kdim = module.vdim = round(module.embed_dim * factor)
            module.num_heads = module.embed_dim // module.head_dim
    for m, a in plan.attributes:
        owner = model.get_submodule(m)
        if not isinstance(owner, nn.MultiheadAttention):
            setattr(owner, a, round(getattr(owner, a) * factor))
    _sync_sizes(model)


def _widen(
    model: nn.Module,
    plan: StreamPlan,
    split: Callable[[torch.Tensor], torch.Tensor],
    head_norm: nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
) -> None:
    for g in _growths(model, plan):
        rows = None if g.dup is None else _blocks(g.blocks, g.dup)
        _grow(g.param, optimizer, rows, _split_cols(split) if g.split else None)
    _scale_sizes(model, plan, 2.0)
    if head_norm is not None:
        for p in (getattr(head_norm, "weight", None), getattr(head_norm, "bias", None)):
            if p is not None:
                p.mul_(0.5)


def _blocks(blocks: int, dim: int) -> Op:
    """Each of ``blocks`` equal parts along ``dim`` duplicated in place: ``[q, q, k, k, v, v]``
    (one block: the units twice over, ``[u, u]``)."""
    return lambda t: torch.cat([c for part in t.chunk(blocks, dim=dim) for c in (part, part)], dim=dim)


def _split_cols(split: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor, bool], torch.Tensor]:
    """Columns ``[s W, (1 - s) W]`` for a weight; for its optimizer state (``moments``), the
    state twice (each copy keeps the unit's moments)."""

    def op(t: torch.Tensor, moments: bool) -> torch.Tensor:
        if moments:
            return torch.cat([t, t], dim=1)
        s = split(t)
        return torch.cat([s * t, (1 - s) * t], dim=1)

    return op


def _grow(
    p: torch.Tensor,
    optimizer: torch.optim.Optimizer | None,
    rows: Op | None,
    cols: Callable[[torch.Tensor, bool], torch.Tensor] | None = None,
) -> None:
    """Replace ``p``'s data (its identity kept) by the grown tensor, and grow its optimizer state
    (tensors of the parameter's shape) the same way, with moments copied rather than split."""

    def grow(t: torch.Tensor, moments: bool) -> torch.Tensor:
        if rows is not None:
            t = rows(t)
        if cols is not None:
            t = cols(t, moments)
        return t.contiguous()

    old_shape = p.shape
    p.data = grow(p.data, moments=False)
    p.grad = None  # a gradient of the old shape would not accumulate into the new one
    if optimizer is not None:
        for k, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor) and v.shape == old_shape:
                optimizer.state[p][k] = grow(v, moments=True)


def _optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[int, dict[str, torch.Tensor]]:
    """The optimizer's state tensors, cloned, per parameter id (restored if the widening fails)."""
    if optimizer is None:
        return {}
    return {
        id(p): {k: v.clone() for k, v in optimizer.state[p].items() if isinstance(v, torch.Tensor)}
        for p in model.parameters()
        if p in optimizer.state
    }


def _sync_sizes(model: nn.Module) -> None:
    """Set the size attributes of PyTorch's own modules from their weights (a tied head's
    ``in_features`` too, whose weight grew as the embedding's)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.out_features, module.in_features = module.weight.shape
        elif isinstance(module, nn.Embedding):
            module.embedding_dim = module.weight.shape[1]


def _restore(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    sizes: dict[nn.Module, dict[str, object]],
    stored: dict[int, dict[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer | None,
) -> None:
    """Put the model (and its optimizer state) back as it was before a failed widening."""
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if name in state:
                p.data = state[name].clone()
    for module, attrs in sizes.items():
        for k, v in attrs.items():
            setattr(module, k, v)
    if optimizer is not None:
        for p in model.parameters():
            for k, v in stored.get(id(p), {}).items():
                optimizer.state[p][k] = v


def stream_shapes(model: nn.Module, plan: StreamPlan, factor: float) -> dict[nn.Parameter, tuple[int, ...]]:
    """Each parameter ``plan`` changes, with its shape once the stream is ``factor`` times as wide
    (2: doubled, 0.5: halved). A tied head's weight is its embedding's, listed once.

    Args:
        model: The model the plan was made for.
        plan: What doubling its stream changes (``plan_stream``).
        factor: The stream's width to be, over its width now.

    Returns:
        The new shape of every parameter the plan changes.
    """
    return {g.param: g.shape(factor) for g in _growths(model, plan)}


def stream_growth(model: nn.Module, *, width: int | None = None, output: str = "") -> int:
    """Parameters doubling ``model``'s stream would add (read from shapes: ``model`` may be on the
    meta device); ``width`` and ``output`` as ``plan_stream`` takes them."""
    plan = plan_stream(model, width=width, output=output)
    return sum(math.prod(shape) - p.numel() for p, shape in stream_shapes(model, plan, 2.0).items())


def resize_stream(
    model: nn.Module,
    width: int,
    *,
    current: int,
    plans: dict[int, StreamPlan],
    output: str = "",
    optimizer: torch.optim.Optimizer | None = None,
) -> None:
    """Give ``model``'s stream exactly ``width`` units, for loading a checkpoint taken at that width:
    shapes and size attributes only (the checkpoint's weights replace the values, and its
    optimizer state the dropped state of every resized parameter).

    A doubling is undone with the plan it was made with, never one read off the wider model,
    whose sizes can coincide differently (a position table whose length is twice the narrow width
    is square at the wide one). A doubling made here is planned afresh on the narrow model as it
    is now: a restore may have deepened it first (its depth slots come before the stream), and
    the plan the stream was grafted with does not know those blocks.

    Args:
        model: The model.
        width: The stream's width to give it.
        current: Its width now.
        plans: The plan of each doubling by the width it doubled; a doubling made here replaces
            the plan of that width.
        output: The model's output layer (``plan_stream``).
        optimizer: The optimizer training it, whose state for resized parameters is dropped.

    Raises:
        ValueError: ``width`` is not ``current`` times a power of two, or a halving whose
            doubling was never planned here.
    """
    ratio = width / current
    steps = round(math.log2(ratio)) if ratio > 0 else 0
    if ratio <= 0 or 2.0**steps != ratio:
        raise ValueError(
            f"a stream changes by doubling: {width} units cannot be reached from {current}; restore a checkpoint "
            "of this run, whose width is its start width times a power of two"
        )
    for _ in range(abs(steps)):
        if steps > 0:
            plan = plans[current] = plan_stream(model, width=current, output=output)
            factor = 2.0
        else:
            if current // 2 not in plans:
                raise ValueError(
                    f"cannot halve the stream from {current} units: no doubling from {current // 2} was planned for "
                    f"this model (planned: {sorted(plans)})"
                )
            plan, factor = plans[current // 2], 0.5
        _reshape(model, plan, factor, optimizer)
        current = round(current * factor)


def _reshape(model: nn.Module, plan: StreamPlan, factor: float, optimizer: torch.optim.Optimizer | None) -> None:
    """Every part of ``plan`` at ``factor`` times its present size, zero-filled, and the sizes kept
    as attributes with them."""
    with torch.no_grad():
        for p, shape in stream_shapes(model, plan, factor).items():
            p.data = p.data.new_zeros(shape)
            p.grad = None
            if optimizer is not None:
                optimizer.state.pop(p, None)
    _scale_sizes(model, plan, factor)
