"""The zoo's host families as plain ``nn.Module``s, each small enough to train in seconds on a CPU.

Every family names its layers so that a recipe can point at them: the layers Esper's width kind
can widen (``widenable``) and the modules whose outputs a branch seed may take (``branch_slots``).
Two families come from elsewhere in the library: the MLP is ``MNIST1DMLP`` (any input length)
and the causal decoder is ``CharGPT``.

Legend: B batch, L length, T tokens, F features per token, C channels, H x W image, D model
width, K classes.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from esper_core.models.chars_gpt import CharGPT
from esper_core.models.mnist1d import MNIST1DMLP

__all__ = ["CharGPT", "MNIST1DMLP", "ZooCNN1d", "ZooCNN2d", "ZooEncoder", "ZooGRU", "ZooResNet"]


class ZooCNN1d(nn.Module):
    """``conv1..conv{depth}`` (each ``Conv1d(k=3, stride 2, pad 1) -> ReLU``), ``flatten``, ``fc``.

    Takes (B, L) signals or (B, 1, L) one-channel sequences.

    Args:
        channels: Channels of every convolution.
        depth: Convolutions; each halves the length (rounded up).
        in_length: Signal length L.
        num_classes: Output logits.
    """

    def __init__(self, *, channels: int, depth: int, in_length: int, num_classes: int) -> None:
        super().__init__()
        _check_positive(channels=channels, depth=depth, in_length=in_length, num_classes=num_classes)
        self.depth, self.in_length = depth, in_length
        length = in_length
        for i in range(1, depth + 1):
            self.add_module(f"conv{i}", nn.Conv1d(1 if i == 1 else channels, channels, 3, stride=2, padding=1))
            self.add_module(f"act{i}", nn.ReLU())
            length = (length - 1) // 2 + 1
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(channels * length, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(x.shape[0], 1, self.in_length)  # (B, 1, L)
        # Looked up by name on every call, so a module a slot replaced is the one that runs.
        for i in range(1, self.depth + 1):
            x = getattr(self, f"act{i}")(getattr(self, f"conv{i}")(x))  # (B, C, L / 2**i)
        return self.fc(self.flatten(x))  # (B, K)


class ZooCNN2d(nn.Module):
    """``depth`` blocks ``conv{i} (3x3) -> bn{i} -> act{i} -> pool{i}`` (2x2 max pooling while the
    image is at least 2 pixels wide), ``flatten``, ``fc``. Takes (B, 1, H, W) images.

    Args:
        channels: Channels of every convolution.
        depth: Blocks.
        image: Side of the square input image.
        num_classes: Output logits.
    """

    def __init__(self, *, channels: int, depth: int, image: int, num_classes: int) -> None:
        super().__init__()
        _check_positive(channels=channels, depth=depth, image=image, num_classes=num_classes)
        self.depth = depth
        side = image
        for i in range(1, depth + 1):
            self.add_module(f"conv{i}", nn.Conv2d(1 if i == 1 else channels, channels, 3, padding=1))
            self.add_module(f"bn{i}", nn.BatchNorm2d(channels))
            self.add_module(f"act{i}", nn.ReLU())
            # An image of one pixel cannot be pooled further; the block keeps it as it is.
            self.add_module(f"pool{i}", nn.MaxPool2d(2) if side >= 2 else nn.Identity())
            side = side // 2 if side >= 2 else side
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(channels * side * side, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(1, self.depth + 1):
            x = getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x))
            x = getattr(self, f"pool{i}")(getattr(self, f"act{i}")(x))  # (B, C, H / 2**i, W / 2**i)
        return self.fc(self.flatten(x))  # (B, K)


class ResidualBlock(nn.Module):
    """``relu(x + bn2(conv2(relu(bn1(conv1(x))))))`` at a constant number of channels.

    ``conv1``'s output reaches only ``conv2`` (through ``bn1`` and a ReLU), so a width seed can
    widen it; ``conv2``'s output meets the residual add, so its width is the stream's and fixed.
    """

    def __init__(self, channels: int, inner: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, inner, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(inner)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(inner, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(self.act1(self.bn1(self.conv1(x))))))  # (B, C, H, W)


class ZooResNet(nn.Module):
    """``stem`` (conv, BN, ReLU), ``blocks.0 .. blocks.{depth-1}`` (``ResidualBlock``), global
    average pooling and ``fc``. Takes (B, 1, H, W) images.

    Args:
        channels: Channels of the residual stream; each block's inner width starts equal to it.
        depth: Residual blocks.
        num_classes: Output logits.
    """

    def __init__(self, *, channels: int, depth: int, num_classes: int) -> None:
        super().__init__()
        _check_positive(channels=channels, depth=depth, num_classes=num_classes)
        self.stem = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())
        self.blocks = nn.ModuleList(ResidualBlock(channels, channels) for _ in range(depth))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)  # (B, C, H, W)
        for block in self.blocks:
            x = block(x)
        return self.fc(self.flatten(self.pool(x)))  # (B, C) -> (B, K)


class EncoderBlock(nn.Module):
    """A pre-norm transformer encoder block (bidirectional attention, then a 4x GELU MLP).

    ``fc``'s output reaches only ``proj`` (through a GELU), so a width seed can widen the MLP's
    hidden layer; the attention and ``proj`` write into the residual stream, whose width is fixed.
    """

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))  # (B, h, T, D/h)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, h, T, D/h)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))  # (B, T, D)


class ZooEncoder(nn.Module):
    """A transformer encoder classifier over a signal cut into tokens.

    The input (B, T * F) (or (B, T, F)) is read as T tokens of F features: ``embed`` (Linear
    F -> D) plus a learned position embedding, ``blocks.0 .. blocks.{depth-1}`` (``EncoderBlock``),
    ``ln_f``, the mean over tokens, then ``head``.

    Args:
        width: D, a multiple of ``heads``.
        depth: Encoder blocks.
        tokens: T.
        token_features: F.
        num_classes: Output logits.
        heads: Attention heads per block.
    """

    def __init__(
        self, *, width: int, depth: int, tokens: int, token_features: int, num_classes: int, heads: int = 2
    ) -> None:
        super().__init__()
        _check_positive(width=width, depth=depth, tokens=tokens, token_features=token_features, heads=heads)
        if width % heads:
            raise ValueError(f"width {width} must be a multiple of heads {heads}")
        self.tokens, self.token_features = tokens, token_features
        self.embed = nn.Linear(token_features, width)
        # (1, T, D): a per-unit table added to the stream, never mistaken for a D x D projection when T == D.
        self.position = nn.Parameter(torch.zeros(1, tokens, width))
        self.blocks = nn.ModuleList(EncoderBlock(width, heads) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x.reshape(x.shape[0], self.tokens, self.token_features)) + self.position  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x).mean(dim=1))  # (B, D) -> (B, K)


class ZooGRU(nn.Module):
    """A GRU classifier: ``gru`` over the sequence, its last step's state, then the head
    ``fc -> act -> out``.

    The input (B, T * F) (or (B, T, F)) is read as T steps of F features. The recurrent layer is
    not widenable (a width seed extends ``Linear`` and convolutions only); the head's hidden
    layer ``fc`` is.

    Args:
        hidden: Units of the GRU state and of the head's hidden layer.
        depth: Stacked GRU layers.
        steps: T.
        step_features: F.
        num_classes: Output logits.
    """

    def __init__(self, *, hidden: int, depth: int, steps: int, step_features: int, num_classes: int) -> None:
        super().__init__()
        _check_positive(hidden=hidden, depth=depth, steps=steps, step_features=step_features, num_classes=num_classes)
        self.steps, self.step_features = steps, step_features
        self.gru = nn.GRU(step_features, hidden, num_layers=depth, batch_first=True)
        self.fc = nn.Linear(hidden, hidden)
        self.act = nn.ReLU()
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, _ = self.gru(x.reshape(x.shape[0], self.steps, self.step_features))  # (B, T, hidden)
        return self.out(self.act(self.fc(states[:, -1])))  # (B, K)


def _check_positive(**values: int) -> None:
    bad = {name: v for name, v in values.items() if v < 1}
    if bad:
        raise ValueError(f"{', '.join(f'{k}={v}' for k, v in bad.items())}: must be >= 1")
