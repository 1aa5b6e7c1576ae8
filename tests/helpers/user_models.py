"""Models written the way people write them, none by anyone on the project, and their recipes.

Each recipe names only the model, the data and the slots (no blueprint list): Esper finds the
blueprints that fit each slot. The only other settings keep the tests cheap on a shared CPU
(a few epochs, an eager step: these tests are about growing, not about the step compiler).
The recipes are found by import path (``tests.helpers.user_models:cnn``), as a user's would be.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn
from torch.utils.data import TensorDataset

from esper_core.kasmina.config import KasminaConfig
from esper_core.run import DataSpec, DataSplits, ModelSpec, RunConfig, StepEngineConfig, TrainerConfig
from esper_core.tamiyo.config import ScheduledGermination, TamiyoConfig


@functools.cache
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0  # (1797, 64) in [0, 1]
    return x, torch.tensor(bunch.target)


def _splits(shape: tuple[int, ...]) -> DataSplits:
    """The 8x8 digits as ``shape`` per sample: 1,000 train, 397 validation, 400 test."""
    x, y = _digits()
    x = x.reshape(len(x), *shape)
    return DataSplits(
        train=TensorDataset(x[:1000], y[:1000]),
        val=TensorDataset(x[1000:1397], y[1000:1397]),
        test=TensorDataset(x[1397:], y[1397:]),
        num_classes=10,
    )


def digit_images() -> DataSplits:
    """The digits as (1, 8, 8) images."""
    return _splits((1, 8, 8))


def digit_rows() -> DataSplits:
    """The digits as sequences of 8 rows of 8 pixels: (L, D) = (8, 8), channels last."""
    return _splits((8, 8))


class DigitsCNN(nn.Module):
    """A small CNN with BatchNorm in an ``nn.Sequential``: seeds grow on ``features.2`` and ``.5``;
    ``dropout`` > 0 puts a Dropout before the classifier's Linear."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        head = [nn.Flatten(), *([nn.Dropout(dropout)] if dropout > 0 else []), nn.Linear(16 * 4 * 4, 10)]
        self.classifier = nn.Sequential(*head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class RowTransformer(nn.Module):
    """A transformer encoder over the 8 rows of a digit: ``encoder.layers.0`` and ``.1`` output (B, L, D)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.position = nn.Parameter(torch.zeros(1, 8, width))
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=2 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(x) + self.position)  # (B, L, D)
        return self.head(h.mean(dim=1))


class RowLSTM(nn.Module):
    """An LSTM over the 8 rows of a digit (``batch_first=True``); it returns (output, (h, c))."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, width, batch_first=True)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)  # (B, L, width)
        return self.head(out[:, -1])


_EAGER = TrainerConfig(optimizer="adam", lr=3e-3, val_batch_size=512, step=StepEngineConfig(compile="off"))


def cnn() -> RunConfig:
    """The CNN on the digit images; no blueprint list: the conv blueprints fit both slots."""
    return RunConfig(
        epochs=4,
        host=ModelSpec(build=DigitsCNN, slots=("features.2", "features.5")),
        data=DataSpec(load=digit_images, batch_size=64, name="digit-images"),
        trainer=_EAGER,
    )


def cnn_with_dropout() -> RunConfig:
    """The CNN with a Dropout: its training steps update BatchNorm statistics and draw random masks."""
    config = cnn()
    config.host = ModelSpec(build=lambda: DigitsCNN(dropout=0.2), slots=("features.2", "features.5"))
    return config


def cnn_with_a_misfit() -> RunConfig:
    """The same, listing a vector blueprint that fits neither (C, H, W) slot: refused before any run."""
    config = cnn()
    config.blueprints = ("conv_residual", "residual_mlp")
    return config


def transformer() -> RunConfig:
    """The transformer encoder on the digit rows; slots on its two layers' (B, L, D) outputs."""
    return RunConfig(
        epochs=4,
        host=ModelSpec(build=RowTransformer, slots=("encoder.layers.0", "encoder.layers.1")),
        data=DataSpec(load=digit_rows, batch_size=64, name="digit-rows"),
        trainer=_EAGER,
    )


def lstm() -> RunConfig:
    """The LSTM on the digit rows; the slot takes element 0 of its (output, (h, c)) tuple."""
    return RunConfig(
        epochs=4,
        host=ModelSpec(build=RowLSTM, slots=("lstm[0]",)),
        data=DataSpec(load=digit_rows, batch_size=64, name="digit-rows"),
        trainer=_EAGER,
    )


def lstm_without_an_index() -> RunConfig:
    """The LSTM with its slot on the module itself, whose output is a tuple: refused, naming 'lstm[0]'."""
    config = lstm()
    config.host = ModelSpec(build=RowLSTM, slots=("lstm",))
    return config


def cnn_widen() -> RunConfig:
    """The CNN with both convolutions widenable and no branch slot: Tamiyo can only widen.

    ``features.0`` feeds ``features.3`` through a BatchNorm and a ReLU; ``features.3`` feeds the
    classifier through a BatchNorm, a ReLU, a max-pool and a flatten (the Linear gains 16 inputs
    per new channel)."""
    return RunConfig(
        epochs=6,
        host=ModelSpec(build=DigitsCNN, widen=("features.0", "features.3")),
        data=DataSpec(load=digit_images, batch_size=64, name="digit-images"),
        trainer=_EAGER,
    )


def cnn_widen_scheduled() -> RunConfig:
    """``cnn_widen`` with its first convolution widened by half after epoch 0 (policy ``scheduled``):
    the seed's lifecycle runs to a merge within the run's six epochs."""
    config = cnn_widen()
    config.host = ModelSpec(build=DigitsCNN, slots=("features.2",), widen=("features.0", "features.3"))
    config.tamiyo = TamiyoConfig(
        policy="scheduled",
        schedule=(ScheduledGermination(epoch=0, slot="features.0+width", blueprint="width-50"),),
    )
    return config


def digit_vectors() -> DataSplits:
    """The digits as flat 64-pixel vectors."""
    return _splits((64,))


class DigitsMLP(nn.Module):
    """A 64-64-48 MLP without normalisation or dropout: a data-parallel run of it can match the
    single-process run to floating-point rounding (BatchNorm would see each process's shard)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 64)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(64, 48)
        self.act2 = nn.ReLU()
        self.fc3 = nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.act2(self.fc2(self.act1(self.fc1(x)))))


def mlp_grown() -> RunConfig:
    """``DigitsMLP`` grown both ways on a schedule: ``fc2`` widened by half after epoch 0 (merged
    within the run), a ``residual_mlp`` branch on ``act1`` after epoch 1 (a digits-mlp kernel fits
    its 64-wide slot). From epoch 2 both seeds train at once: the aggregated (PCGrad) step.

    Both seeds start from random weights (``width_init="random"``, ``seed_init="default"``), not
    from the data-aware defaults: TINY solves for 24 new units through a consumer of rank 10, and
    the units beyond its rank take directions that a 1e-7 change of the host's weights turns
    around (measured: fan-in entries move by 0.5); GradMax's input rows beyond the gradient's rank
    likewise (0.5 on the branch's first layer). A data-parallel run's weights differ from one
    process's by such rounding, so under the defaults the two make the same decisions but their
    weights part after a germination by more than rounding."""
    return RunConfig(
        epochs=8,
        host=ModelSpec(build=DigitsMLP, slots=("act1",), widen=("fc2",)),
        data=DataSpec(load=digit_vectors, batch_size=64, name="digit-vectors"),
        trainer=_EAGER,
        kasmina=KasminaConfig(width_init="random", seed_init="default"),
        tamiyo=TamiyoConfig(
            policy="scheduled",
            schedule=(
                ScheduledGermination(epoch=0, slot="fc2+width", blueprint="width-50"),
                ScheduledGermination(epoch=1, slot="act1", blueprint="residual_mlp"),
            ),
        ),
    )


def mlp_widen_long() -> RunConfig:
    """``DigitsMLP`` widened at ``fc2`` after epoch 0, for 40 epochs: long enough to stop a run
    in the middle (no kernel needed). Random new units, as in ``mlp_grown``."""
    return RunConfig(
        epochs=40,
        host=ModelSpec(build=DigitsMLP, widen=("fc2",)),
        data=DataSpec(load=digit_vectors, batch_size=64, name="digit-vectors"),
        trainer=_EAGER,
        kasmina=KasminaConfig(width_init="random"),
        tamiyo=TamiyoConfig(
            policy="scheduled", schedule=(ScheduledGermination(epoch=0, slot="fc2+width", blueprint="width-50"),)
        ),
    )


def mlp_widen_compiled() -> RunConfig:
    """``mlp_widen_long`` for 8 epochs with the compiled step (``aot_eager``: no code generation),
    to count the step's traces across a germination, a blend and a merge."""
    config = mlp_widen_long()
    config.epochs = 8
    config.trainer = TrainerConfig(
        optimizer="adam",
        lr=3e-3,
        val_batch_size=512,
        step=StepEngineConfig(compile="on", compile_backend="aot_eager", compile_warmup_steps=1),
    )
    return config


_TEXT = (
    "a depth seed inserts one more block after the last block of a stack and blends it in from the "
    "identity, so the network it grows on is unchanged when it germinates and deeper once it merges. "
)


def tiny_chars() -> DataSplits:
    """Windows of a short text as ids of a 16-symbol vocabulary: 9 ids per window, the first 8 the
    context, the last 8 the next characters (a causal language model's targets)."""
    ids = torch.tensor([ord(c) % 16 for c in _TEXT * 8])
    windows = ids.unfold(0, 9, 3)  # (N, 9)
    x, y = windows[:, :8].contiguous(), windows[:, 1:].contiguous()
    n = len(x)
    return DataSplits(
        train=TensorDataset(x[: n // 2], y[: n // 2]),
        val=TensorDataset(x[n // 2 : 3 * n // 4], y[n // 2 : 3 * n // 4]),
        test=TensorDataset(x[3 * n // 4 :], y[3 * n // 4 :]),
    )


def tiny_gpt() -> nn.Module:
    """A two-block, 16-wide character GPT (``esper_core.models.chars_gpt``)."""
    from esper_core.models.chars_gpt import CharGPT

    return CharGPT(vocab=16, context=8, width=16, depth=2, heads=2)


def gpt_deepen() -> RunConfig:
    """The tiny GPT with its ``blocks`` deepenable and nothing else: Tamiyo (the heuristic) can
    only insert blocks."""
    from esper_core.models.chars_gpt import next_char_loss

    return RunConfig(
        epochs=6,
        host=ModelSpec(build=tiny_gpt, deepen=("blocks",), input_dtype=torch.long, causal=True, batch_max=64),
        data=DataSpec(load=tiny_chars, batch_size=16, name="tiny-chars"),
        loss=next_char_loss,
        trainer=dataclasses.replace(_EAGER, val_batch_size=64),
    )


def gpt_deepen_scheduled() -> RunConfig:
    """``gpt_deepen`` with a stacked copy of the last block inserted after epoch 0 (policy
    ``scheduled``): the seed's lifecycle runs to a merge within the run's six epochs."""
    config = gpt_deepen()
    config.tamiyo = TamiyoConfig(
        policy="scheduled",
        schedule=(ScheduledGermination(epoch=0, slot="blocks+depth", blueprint="depth-stack"),),
    )
    return config


def gpt_stream_scheduled() -> RunConfig:
    """The tiny GPT whose width may double (``widen_stream``), doubled after epoch 1 (policy
    ``scheduled``): 16 -> 32 wide, 2 -> 4 heads, kept at once."""
    from esper_core.models.chars_gpt import next_char_loss

    return RunConfig(
        epochs=4,
        host=ModelSpec(build=tiny_gpt, widen_stream=True, input_dtype=torch.long, causal=True, batch_max=64),
        data=DataSpec(load=tiny_chars, batch_size=16, name="tiny-chars"),
        loss=next_char_loss,
        trainer=dataclasses.replace(_EAGER, val_batch_size=64),
        tamiyo=TamiyoConfig(
            policy="scheduled", schedule=(ScheduledGermination(epoch=1, slot="stream", blueprint="stream-2x"),)
        ),
    )
