"""Seed slots grafted onto a user's model by module name; shapes from a dry forward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from esper_core.contracts import SeedStage
from esper_core.kasmina.graft import GrowableModel, discover_slot_sites
from tests.helpers.user_model import TwoTower
from tests.helpers.user_models import DigitsCNN, RowLSTM, RowTransformer


class _Conv1dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool1d(5)
        self.fc = nn.Linear(20, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(torch.relu(self.conv(x))).flatten(1))


class _Odd(nn.Module):
    """Modules a seed cannot take."""

    def __init__(self) -> None:
        super().__init__()
        self.pair = _Pair()
        self.shared = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)
        self.flat = _BatchFold()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, _ = self.pair(x)
        a = self.shared(self.shared(a))
        self.flat(a)
        return self.fc(a)


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


class _BatchFold(nn.Module):
    """Keeps as many features as there are samples: the per-sample shape follows the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, : x.shape[0]]


def test_sites_take_the_output_shape_and_the_owning_weight_layer() -> None:
    sites = discover_slot_sites(TwoTower(), ["stem", "body.1", "body"], (12,))
    assert [(s.module, s.feature_shape, s.layer) for s in sites] == [
        ("stem", (16,), "stem"),
        ("body.1", (16,), "body.1"),
        ("body", (16,), "body.1"),  # a container's output belongs to its last weight layer
    ]
    conv = discover_slot_sites(_Conv1dNet(), ["conv", "pool"], (1, 10))
    assert [(s.feature_shape, s.layer) for s in conv] == [((4, 10), "conv"), ((4, 5), "conv")]


