"""Per-epoch training signals measured beside the step: train accuracy and slot bottlenecks.

**Train accuracy** rides in the step's return value (``batch_stats``): the step closure returns
a ``(3,)`` tensor ``[loss sum, correct, counted]`` that the loop adds up on the device and reads
once per epoch with the loss (the same single sync as before). Counting inside the closure keeps
it valid on every path of the step engine: eager, compiled (two extra ops in the traced graph)
and a captured CUDA graph (the counts are computed on the static buffers at each replay).

**Slot bottleneck** (``slot_activation_grad_norms``): the norm of the loss gradient with respect
to the activation leaving each seed slot, DORMANT slots included. It is measured once per epoch
by one extra forward and a partial backward on the trainer's fixed probe batch, not by hooks on
the training steps, because:

- a hook inside the step would have to survive ``torch.compile`` and CUDA-graph capture (a
  tensor hook registered in a traced forward either breaks the graph or is baked into it), and
  the aggregated step (two or more trainable seeds) runs several forwards per step, whose
  gradients at a slot mean different things;
- the probe runs with the model in eval mode and without touching ``.grad`` (``autograd.grad``
  on the activations only), so it draws no random numbers, updates no normalisation statistics
  and leaves the run's numbers bit-identical with or without it;
- a fixed batch makes the epoch-to-epoch change reflect the model, not which batch was drawn.

Its cost is about one training step per epoch (the backward stops at the first slot). The
value is the root-mean-square over the probe samples of each sample's gradient norm of the
summed loss, i.e. ``||dL_sum/dA||_F / sqrt(B)``, so it does not depend on the batch size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def classifies(logits: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether accuracy means anything here: integer class targets and (B, classes) logits."""
    return not y.dtype.is_floating_point and logits.dim() == 2


def batch_stats(loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``[loss sum, correct, counted]`` of one batch, detached, float32, on the loss's device.

    ``loss`` is the batch's mean loss; ``counted`` is the batch size when ``classifies`` holds
    and 0 otherwise (then ``correct`` is 0 too). No host sync: safe inside a compiled or
    captured step.
    """
    n = y.shape[0]
    loss_sum = loss.detach().float() * n
    if classifies(logits, y):
        correct = (logits.detach().argmax(dim=1) == y).sum(dtype=torch.float32)
        counted = loss_sum.new_full((), float(n))
    else:
        correct = torch.zeros_like(loss_sum)
        counted = torch.zeros_like(loss_sum)
    return torch.stack([loss_sum, correct, counted])  # (3,)


def train_accuracy(correct: float, counted: float) -> float | None:
    """The epoch's train accuracy from the summed ``batch_stats``; None when nothing was counted."""
    return correct / counted if counted > 0 else None


def slot_activation_grad_norms(
    model: nn.Module,
    slots: Mapping[str, nn.Module],
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
) -> dict[str, float | None]:
    """The loss gradient's norm at each slot's output on one batch (see the module docstring).

    Args:
        model: The host (its slots must be among its submodules, called in its forward).
        slots: Slot id -> slot module.
        loss_fn: The training loss (mean over the batch).
        x: The probe batch's inputs, (B, *sample_shape).
        y: Its targets.

    Returns:
        Slot id -> RMS over samples of the per-sample gradient norm; None for a slot the forward
        did not pass through, or whose value is not finite.
    """
    outputs: dict[str, torch.Tensor] = {}

    def capture(slot_id: str) -> Callable[[nn.Module, object, torch.Tensor], torch.Tensor]:
        def hook(_module: nn.Module, _args: object, out: torch.Tensor) -> torch.Tensor:
            # A slot on the raw input (nothing upstream requires grad) gets a leaf that does,
            # with the same values, so its gradient exists too.
            if not out.requires_grad:
                out = out.detach().requires_grad_()
            outputs[slot_id] = out  # a slot called twice in one forward keeps its last call
            return out

        return hook

    handles = [slot.register_forward_hook(capture(sid)) for sid, slot in slots.items()]
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            loss_sum = loss_fn(model(x), y).float() * y.shape[0]
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    seen = [sid for sid in slots if sid in outputs]
    if not seen or not loss_sum.requires_grad:
        return dict.fromkeys(slots)
    # Gradients for the activations only: no parameter's .grad is touched.
    grads = torch.autograd.grad(loss_sum, [outputs[sid] for sid in seen], allow_unused=True)
    nan = torch.full((), math.nan, device=loss_sum.device)
    norms = torch.stack([nan if g is None else g.float().norm() for g in grads]) / math.sqrt(y.shape[0])
    values = dict(zip(seen, norms.tolist(), strict=True))  # one device sync
    return {sid: _finite(values.get(sid)) for sid in slots}


def slot_input_and_gradient(
    model: nn.Module, slot: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The activation entering ``slot`` and the loss gradient at its output, on one batch.

    As ``slot_activation_grad_norms``: eval mode, no ``.grad`` touched, no RNG drawn. The slot's
    output is replaced by a detached leaf, so the backward stops at the slot.

    Args:
        model: The host (``slot`` must be called in its forward).
        slot: The slot module.
        loss_fn: The training loss (mean over the batch).
        x: The batch's inputs.
        y: Its targets.

    Returns:
        ``(activation, gradient)``, each (B, *feature_shape), detached.
    """
    captured: list[torch.Tensor] = []

    def cut(_module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
        captured[:] = [args[0].detach(), out.detach().requires_grad_()]
        return captured[1]

    handle = slot.register_forward_hook(cut)
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            loss = loss_fn(model(x), y)
    finally:
        handle.remove()
        model.train(was_training)
    if not captured:
        raise ValueError("the slot was not called in the model's forward: attach it to a layer the forward runs")
    (grad,) = torch.autograd.grad(loss, captured[1])
    return captured[0], grad


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
