"""A zoo member as an ordinary Esper recipe: a ``RunConfig`` with a ``ModelSpec`` and a ``DataSpec``.

Nothing here is special to the zoo once the configuration exists: the model is a user's model
(``ModelSpec.build``), its growth sites are named as a user names them (``widen`` for width slots,
``slots`` for branch slots), the data is a user's data (``DataSpec.load``), so planning, preflight
and the run check and train it exactly as they would a recipe from outside the project.

Which layers each family offers (each kind where the zoo's ``kinds`` name it):

==========  ==========================  ==========================  ====================================
family      width slots (``widen``)     branch slots (``slots``)    why not more
==========  ==========================  ==========================  ====================================
mlp         ``fc1 .. fc{depth}``        ``act1 .. act{depth}``      ``out`` is the output layer
cnn1d       ``conv1 .. conv{depth}``    ``act1 .. act{depth}``      ``fc`` is the output layer
cnn2d       ``conv1 .. conv{depth}``    ``act1 .. act{depth}``      (BatchNorm grows with its conv)
resnet      ``blocks.{i}.conv1``        ``blocks.{i}``              ``stem``/``conv2`` feed a residual add
encoder     ``blocks.{i}.fc``           ``blocks.{i}``              attention and ``proj`` feed the stream
decoder     ``blocks.{i}.fc``           ``blocks.{i}``              (causal: seeds never read ahead)
gru         ``fc`` (the head)           ``act``                     a GRU is not a Linear/Conv layer
==========  ==========================  ==========================  ====================================

The families built of identical blocks (resnet, encoder, decoder) also offer their stack
``blocks`` to depth seeds (``deepen``); the transformers (encoder, decoder) also offer their
whole width to a stream seed (``widen_stream``), which Kasmina allows with depth seeds alone,
except an encoder whose token features equal its width (``stream_followable``). A convolutional
stream is not followed, so the resnet's width stays per layer.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from esper_core.data import DataSpec
from esper_core.datasets.chars import VOCAB_SIZE
from esper_core.models.chars_gpt import next_char_loss
from esper_core.run.config import ModelSpec, RunConfig
from esper_core.tamiyo.config import TamiyoConfig
from esper_core.tamiyo.heuristic import HeuristicConfig
from esper_core.tolaria.config import TrainerConfig
from esper_core.zoo.models import MNIST1DMLP, CharGPT, ZooCNN1d, ZooCNN2d, ZooEncoder, ZooGRU, ZooResNet
from esper_core.zoo.tasks import CHARS_CONTEXT, SYNTHETIC_FEATURES

if TYPE_CHECKING:
    from esper_core.zoo.spec import ZooMember

HEADS = 2
"""Attention heads of the transformer families (their width is rounded up to a multiple)."""
IMAGE_FAMILIES = ("cnn2d", "resnet")
"""Families that read the digits as (1, 8, 8) images rather than 64 numbers."""

# Per task, how a sequence family cuts one sample into (tokens or steps, features each).
_SEQUENCE = {"mnist1d": (10, 4), "digits": (8, 8)}
_FEATURES = {"mnist1d": 40, "digits": 64, "gaussians": SYNTHETIC_FEATURES, "teacher": SYNTHETIC_FEATURES}


def width_layers(member: ZooMember) -> tuple[str, ...]:
    """The layers of ``member``'s model that Esper's width kind can widen (see the table above)."""
    if member.family == "mlp":
        return tuple(f"fc{i}" for i in range(1, member.depth + 1))
    if member.family in ("cnn1d", "cnn2d"):
        return tuple(f"conv{i}" for i in range(1, member.depth + 1))
    if member.family == "resnet":
        return tuple(f"blocks.{i}.conv1" for i in range(member.depth))
    if member.family in ("encoder", "decoder"):
        return tuple(f"blocks.{i}.fc" for i in range(member.depth))
    return ("fc",)


def branch_slots(member: ZooMember) -> tuple[str, ...]:
    """The modules of ``member``'s model whose outputs a branch seed may grow on."""
    if member.family in ("mlp", "cnn1d", "cnn2d"):
        return tuple(f"act{i}" for i in range(1, member.depth + 1))
    if member.family in ("resnet", "encoder", "decoder"):
        return tuple(f"blocks.{i}" for i in range(member.depth))
    return ("act",)


