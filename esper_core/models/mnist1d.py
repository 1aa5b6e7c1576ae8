"""The three models of the MNIST-1D paper's benchmark table, as plain ``nn.Module``s.

Architectures follow the paper's repository (greydanus/mnist1d, ``notebooks/models.py``):

- ``MNIST1DLogistic``: one linear layer, 40 -> 10 (the table's logistic regression, 32 %).
- ``MNIST1DMLP``: ``depth`` hidden ``Linear -> ReLU`` layers of ``width`` units, then ``out``.
  The paper's MLP (68 %) has width 100 and two hidden layers, the second one residual
  (``h + relu(W h)``); ours is a plain stack, whose accuracy the benchmark shows is the same.
- ``MNIST1DCNN``: three ``Conv1d -> ReLU`` layers of ``channels`` channels, each halving the
  length (kernel 5 then 3, 3; stride 2; padding 1: 40 -> 19 -> 10 -> 5), flattened into a
  linear classifier ``fc``. ``channels=25`` is the paper's CNN (94 %), 5,210 parameters.

Legend: B batch, L signal length (40), W width, C channels, K classes (10).
"""

from __future__ import annotations

import torch
from torch import nn

# (kernel, stride, padding) of conv1..conv3, as in the paper's CNN.
CONV_SPECS = ((5, 2, 1), (3, 2, 1), (3, 2, 1))


class MNIST1DLogistic(nn.Module):
    """Multinomial logistic regression: ``fc`` maps (B, L) signals to (B, K) logits."""

    def __init__(self, *, in_features: int = 40, num_classes: int = 10) -> None:
        super().__init__()
        _check_positive(in_features=in_features, num_classes=num_classes)
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)  # (B, L) -> (B, K)


class MNIST1DMLP(nn.Module):
    """``fc1 -> act1 -> ... -> fc{depth} -> act{depth} -> out`` on (B, L) signals.

    Args:
        width: Units of every hidden layer (the paper's MLP: 100).
        depth: Hidden layers (the paper's MLP: 2).
        in_features: Signal length.
        num_classes: Output logits.
    """

    def __init__(self, *, width: int = 100, depth: int = 2, in_features: int = 40, num_classes: int = 10) -> None:
        super().__init__()
        _check_positive(width=width, depth=depth, in_features=in_features, num_classes=num_classes)
        self.width, self.depth = width, depth
        for i in range(1, depth + 1):
            self.add_module(f"fc{i}", nn.Linear(in_features if i == 1 else width, width))
            self.add_module(f"act{i}", nn.ReLU())
        self.out = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Looked up by name on every call, so a layer replaced from outside (a slot wrapping
        # ``fc2``, say) is the one that runs.
        for i in range(1, self.depth + 1):
            x = getattr(self, f"act{i}")(getattr(self, f"fc{i}")(x))  # (B, W)
        return self.out(x)  # (B, K)


class MNIST1DCNN(nn.Module):
    """``conv1..conv3`` (each ``Conv1d -> ReLU``), ``flatten``, then the linear classifier ``fc``.

    Takes (B, L) signals or (B, 1, L) one-channel sequences.

    Args:
        channels: Channels of every conv layer (the paper's CNN: 25).
        in_length: Signal length L.
        num_classes: Output logits.
    """

    # Registered by name in __init__ (add_module); declared here for the type checker.
    conv1: nn.Conv1d
    conv2: nn.Conv1d
    conv3: nn.Conv1d
    act1: nn.ReLU
    act2: nn.ReLU
    act3: nn.ReLU

    def __init__(self, *, channels: int = 25, in_length: int = 40, num_classes: int = 10) -> None:
        super().__init__()
        _check_positive(channels=channels, in_length=in_length, num_classes=num_classes)
        self.channels, self.in_length = channels, in_length
        length = in_length
        for i, (kernel, stride, padding) in enumerate(CONV_SPECS, start=1):
            self.add_module(f"conv{i}", nn.Conv1d(1 if i == 1 else channels, channels, kernel, stride, padding))
            self.add_module(f"act{i}", nn.ReLU())
            length = (length + 2 * padding - kernel) // stride + 1
            if length < 1:
                raise ValueError(f"in_length={in_length} is too short for the three stride-2 convolutions; use >= 3")
        self.out_length = length
        """Length of conv3's output (5 for L = 40); ``fc`` reads ``channels * out_length`` features."""
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(channels * length, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1:] not in ((self.in_length,), (1, self.in_length)):
            raise ValueError(
                f"MNIST1DCNN takes (B, {self.in_length}) or (B, 1, {self.in_length}) inputs, got {tuple(x.shape)}"
            )
        x = x.view(x.shape[0], 1, self.in_length)  # (B, 1, L)
        x = self.act1(self.conv1(x))  # (B, C, 19) for L = 40
        x = self.act2(self.conv2(x))  # (B, C, 10)
        x = self.act3(self.conv3(x))  # (B, C, 5)
        return self.fc(self.flatten(x))  # (B, C * L_3) -> (B, K)


def _check_positive(**values: int) -> None:
    bad = {name: v for name, v in values.items() if v < 1}
    if bad:
        raise ValueError(f"{', '.join(f'{k}={v}' for k, v in bad.items())}: must be >= 1")
