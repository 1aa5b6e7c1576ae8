"""Growth signals Tolaria measures for Tamiyo, once per epoch and only when someone reads them.

Which signals an epoch measures is ``GROWTH_SIGNALS`` filtered by the trainer's ``signals`` (the
run's readers: the deciding policy, and Simic when the run's decisions are recorded for it; see
``esper_core.run.build.growth_signals``). Nothing of it runs inside the training steps: an
unread signal costs nothing, and a read one costs a fixed amount per epoch, whatever the number
of steps.

**Train accuracy** (``sample_accuracy``): the share of a fixed sample of training signals
(the first ``TRAIN_ACCURACY_SAMPLES`` in data order) the model classifies correctly at the end of
the epoch, under inference mode. Counting it inside each training step (as before) cost an
argmax and a sum per step, about 15 % of a digits-MLP epoch; at the epoch's end it is one
inference forward, and it is measured on the same weights as the validation accuracy, so the
train-validation gap compares like with like. 512 samples put one epoch's value within about
+-2 points (binomial SD at 80 %: 1.8 points), finer than a policy needs to tell under- from
over-fitting.

**Slot bottleneck** (``slot_activation_grad_norms``): the norm of the loss gradient with respect
to the activation leaving each slot that can act (``ACTING_STAGES``: DORMANT slots, which can
germinate, and seeds in flight, which can be advanced or culled; not FOSSILIZED, CULLED or
EMBARGOED slots). It is measured by one extra forward and a partial backward on the trainer's
fixed probe batch, not by hooks on the training steps, because:

- a hook inside the step would have to survive ``torch.compile`` and CUDA-graph capture (a
  tensor hook registered in a traced forward either breaks the graph or is baked into it), and
  the aggregated step (two or more trainable seeds) runs several forwards per step, whose
  gradients at a slot mean different things;
- the probe runs with the model in eval mode and without touching ``.grad`` (``autograd.grad``
  on the activations only), so it draws no random numbers, updates no normalisation statistics
  and leaves the run's numbers bit-identical with or without it;
- a fixed batch makes the epoch-to-epoch change reflect the model, not which batch was drawn.

Its cost is about one training step per epoch (the backward stops at the first measured slot).
The value is the root-mean-square over the probe samples of each sample's gradient norm of the
summed loss, i.e. ``||dL_sum/dA||_F / sqrt(B)``, so it does not depend on the batch size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import nn

from esper_core.contracts import SeedStage
from esper_core.tolaria.modes import eval_mode

GROWTH_SIGNALS = ("train_accuracy", "activation_grad_norm")
"""The signals an epoch can measure for Tamiyo, by the packet field each fills."""
TRAIN_ACCURACY_SAMPLES = 512
"""Training samples the train accuracy is measured on (all of a smaller training split)."""
ACTING_STAGES = frozenset(
    {
        SeedStage.DORMANT,
        SeedStage.GERMINATED,
        SeedStage.TRAINING,
        SeedStage.BLENDING,
        SeedStage.PROBATIONARY,
    }
)
"""Stages in which a slot can act (germinate, or move its seed on): only these are probed."""

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def classifies(logits: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether accuracy means anything here: integer class targets and (B, classes) logits."""
    return not y.dtype.is_floating_point and logits.dim() == 2


def sample_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Share of ``x`` that ``model`` classifies as ``y`` under inference mode; None when the
    targets are not class indices (``classifies``). Leaves the model's train/eval mode as it was.

    Args:
        model: The host.
        x: A fixed sample of training inputs, (N, *sample_shape).
        y: Its targets.
    """
    with eval_mode(model), torch.inference_mode():
        logits = model(x)
    if not classifies(logits, y):
        return None
    return (logits.argmax(dim=1) == y).sum().item() / y.shape[0]


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
    try:
        with eval_mode(model), torch.enable_grad():
            loss_sum = loss_fn(model(x), y).float() * y.shape[0]
    finally:
        for handle in handles:
            handle.remove()
    seen = [sid for sid in slots if sid in outputs]
    if not seen or not loss_sum.requires_grad:
        return dict.fromkeys(slots)
    # Gradients for the activations only: no parameter's .grad is touched.
    grads = torch.autograd.grad(loss_sum, [outputs[sid] for sid in seen], allow_unused=True)
    nan = torch.full((), math.nan, device=loss_sum.device)
    norms = torch.stack([nan if g is None else g.float().norm() for g in grads]) / math.sqrt(y.shape[0])
    values = dict(zip(seen, norms.tolist(), strict=True))  # one device sync
    return {sid: _finite(values.get(sid)) for sid in slots}


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
