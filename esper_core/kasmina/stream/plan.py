"""Which parts of a transformer meet its residual stream, and how each must change to double it.

A transformer's modules talk through one width, ``d_model`` (D here): the token and position
embeddings write it, every block reads it through a LayerNorm and adds back to it, the output
head reads it. Doubling D touches every one of them, and each in one of a few ways
(``StreamRole``). ``plan_stream`` reads them off the model's modules and parameters, by type and
shape; whatever holds a D-sized dimension and fits none of the roles is refused by name before
anything changes, and ``widen.widen_stream`` checks the result on a real batch, so a module used
in a way the plan could not see (a D-sized weight applied as ``x @ W`` in ``forward()``) is
refused there rather than trained on.

Legend: D the stream's width, F an MLP's hidden width, H heads, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from esper_core.kasmina.dryrun import dry_forward

StreamRole = Literal["embedding", "free", "norm", "through", "reader", "writer", "fused", "mha"]
"""How a module's weights change when the stream doubles (``StreamPart``'s docstring says each)."""

HEAD_ATTRIBUTES = ("heads", "n_head", "n_heads", "num_heads", "nhead")
"""Attribute names an attention module keeps its head count under; doubled with the stream (each
head keeps its width, so there are twice as many)."""

WIDTH_ATTRIBUTES = ("n_embd", "d_model", "embed_dim", "hidden_size", "width", "dim", "kdim", "vdim")
"""Attribute names a module keeps the stream's width under (nanoGPT's ``n_embd`` splits q, k and
v by it); doubled where they equal D."""

_NORMS = (nn.LayerNorm, nn.RMSNorm)
_KNOWN = (nn.Linear, nn.Embedding, *_NORMS, nn.MultiheadAttention)


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamPart:
    """One module (or free parameter) and what doubling the stream does to it.

    Roles, for a weight ``W`` (out x in) and duplicated units ``[u, u]``:

    - ``embedding``: an ``Embedding`` writing D-wide vectors: its columns duplicated, ``[e, e]``.
    - ``free``: a parameter whose last dimension is D, added or multiplied per unit (a learned
      position table, a norm's scale in a module of the user's own): duplicated along it.
    - ``norm``: ``LayerNorm`` / ``RMSNorm`` over D: scale and shift duplicated. Over ``[x, x]`` the
      mean and variance are those over ``x``, so it computes ``[n(x), n(x)]``.
    - ``through``: a ``Linear`` from D to D, or one of an MLP's pair ``Linear(D, F)``,
      ``Linear(F, D)`` (whose hidden layer doubles too): each output duplicated, each input
      column split in two parts that sum to it, so ``W'[x, x] = [Wx, Wx]``.
    - ``reader``: a ``Linear`` from D to a width that stays (the output head, a classifier):
      input columns split, outputs unchanged.
    - ``writer``: a ``Linear`` into D from a width that stays (a patch projection): outputs
      duplicated, inputs unchanged.
    - ``fused``: an attention module's fused projection from D to ``blocks`` x D (q, k and v):
      each block's outputs duplicated in place (``[q, q, k, k, v, v]``), inputs split; with twice
      the heads of the same width, heads ``h`` and ``H + h`` are copies.
    - ``mha``: ``nn.MultiheadAttention``: its packed input projection as ``fused``, its head
      count and widths doubled (its output projection is a ``through`` part of its own).

    Attributes:
        name: Dotted name of the module, or of the parameter for ``free``.
        role: What changes.
        blocks: Output blocks of a ``fused`` projection (1 otherwise).
    """

    name: str
    role: StreamRole
    blocks: int = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamPlan:
    """Everything that doubles with a model's stream (``plan_stream``).

    Attributes:
        width: D now.
        parts: Every module and parameter that changes, in the model's module order.
        attributes: ``(module, attribute)`` integers that double: head counts, and widths equal to D.
        output: The ``Linear`` whose output the model returns (its width is the task's, whatever
            it equals), or "" if unknown.
    """

    width: int
    parts: tuple[StreamPart, ...]
    attributes: tuple[tuple[str, str], ...]
    output: str = ""

    def names(self, *roles: StreamRole) -> list[str]:
        """The parts that play one of ``roles``.

        Args:
            roles: The roles to list.

        Returns:
            Their names, in the model's module order.
        """
        return [p.name for p in self.parts if p.role in roles]


def stream_width(model: nn.Module) -> int:
    """D, read off the model's token embeddings (every ``Embedding`` must agree), or, for a model
    whose inputs enter through a ``Linear`` (an encoder over features or patches), off its norms:
    every LayerNorm / RMSNorm of a transformer normalises the stream, over (D,).

    Raises:
        ValueError: embeddings of different widths, or no embedding and norms that do not agree
            on one width (or none); the message says what was found.
    """
    widths = {m.embedding_dim for m in model.modules() if isinstance(m, nn.Embedding)}
    if len(widths) > 1:
        raise ValueError(
            f"stream growth reads the model's width (d_model) off its token embeddings and found embeddings of "
            f"widths {sorted(widths)}: it doubles models whose tokens enter through nn.Embedding modules of one width"
        )
    if widths:
        return widths.pop()
    norms = {tuple(m.normalized_shape) for m in model.modules() if isinstance(m, _NORMS)}
    if len(norms) != 1 or len(next(iter(norms))) != 1:
        found = "no LayerNorm or RMSNorm" if not norms else f"norms over {sorted(norms)}"
        raise ValueError(
            "stream growth reads the model's width (d_model) off its token embeddings (nn.Embedding) or, without "
            f"one, off its norms, and found no embedding and {found}: it doubles transformers whose stream is "
            "normalised by LayerNorm / RMSNorm over (D,)"
        )
    return next(iter(norms))[0]


def plan_stream(model: nn.Module, *, width: int | None = None, output: str = "") -> StreamPlan:
    """Find every module and parameter that doubling ``model``'s stream changes, and how.

    Args:
        model: A transformer (its weights are read for shapes only).
        width: D; None: the token embeddings' width (``stream_width``).
        output: The ``Linear`` whose output the model returns (``output_layer``): it reads the
            stream and keeps its own width even where that equals D (a vocabulary of D
            characters). "": told apart by shape alone.

    Returns:
        The plan ``widen.widen_stream`` carries out.

    Raises:
        ValueError: something holds a D-sized dimension in a way none of the roles covers (a
            convolution, a D x D parameter outside a ``Linear``), or an attention module's fused
            projection whose output is not a whole multiple of D; the message names it.
    """
    d = stream_width(model) if width is None else width
    if d < 1:
        raise ValueError(f"width must be a positive number of units, got {d}")
    modules = dict(model.named_modules())
    parts: list[StreamPart] = []
    covered: set[int] = set()  # ids of the parameters some part owns
    attributes: list[tuple[str, str]] = []
    tied = _tied_heads(model)
    mlp = _mlp_pairs(modules, d)
    for name, module in modules.items():
        if isinstance(module, nn.MultiheadAttention) and module.embed_dim == d:
            if not module._qkv_same_embed_dim:
                raise ValueError(
                    f"{name!r} is a MultiheadAttention with its own key and value widths (kdim, vdim), which "
                    "doubling the stream cannot follow; build it with kdim = vdim = embed_dim"
                )
            parts.append(StreamPart(name=name, role="mha", blocks=3))
            covered |= {id(p) for p in (module.in_proj_weight, module.in_proj_bias) if p is not None}
            attributes += [(name, a) for a in ("embed_dim", "kdim", "vdim", "num_heads")]
            continue
        part = _module_part(name, module, d, modules, tied, mlp - {output})
        if name == output and isinstance(module, nn.Linear) and module.in_features == d and part is not None:
            part = StreamPart(name=name, role="reader")
        if part is not None:
            parts.append(part)
            covered |= {id(p) for p in module.parameters(recurse=False)}
        attributes += _attributes(name, module, d)
    for bname, buffer in model.named_buffers():
        # A per-unit table ends in D; a square (L, L) attention mask that happens to be D long is no such table.
        square = buffer.dim() >= 2 and buffer.shape[-2] == buffer.shape[-1]
        if buffer.dim() >= 1 and buffer.shape[-1] == d and not square:
            raise ValueError(
                f"buffer {bname!r} (shape {tuple(buffer.shape)}) has a dimension of the stream's width {d}, and "
                "doubling the stream resizes parameters only: register a fixed table added to the stream (a "
                "sinusoidal position encoding) as nn.Parameter(..., requires_grad=False)"
            )
    for pname, p in model.named_parameters():
        if id(p) in covered or d not in p.shape:
            continue
        owner = modules[pname.rpartition(".")[0]]
        # A square D x D matrix is a projection written by hand, not a per-unit table.
        if p.shape[-1] == d and tuple(p.shape) != (d, d) and not isinstance(owner, _KNOWN):
            parts.append(StreamPart(name=pname, role="free"))
            covered.add(id(p))
            continue
        raise ValueError(
            f"{pname!r} ({type(owner).__name__}, shape {tuple(p.shape)}) has a dimension of the stream's width {d}, "
            "and doubling the stream cannot tell how it meets the stream: it follows Linear, Embedding, LayerNorm, "
            "RMSNorm and MultiheadAttention modules (built without add_bias_kv), and parameters whose last "
            "dimension is the stream's, added or scaled per unit (a (1, L, D) position table, a norm's scale); "
            "write a projection as an nn.Linear"
        )
    # Checked where the width was read off the model: a caller that names it (a restore, the cost
    # of a further doubling) plans a model whose input was found when its stream was first planned.
    if width is None and not any(p.role in ("embedding", "writer") for p in parts):
        raise ValueError(
            f"nothing writes {type(model).__name__}'s stream from its input: no nn.Embedding of width {d} and no "
            f"Linear into {d} units from another width; a Linear({d}, {d}) reading the input cannot be told from a "
            "projection inside the stream: embed tokens with nn.Embedding, or make the input's feature count "
            "differ from the model's width"
        )
    return StreamPlan(width=d, parts=tuple(parts), attributes=tuple(dict.fromkeys(attributes)), output=output)


def output_layer(model: nn.Module, sample_shape: tuple[int, ...], input_dtype: torch.dtype = torch.float32) -> str:
    """The ``Linear`` whose output ``model`` returns, found by one dry forward (meta device).

    Args:
        model: The model.
        sample_shape: One input sample's shape, without the batch dimension.
        input_dtype: The input's dtype (``torch.long`` for token ids).

    Returns:
        Its dotted name, or "" when what the model returns is no ``Linear``'s own output.
    """
    produced: list[tuple[str, torch.Tensor]] = []
    # The outputs are kept alive until the end: a freed tensor's id can be reused by a later one.
    handles = [
        m.register_forward_hook(lambda _m, _a, out, name=name: produced.append((name, out)))
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
    ]
    try:
        out = dry_forward(model, (2, *sample_shape), input_dtype)
    finally:
        for h in handles:
            h.remove()
    return next((name for name, t in produced if t is out), "")


def _module_part(
    name: str, module: nn.Module, d: int, modules: dict[str, nn.Module], tied: dict[int, str], mlp: set[str]
) -> StreamPart | None:
    if isinstance(module, nn.Embedding):
        return StreamPart(name=name, role="embedding") if module.embedding_dim == d else None
    if isinstance(module, _NORMS):
        shape = tuple(module.normalized_shape)
        if d in shape and shape != (d,):
            raise ValueError(f"{name!r} normalises over {shape}; doubling the stream follows a norm over (D,) only")
        return StreamPart(name=name, role="norm") if shape == (d,) else None
    if isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d) and d in (module.in_channels, module.out_channels):
        raise ValueError(
            f"{name!r} is a convolution with {d} channels, the stream's width; doubling the stream follows Linear "
            "projections only (write a patch embedding as a Linear over flattened patches)"
        )
    if not isinstance(module, nn.Linear):
        return None
    fan_in, fan_out = module.in_features, module.out_features
    if id(module.weight) in tied:
        # The head reads the stream with the embedding's own matrix: the embedding's part
        # duplicates it, and ``widen`` halves the norm before the head instead of splitting it.
        return None
    parent = modules[name.rpartition(".")[0]]
    if name in mlp or fan_in == fan_out == d:
        return StreamPart(name=name, role="through")
    if fan_in == d:
        if _is_attention(parent) and fan_out % d == 0:
            return StreamPart(name=name, role="fused", blocks=fan_out // d)
        if _is_attention(parent):
            raise ValueError(
                f"{name!r} projects the stream ({d}) to {fan_out} inside an attention module, not a whole number of "
                "D-wide blocks (q, k, v); doubling the stream cannot tell which outputs belong to which head"
            )
        return StreamPart(name=name, role="reader")
    return StreamPart(name=name, role="writer") if fan_out == d else None


def _mlp_pairs(modules: dict[str, nn.Module], d: int) -> set[str]:
    """Names of the ``Linear(D, F)`` and ``Linear(F, D)`` siblings: an MLP, whose hidden layer (F)
    doubles with the stream so the widened model is the wider model's shape.

    Siblings in a module that also holds the attention's projections and head count (a block
    written as one module) count too: a fused q/k/v projection (D -> 3D) has no sibling reading
    its 3D outputs, since its outputs are split into heads. Where one has (an MLP 3D wide beside
    a fused D -> 3D projection), the two cannot be told apart by shape, and the block is refused.

    Raises:
        ValueError: an attention module holds two ``Linear(D, F)`` that one ``Linear(F, D)``
            could read; the message says to give the MLP a module of its own.
    """
    linears: dict[str, list[tuple[str, nn.Linear]]] = {}
    for name, m in modules.items():
        if isinstance(m, nn.Linear):
            linears.setdefault(name.rpartition(".")[0], []).append((name, m))
    pairs: set[str] = set()
    for parent, siblings in linears.items():
        for down, b in siblings:
            ups = [
                up
                for up, a in siblings
                if a.in_features == d and b.out_features == d and a.out_features == b.in_features != d
            ]
            if len(ups) > 1 and _is_attention(modules[parent]):
                raise ValueError(
                    f"{parent!r} holds attention and {ups}, each D -> {b.in_features}, which {down!r} could read: "
                    "doubling the stream cannot tell the MLP's input from the fused q/k/v projection; give the "
                    "MLP a module of its own"
                )
            if ups:
                pairs |= {*ups, down}
    return pairs


def _is_attention(module: nn.Module) -> bool:
    return any(isinstance(getattr(module, a, None), int) for a in HEAD_ATTRIBUTES)


def _attributes(name: str, module: nn.Module, d: int) -> list[tuple[str, str]]:
    found = [(name, a) for a in HEAD_ATTRIBUTES if type(getattr(module, a, None)) is int]
    found += [(name, a) for a in WIDTH_ATTRIBUTES if type(getattr(module, a, None)) is int and getattr(module, a) == d]
    if isinstance(module, _KNOWN):
        # Their own size attributes are set from their weights by ``widen``.
        found = [(n, a) for n, a in found if a in HEAD_ATTRIBUTES and not isinstance(module, nn.MultiheadAttention)]
    return found


def _tied_heads(model: nn.Module) -> dict[int, str]:
    """``id(weight)`` -> name of each ``Linear`` whose weight is an ``Embedding``'s (a tied head)."""
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return {
        id(m.weight): name for name, m in model.named_modules() if isinstance(m, nn.Linear) and id(m.weight) in embedded
    }