def test_the_dry_forward_reads_no_weights() -> None:
    model = TwoTower()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.device("meta"):
        meta = TwoTower()
    assert discover_slot_sites(meta, ["stem"], (12,))[0].feature_shape == (16,)
    discover_slot_sites(model, ["stem"], (12,))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("stemm", "has no module named ['stemm']; seed slots take a module's dotted name"),
        ("", "has no module named"),
    ],
)
def test_an_unknown_name_lists_the_names_that_exist(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"has no module named") as e:
        discover_slot_sites(TwoTower(), [name], (12,))
    assert message in str(e.value) and "stem, body, body.0, body.1, body.2, head" in str(e.value)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("pair", r"returns a tuple \(Tensor, Tensor\), not a tensor: name one element, e.g. slots=\('pair\[0\]',\)"),
        ("pair[2]", r"returns 2 elements; name one of \['pair\[0\]', 'pair\[1\]'\]"),
        ("fc[0]", "takes element 0 of a tuple, but module 'fc' returns Tensor: name it 'fc'"),
        ("shared", "runs 2 times in one forward"),
        ("unused", "is never called"),
        ("flat", "per-sample output shape changes with the input"),
    ],
)
def test_a_module_whose_output_a_seed_cannot_take_is_refused_with_the_reason(name: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        discover_slot_sites(_Odd(), [name], (4,))


def test_names_given_twice_are_refused() -> None:
    with pytest.raises(ValueError, match="named twice"):
        discover_slot_sites(TwoTower(), ["stem", "stem"], (12,))


def test_a_grown_model_is_the_user_model_until_a_seed_blends() -> None:
    torch.manual_seed(0)
    user = TwoTower()
    x = torch.randn(5, 12)
    expected = user(x)
    grown = GrowableModel(user, slots=("stem", "body.1"), sample_shape=(12,), batch_max=64)
    assert torch.equal(grown(x), expected)
    assert list(grown.slots()) == ["stem", "body.1"]
    assert [s.profile.name for s in grown.slots().values()] == ["f16-b64", "f16-b64"]
    assert grown.layer_names == ("stem", "body.1", "head") and grown.layer_widths == (16, 16, 3)
    assert {id(p) for p in grown.host_parameters()} == {id(p) for p in user.parameters()}
    # A blended seed changes the named module's output, downstream of it only.
    slot = grown.slots()["body.1"]
    slot.seed = nn.Linear(16, 16)
    slot.stage = SeedStage.BLENDING
    slot.alpha = 1.0
    assert not torch.allclose(grown(x), expected)
    assert set(grown.state_dict()) >= {"model.stem.weight", "seed_slots.body-1.seed.weight"}


def test_a_slot_hooks_its_module_only_while_it_holds_a_seed_and_in_its_registration_place() -> None:
    torch.manual_seed(0)
    user = TwoTower()
    body = user.body[1]
    seen: list[str] = []
    body.register_forward_hook(lambda _m, _a, out: seen.append("before"))
    grown = GrowableModel(user, slots=("stem", "body.1"), sample_shape=(12,), batch_max=64)
    body.register_forward_hook(lambda _m, _a, out: seen.append(f"after, seed added {out.abs().sum() > 1e3}"))
    x = torch.randn(5, 12)
    # Dormant slots leave the user's modules without Esper's hooks: PyTorch's fast call path.
    assert not user.stem._forward_hooks and len(body._forward_hooks) == 2
    plain = grown(x)
    slot = grown.slots()["body.1"]
    for _ in range(2):
        slot.seed = _Big()
        slot.stage = SeedStage.BLENDING
        slot.alpha = 1.0
        seen.clear()
        grown(x)
        # Back between the hook registered before the graft and the one registered after it.
        assert seen == ["before", "after, seed added True"] and len(body._forward_hooks) == 3
        hooks = list(body._forward_hooks)
        assert hooks == sorted(hooks)
        slot.seed = None
        assert len(body._forward_hooks) == 2 and torch.equal(grown(x), plain)
    # A plain copy leaves out the slot's hook while it is in place (a seed still in training).
    slot.seed = _Big()
    slot.stage = SeedStage.TRAINING
    assert len(body._forward_hooks) == 3
    assert len(grown.plain_copy().body[1]._forward_hooks) == 2


class _Big(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, 1e4)


def test_token_slots_are_told_from_channel_first_sequences_by_the_layer_before_them() -> None:
    sites = discover_slot_sites(RowTransformer(), ["embed", "encoder.layers.0", "encoder.layers.1"], (8, 8))
    assert [(s.feature_shape, s.tokens) for s in sites] == [((8, 32), True)] * 3
    conv = discover_slot_sites(_Conv1dNet(), ["conv", "pool"], (1, 10))
    assert [(s.feature_shape, s.tokens) for s in conv] == [((4, 10), False), ((4, 5), False)]
    # Rank 3 is a (C, H, W) map whatever came before.
    assert not any(s.tokens for s in discover_slot_sites(DigitsCNN(), ["features.2", "features.5"], (1, 8, 8)))


def test_a_slot_on_one_element_of_a_tuple_output_grows_on_it_and_passes_the_rest() -> None:
    torch.manual_seed(0)
    user = RowLSTM()
    (site,) = discover_slot_sites(user, ["lstm[0]"], (8, 8))
    # An LSTM has no `weight` matrix: the slot belongs to the first weight layer after it.
    assert (site.module, site.feature_shape, site.tokens, site.layer) == ("lstm[0]", (8, 32), True, "head")
    grown = GrowableModel(user, slots=("lstm[0]",), sample_shape=(8, 8), batch_max=16, causal=True)
    slot = grown.slots()["lstm[0]"]
    assert slot.profile.name == "f8x32-b16-causal"
    x = torch.randn(4, 8, 8)
    before = grown(x)
    out, (h, _) = user.lstm(x)  # dormant: the LSTM's own output
    slot.seed = _Ones()
    slot.stage, slot.alpha = SeedStage.BLENDING, 1.0
    grown_out, (grown_h, _) = user.lstm(x)
    assert torch.equal(grown_out, out + 1.0)
    assert torch.equal(grown_h, h)  # the (h, c) element passes through untouched
    assert torch.allclose(grown(x), user.head(out[:, -1] + 1.0))
    assert not torch.allclose(grown(x), before)


class _Ones(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(x)


def test_a_model_whose_forward_fails_on_the_probe_says_what_it_got() -> None:
    embed = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4))
    with pytest.raises(
        ValueError, match=r"forward failed on a \(2, 6\) torch.float32 input .*ModelSpec\(input_dtype=torch.long\)"
    ):
        discover_slot_sites(embed, ["1"], (6,))
    (site,) = discover_slot_sites(embed, ["1"], (6,), input_dtype=torch.long)
    assert site.feature_shape == (6, 4) and site.tokens


class _AttentionBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.attn(x, x, x)
        return self.head(h.mean(dim=1))


def test_a_slot_takes_multihead_attentions_output_not_its_weights() -> None:
    (site,) = discover_slot_sites(_AttentionBlock(), ["attn[0]"], (5, 8))
    assert (site.feature_shape, site.tokens) == ((5, 8), True)
    with pytest.raises(ValueError, match=r"name one element, e.g. slots=\('attn\[0\]',\)"):
        discover_slot_sites(_AttentionBlock(), ["attn"], (5, 8))
