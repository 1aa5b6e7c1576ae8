"""What a packet says about each host layer: kind, fans, parameters and FLOPs, read off shapes."""

from __future__ import annotations

import torch
from torch import nn

from esper_core.contracts.enums import LayerKind
from esper_core.kasmina.graft import weight_layers
from esper_core.tolaria.layers import LayerStats, layer_kind


class CausalSelfAttention(nn.Module):
    """A user's attention block with plain ``Linear`` projections (nanoGPT's spelling)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.c_attn(x).chunk(3, dim=-1)
        return self.c_proj(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


class Zoo(nn.Module):
    """One of every kind the vocabulary names, on a (B, L) token input."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.attn = CausalSelfAttention(8)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.conv = nn.Conv1d(8, 6, 3, padding=1)
        self.gru = nn.GRU(6, 5, batch_first=True)
        self.norm = nn.LayerNorm(5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attn(self.embed(x))  # (B, L, 8)
        h = self.mha(h, h, h, need_weights=False)[0]
        h = self.conv(h.transpose(1, 2)).transpose(1, 2)  # (B, L, 6)
        h = self.norm(self.gru(h)[0])  # (B, L, 5)
        return self.head(h[:, -1])  # (B, 3)


def test_kinds_come_from_module_types_and_the_blocks_around_them() -> None:
    model = Zoo()
    layers = weight_layers(model)
    stats = LayerStats(tuple(layers), list(layers.values()), root=model)
    assert dict(zip(stats.names, stats.kinds, strict=True)) == {
        "embed": LayerKind.EMBEDDING,
        "attn.c_attn": LayerKind.ATTENTION,
        "attn.c_proj": LayerKind.ATTENTION,
        "mha.out_proj": LayerKind.ATTENTION,
        "conv": LayerKind.CONV1D,
        "head": LayerKind.LINEAR,
    }
    assert layer_kind(nn.GRU(4, 4)) is LayerKind.RECURRENT
    assert layer_kind(nn.BatchNorm2d(4)) is LayerKind.NORM and layer_kind(nn.Conv2d(1, 2, 3)) is LayerKind.CONV2D
    assert layer_kind(nn.Conv3d(1, 2, 3)) is LayerKind.OTHER
    assert layer_kind(nn.Linear(2, 2), [nn.LSTM(2, 2)]) is LayerKind.RECURRENT
    # Only the block a layer sits in directly names it: a model's own class name does not.
    assert layer_kind(nn.Linear(2, 2), [CausalSelfAttention(2), nn.Sequential()]) is LayerKind.LINEAR
    encoder = nn.TransformerEncoderLayer(8, 2)
    assert layer_kind(encoder.linear1, [encoder]) is LayerKind.ATTENTION


def test_fans_parameters_and_flops_per_sample_are_counts_from_shapes() -> None:
    model = Zoo()
    layers = weight_layers(model)
    stats = LayerStats(tuple(layers), list(layers.values()), root=model)
    batch, length = 4, 7
    with stats.watch_activations(), torch.inference_mode():
        for _ in range(2):  # two validation batches: 8 samples
            model(torch.randint(0, 11, (batch, length)))
    widths = [int(m.get_parameter("weight").shape[0]) for m in layers.values()]
    states = {s.name: s for s in stats.export({}, widths, samples=2 * batch)}
    conv = states["conv"]
    assert (conv.fan_in, conv.fan_out, conv.params) == (8 * 3, 6 * 3, 6 * 8 * 3 + 6)
    assert conv.flops_per_sample == 2 * (8 * 3) * (6 * length)  # every position of the sequence
    head = states["head"]
    assert (head.fan_in, head.fan_out, head.flops_per_sample) == (5, 3, 2 * 5 * 3)
    assert states["attn.c_attn"].flops_per_sample == 2 * 8 * 24 * length
    # nn.MultiheadAttention applies out_proj's weight without calling it: its output is watched instead.
    assert states["mha.out_proj"].flops_per_sample == 2 * 8 * 8 * length
    assert states["mha.out_proj"].activation_std > 0
    assert states["embed"].flops_per_sample == 0 and states["embed"].params == 11 * 8
    # Another pass with no data seen: FLOPs unobserved, shapes still known.
    stats.reset()
    bare = stats.export({}, widths, samples=0)
    assert all(s.flops_per_sample is None and s.fan_in is not None for s in bare)
