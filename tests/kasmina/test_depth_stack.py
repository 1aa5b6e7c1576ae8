"""Which stacks a depth seed can deepen: found by a dry forward, refused with the reason."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from esper_core.kasmina.depth import find_depth_site
from esper_core.models.chars_gpt import CharGPT
from esper_core.run.config import ModelSpec


def _gpt() -> CharGPT:
    torch.manual_seed(0)
    return CharGPT(vocab=16, context=8, width=16, depth=2, heads=2)


class Stack(nn.Module):
    """``body`` run as a chain, or only its first block (``chain=False``)."""

    def __init__(self, body: nn.Module, *, chain: bool = True) -> None:
        super().__init__()
        self.body = body
        self.chain = chain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.chain:
            return self.body[0](x)
        for block in self.body:
            x = block(x)
        return x


def test_a_gpt_s_blocks_are_a_stack_and_finding_it_leaves_the_model_untouched() -> None:
    model = _gpt()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    site = find_depth_site(model, "blocks", (8,), torch.long)
    assert (site.stack, site.blocks, site.feature_shape, site.layer) == ("blocks", 2, (8, 16), "blocks.1.proj")
    # The dry forward appended a block for a moment and ran on meta tensors: all of it undone.
    assert len(model.blocks) == 2
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.device.type == "cpu" and isinstance(p, nn.Parameter) for p in model.parameters())


LONG, FLOAT = torch.long, torch.float32


@pytest.mark.parametrize(
    ("model", "name", "shape", "dtype", "why"),
    [
        (
            _gpt(),
            "trunk",
            (8,),
            LONG,
            r"no module named 'trunk' to deepen; its ModuleList/Sequential modules are \['blocks'\]",
        ),
        (_gpt(), "blocks.0", (8,), LONG, "'blocks.0' is a Block: a depth seed inserts a block into an nn.ModuleList"),
        (
            Stack(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4, bias=False))),
            "body",
            (4,),
            FLOAT,
            "block 1 .* is not like block 0 .* identical blocks",
        ),
        (
            Stack(nn.Sequential(nn.MaxPool1d(2), nn.MaxPool1d(2))),
            "body",
            (4, 16),
            FLOAT,
            r"maps \(2, 4, 16\) to \(2, 4, 8\)",
        ),
        (
            Stack(nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]), chain=False),
            "body",
            (4,),
            FLOAT,
            "do not run as a chain",
        ),
        (Stack(nn.ModuleList()), "body", (4,), FLOAT, "'body' is empty"),
    ],
)
def test_a_stack_a_block_cannot_be_inserted_into_is_refused_with_the_reason(
    model: nn.Module, name: str, shape: tuple[int, ...], dtype: torch.dtype, why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        find_depth_site(model, name, shape, dtype)


def test_a_model_spec_names_its_depth_slots_and_refuses_bad_deepen_lists() -> None:
    spec = ModelSpec(build=_gpt, deepen=("blocks",), input_dtype=torch.long)
    assert spec.slot_ids == ("blocks+depth",)
    assert ModelSpec(build=_gpt, slots=("ln_f",), widen=("blocks.0.fc",), deepen=("blocks",)).slot_ids == (
        "ln_f",
        "blocks.0.fc+width",
        "blocks+depth",
    )
    with pytest.raises(ValueError, match="write 'blocks'"):
        ModelSpec(build=_gpt, deepen=("blocks+depth",))
    with pytest.raises(ValueError, match="more than once: a stack has one depth slot"):
        ModelSpec(build=_gpt, deepen=("blocks", "blocks"))
    with pytest.raises(ValueError, match=r"string 'blocks': write \('blocks',\)"):
        ModelSpec(build=_gpt, deepen="blocks")
