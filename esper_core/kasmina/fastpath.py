"""Kasmina checks an artifact's guard schema once, at G0, against the slot's fixed shape; after
that the per-call input checks an exported program carries are pure overhead on the training hot
path (measured: a seed-reference step 429 -> 294 us). This module removes them.

It also drops the no-op hooks an exported module carries for module-typed inputs when it has
none, and gives a seed that maps one tensor to one tensor (every branch seed) a plain calling
convention: an exported module's generated ``forward`` flattens its arguments and unflattens its
result through pytree specs on every call, ~7 us of a 31 us low-rank adapter forward and ~16 us
of its forward and backward, on every training and evaluation pass (digits MLP, one thread).

Last, ``call_ops_directly`` has the exported graph call each ATen op through the Python binding
eager PyTorch uses (``torch._C._nn.linear``) instead of its ``OpOverload`` object
(``torch.ops.aten.linear.default``), whose call goes through the slower generic operator path:
the digits MLP's low-rank adapter took 109 us a forward and backward that way against 100 us as
the same ``nn.Module`` in eager PyTorch, and 101-103 us once rebound. Each rebinding is checked
on an example input: the graph must dispatch exactly the same ATen ops and give a bit-identical
result, or it keeps its OpOverloads.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch import fx, nn
from torch.utils._python_dispatch import TorchDispatchMode

from esper_core.karn.profiles import ShapeProfile

# Names torch.export gives its runtime input checks: a graph call and a forward pre-hook.
_GUARD_TARGET = "_guards_fn"
_GUARD_HOOK = "_check_input_constraints_pre_hook"


def prepare_seed(module: nn.Module, profile: ShapeProfile) -> nn.Module:
    """A loaded kernel made ready for the training hot path (in place), once G0 accepted its guard
    for ``profile``: its per-call checks stripped (``strip_runtime_guards``) and its ATen ops
    called through their Python bindings (``call_ops_directly``, checked on a two-sample batch of
    the profile's shape and dtype, drawn from a generator of its own)."""
    strip_runtime_guards(module)
    param = next(module.parameters(), None)
    generator = torch.Generator().manual_seed(0)
    example = torch.randn((2, *profile.feature_shape), generator=generator, dtype=getattr(torch, profile.dtype))
    call_ops_directly(module, example.to(param.device if param is not None else "cpu"))
    return module


def strip_runtime_guards(module: nn.Module) -> nn.Module:
    """Remove torch.export's per-call input checks from ``module`` (in place) and return it.

    Only call this after ``check_guard`` accepted the slot's shape: afterwards a wrong input is
    no longer refused by the module itself. Modules without such checks are returned unchanged.
    """
    for key, hook in list(module._forward_pre_hooks.items()):
        if getattr(hook, "__name__", "") == _GUARD_HOOK or _GUARD_HOOK in repr(hook) or _empty_module_input_hook(hook):
            del module._forward_pre_hooks[key]
            module._forward_pre_hooks_with_kwargs.pop(key, None)
    for key, hook in list(module._forward_hooks.items()):
        if _empty_module_input_hook(hook):
            del module._forward_hooks[key]
            module._forward_hooks_with_kwargs.pop(key, None)
            module._forward_hooks_always_called.pop(key, None)
    if isinstance(module, fx.GraphModule):
        guards = [n for n in module.graph.nodes if n.op == "call_module" and n.target == _GUARD_TARGET]
        for node in guards:
            module.graph.erase_node(node)
        plain = _plain_calling_convention(module.graph)
        if guards or plain:
            module.recompile()
    return module


def _empty_module_input_hook(hook: object) -> bool:
    """Whether ``hook`` is one of the pair an exported module gets to register the types of its
    ``nn.Module`` inputs as pytree nodes around each call, with no such type: a no-op, but any
    hook sends every call down ``nn.Module``'s slower hook path (~4 us of a seed's forward)."""
    if "_create_stateful_graph_module" not in getattr(hook, "__qualname__", ""):
        return False
    cells = [cell.cell_contents for cell in getattr(hook, "__closure__", None) or ()]
    return cells == [set()]


def _plain_calling_convention(graph: fx.Graph) -> bool:
    """Turn a pytree-flattening graph with positional tensor inputs and one tensor output into a
    plain ``forward(self, *inputs) -> output``; False (unchanged) for any other signature."""
    # The pytree convention is only visible on the graph's code generator (private in torch.fx).
    info = getattr(graph._codegen, "pytree_info", None)
    if info is None:
        return False
    positional = pytree.tree_structure((tuple(range(len(info.orig_args))), {}))
    if info.in_spec != positional or info.out_spec != pytree.tree_structure(0):
        return False
    output = next(node for node in graph.nodes if node.op == "output")
    (result,) = output.args[0]  # the flattened outputs: a single tensor's
    output.args = (result,)
    graph.set_codegen(fx.graph.CodeGen())
    return True


# Where PyTorch's generated Python bindings of ATen ops live (``torch.X``, ``torch.nn.functional``'s
# ``torch._C._nn.X``, ``torch.special`` ...): plain C++ functions with a fast argument parser.
_BINDINGS = (torch._C._VariableFunctions, torch._C._nn, torch._C._special, torch._C._linalg, torch._C._fft)


def call_ops_directly(module: nn.Module, example: torch.Tensor) -> tuple[str, ...]:
    """Point each ATen op call of ``module``'s graph at the op's Python binding (in place).

    A binding resolves its overload from the argument types, so each rebinding is verified on
    ``example`` (an input the seed accepts): run before and after, the graph must dispatch the same
    ATen ops in the same order and return a bit-identical result. If it does not, every call
    keeps its ``OpOverload``. The check runs without gradients, puts back the values of the
    module's buffers (a graph may update some, such as a batch norm's running statistics) and
    restores the RNG state, so it changes nothing of the seed's and draws nothing from the run's
    random stream.

    Args:
        module: An exported seed (``fx.GraphModule``); any other module is left as it is.
        example: One input batch of the shape, dtype and device the seed takes.

    Returns:
        The rebound ops' names (e.g. ``("aten.linear.default", ...)``); empty if none was,
        including when the graph cannot run on ``example`` (a seed is never refused here).
    """
    if not isinstance(module, fx.GraphModule):
        return ()
    # node -> (its OpOverload, the binding that replaces it)
    targets = {
        node: (node.target, binding)
        for node in module.graph.nodes
        if node.op == "call_function" and (binding := _binding(node.target)) is not None
    }
    if not targets:
        return ()
    try:
        before = _dispatched(module, example)
    except RuntimeError:  # the example does not suit this seed: nothing to check against, no change
        return ()
    for node, (_, binding) in targets.items():
        node.target = binding
    module.recompile()
    try:
        after = _dispatched(module, example)
        same = before[0] == after[0] and _bit_identical(before[1], after[1])
    except RuntimeError:
        same = False
    if not same:
        for node, (op, _) in targets.items():
            node.target = op
        module.recompile()
        return ()
    return tuple(str(op) for op, _ in targets.values())


def _binding(target: object) -> object | None:
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    name = target.overloadpacket.__name__
    return next((getattr(ns, name) for ns in _BINDINGS if hasattr(ns, name)), None)


class _OpRecorder(TorchDispatchMode):
    """Records every ATen op dispatched below autograd, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[torch._ops.OpOverload] = []

    def __torch_dispatch__(
        self, func: torch._ops.OpOverload, types: object, args: tuple = (), kwargs: dict | None = None
    ) -> object:
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _dispatched(module: nn.Module, example: torch.Tensor) -> tuple[list[torch._ops.OpOverload], object]:
    devices = [example.device] if example.device.type == "cuda" else []
    # The buffers' values are put back afterwards (copying the whole graph module instead warns
    # on every germination: torch deprecates copying the pytree specs it keeps).
    saved = [(buffer, buffer.clone()) for buffer in module.buffers()]
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad(), _OpRecorder() as recorder:
            out = module(example)
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
    return recorder.ops, out


def _bit_identical(a: object, b: object) -> bool:
    flat_a, spec_a = pytree.tree_flatten(a)
    flat_b, spec_b = pytree.tree_flatten(b)
    return spec_a == spec_b and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(flat_a, flat_b, strict=True)
    )
