"""Mixed precision as one object: the loop calls ``autocast() / backward() / unscale() / step()``
and never branches on dtype (seed 000, change 2).

CUDA: bf16 autocast where the GPU supports it (no scaler needed), else fp16 with a GradScaler.
CPU: full fp32; autocast is a no-op. The choice is resolved once and reported.
"""

from __future__ import annotations

import contextlib

import torch

AMP_CHOICES = ("auto", "off", "bf16", "fp16")
_NO_AUTOCAST = contextlib.nullcontext()


class Precision:
    """Resolved precision policy of one trainer.

    Args:
        device: where training runs.
        requested: ``auto`` (bf16/fp16 on CUDA, fp32 on CPU), ``off``, ``bf16`` or ``fp16``.

    Raises:
        ValueError: for an unknown choice, or a half-precision choice on a device without CUDA.
    """

    def __init__(self, device: torch.device, requested: str = "auto") -> None:
        if requested not in AMP_CHOICES:
            raise ValueError(f"amp must be one of {AMP_CHOICES}, got {requested!r}")
        if requested in ("bf16", "fp16") and device.type != "cuda":
            raise ValueError(f"amp={requested!r} needs a CUDA device (training on {device}); use amp='auto' or 'off'")
        self.device = device
        self.dtype: torch.dtype | None = None
        if device.type == "cuda" and requested != "off":
            bf16_ok = torch.cuda.is_bf16_supported()
            want_bf16 = requested == "bf16" or (requested == "auto" and bf16_ok)
            if requested == "bf16" and not bf16_ok:
                raise ValueError("amp='bf16' requested but this GPU does not support bf16; use 'fp16' or 'auto'")
            self.dtype = torch.bfloat16 if want_bf16 else torch.float16
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range.
        self.scaler = torch.amp.GradScaler("cuda") if self.dtype is torch.float16 else None
        self._unscaled = False

    @property
    def enabled(self) -> bool:
        """True when autocast runs in half precision."""
        return self.dtype is not None

    def describe(self) -> str:
        """E.g. ``bf16 autocast`` or ``fp32 (amp off on cpu)``."""
        if self.dtype is None:
            return f"fp32 (amp off on {self.device.type})"
        name = "bf16" if self.dtype is torch.bfloat16 else "fp16 + GradScaler"
        return f"{name} autocast"

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """Forward-pass context: half-precision autocast when enabled, else nothing.

        Entered once a training step: without autocast it is one shared ``nullcontext``, not a
        generator-based context manager (a few microseconds a step on the smallest hosts)."""
        if self.dtype is None:
            return _NO_AUTOCAST
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` multiplied by the current loss scale (unchanged without a GradScaler)."""
        return loss if self.scaler is None else self.scaler.scale(loss)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward pass, scaled when a GradScaler is in use."""
        self._unscaled = False
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale before anyone reads them (metrics, clipping)."""
        if self.scaler is not None and not self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled = True

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Optimizer step (skipped by the scaler on inf/NaN gradients) and scale update."""
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
            self._unscaled = False
        else:
            optimizer.step()

    def state_dict(self) -> dict:
        """Scaler state for checkpoints (empty without a scaler)."""
        return {} if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Inverse of ``state_dict``."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