def stream_followable(member: ZooMember) -> bool:
    """Whether a stream seed can double ``member``'s transformer: its input must enter through a
    Linear from another width (``plan_stream`` cannot tell a ``Linear(D, D)`` on the input from a
    projection inside the stream), so an encoder whose token features equal its width is not."""
    if member.family == "decoder":
        return True
    if member.family != "encoder":
        return False
    return _SEQUENCE[member.task.name][1] != _model_width(member.width)


def _model_width(width: int) -> int:
    """A transformer's width: ``width`` rounded up to a multiple of its ``HEADS``."""
    return -(-width // HEADS) * HEADS


def build_model(member: ZooMember, factor: float = 1.0) -> nn.Module:
    """``member``'s model with its width multiplied by ``factor`` (``ModelSpec.build_scaled``).

    Raises:
        ValueError: ``factor`` <= 0.
    """
    if factor <= 0:
        raise ValueError(f"a width factor must be > 0, got {factor}")
    width = max(2, round(member.width * factor))
    task, depth, classes = member.task.name, member.depth, member.task.num_classes
    if member.family == "mlp":
        return MNIST1DMLP(width=width, depth=depth, in_features=_FEATURES[task], num_classes=classes)
    if member.family == "cnn1d":
        return ZooCNN1d(channels=width, depth=depth, in_length=_FEATURES[task], num_classes=classes)
    if member.family == "cnn2d":
        return ZooCNN2d(channels=width, depth=depth, image=8, num_classes=classes)
    if member.family == "resnet":
        return ZooResNet(channels=width, depth=depth, num_classes=classes)
    model_width = _model_width(width)
    if member.family == "decoder":
        return CharGPT(vocab=VOCAB_SIZE, context=CHARS_CONTEXT, width=model_width, depth=depth, heads=HEADS)
    tokens, features = _SEQUENCE[task]
    if member.family == "encoder":
        return ZooEncoder(
            width=model_width, depth=depth, tokens=tokens, token_features=features, num_classes=classes, heads=HEADS
        )
    return ZooGRU(hidden=width, depth=depth, steps=tokens, step_features=features, num_classes=classes)


def member_recipe(member: ZooMember) -> RunConfig:
    """The complete ``RunConfig`` of a run on ``member`` (seed 0, the heuristic deciding).

    Adam at the member's learning rate with cosine decay, validation in batches of 512, and the
    heuristic's defaults with a one-epoch blend, for a run of a few epochs (the first seed after
    epoch 0). Give
    it to ``esper_core.studies.episodes.episode_config`` to set a seed and a policy.
    """
    decoder = member.family == "decoder"
    host = ModelSpec(
        build=functools.partial(build_model, member, 1.0),
        build_scaled=functools.partial(build_model, member),
        widen=member.widen,
        slots=member.slots,
        deepen=member.deepen,
        widen_stream=member.widen_stream,
        input_dtype=torch.long if decoder else torch.float32,
        causal=decoder,
    )
    data = DataSpec(
        load=functools.partial(member.task.load, image=member.family in IMAGE_FAMILIES),
        batch_size=member.batch_size,
        name=f"zoo-{member.task.label}-s{member.task.seed}",
    )
    return RunConfig(
        recipe=member.name,
        epochs=member.epochs,
        host=host,
        data=data,
        loss=next_char_loss if decoder else F.cross_entropy,
        trainer=TrainerConfig(optimizer="adam", lr=member.lr, lr_schedule="cosine", val_batch_size=512),
        tamiyo=TamiyoConfig(heuristic=HeuristicConfig(blend_epochs=1)),
    )
