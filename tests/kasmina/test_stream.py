"""Doubling a transformer's stream: the function kept, the wider model's exact shape, the optimizer's
state grown with it, and everything it cannot follow refused with the model left as it was."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from esper_core.kasmina.stream import plan_stream, widen_stream
from esper_core.models.chars_gpt import CharGPT, next_char_loss
from esper_core.zoo.models import ZooEncoder
from tests.helpers.user_gpt import GPT, VOCAB


def _trained_gpt() -> tuple[CharGPT, torch.Tensor, torch.optim.Adam]:
    """A CharGPT a few Adam steps into training (so its moments and weights are not the init's)."""
    torch.manual_seed(0)
    model = CharGPT(vocab=24, context=12, width=16, depth=2, heads=2)
    x = torch.randint(0, 24, (8, 12))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        next_char_loss(model(x), x).backward()
        opt.step()
    return model, x, opt


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_a_widened_char_gpt_is_the_wider_gpt_computing_the_same() -> None:
    model, x, opt = _trained_gpt()
    before = model(x).detach()
    report = widen_stream(model, x, optimizer=opt, generator=torch.Generator().manual_seed(0))
    wider = CharGPT(vocab=24, context=12, width=32, depth=2, heads=4)
    assert _shapes(model) == _shapes(wider)
    assert [b.attn.heads for b in model.blocks] == [4, 4]
    assert (report.width_before, report.width_after) == (16, 32)
    assert report.params_after == sum(p.numel() for p in wider.parameters())
    torch.testing.assert_close(model(x), before, rtol=0, atol=1e-5)
    assert report.max_change < 1e-5


def test_the_optimizer_state_grows_with_the_parameters_and_training_goes_on() -> None:
    model, x, opt = _trained_gpt()
    ids = [id(p) for p in model.parameters()]
    steps = {id(p): float(opt.state[p]["step"]) for p in model.parameters()}
    moment = opt.state[model.blocks[0].fc.weight]["exp_avg"].clone()  # (4D, D)
    next_char_loss(model(x), x).backward()  # gradients of the old shapes, left behind
    widen_stream(model, x, optimizer=opt, generator=torch.Generator().manual_seed(0))
    assert all(p.grad is None or p.grad.shape == p.shape for p in model.parameters())
    assert model.token.weight.grad is None
    assert [id(p) for p in model.parameters()] == ids  # the optimizer's groups still hold them
    for p in model.parameters():
        state = opt.state[p]
        assert state["exp_avg"].shape == p.shape == state["exp_avg_sq"].shape
        assert float(state["step"]) == steps[id(p)]
    grown = opt.state[model.blocks[0].fc.weight]["exp_avg"]
    # Each copy keeps the moments of the unit it copies (rows twice, columns twice).
    torch.testing.assert_close(grown, moment.repeat(2, 2))
    loss = next_char_loss(model(x), x)
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert float(next_char_loss(model(x), x).detach()) < float(loss.detach())


def test_the_copies_part_as_they_train() -> None:
    model, x, opt = _trained_gpt()
    widen_stream(model, x, optimizer=opt, generator=torch.Generator().manual_seed(0))
    token = model.token.weight.detach()
    torch.testing.assert_close(token[:, :16], token[:, 16:])  # twins at first
    for _ in range(3):
        opt.zero_grad()
        next_char_loss(model(x), x).backward()
        opt.step()
    token = model.token.weight.detach()
    assert float((token[:, :16] - token[:, 16:]).abs().max()) > 1e-3


def test_the_same_generator_widens_the_same_way() -> None:
    a, x, _ = _trained_gpt()
    b = copy.deepcopy(a)
    widen_stream(a, x, generator=torch.Generator().manual_seed(7))
    widen_stream(b, x, generator=torch.Generator().manual_seed(7))
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_a_nanogpt_style_model_with_a_tied_head() -> None:
    torch.manual_seed(0)
    model = GPT(n_embd=16, n_layer=2, n_head=2)
    model.lm_head.weight = model.transformer.wte.weight  # nanoGPT's weight tying
    x = torch.randint(0, VOCAB, (4, 12))
    before = model(x).detach()
    widen_stream(model, x, generator=torch.Generator().manual_seed(0))
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.lm_head.in_features == 32 and model.transformer.h[0].attn.n_head == 4
    torch.testing.assert_close(model(x), before, rtol=0, atol=1e-5)


def test_torch_transformer_encoder_layers_and_a_free_position_table() -> None:
    torch.manual_seed(0)
    model = _Encoder(16).eval()  # its layers' dropout off, to compare outputs
    x = torch.randint(0, 4, (8, 16))
    before = model(x).detach()
    plan = plan_stream(model)
    assert plan.names("free") == ["position"] and len(plan.names("mha")) == 2
    widen_stream(model, x, generator=torch.Generator().manual_seed(0))
    attn = model.encoder.layers[0].self_attn
    assert (attn.embed_dim, attn.num_heads, attn.head_dim) == (32, 8, 4)
    assert model.position.shape == (1, 16, 32)
    torch.testing.assert_close(model(x), before, rtol=0, atol=1e-5)
    model.train()
    F.cross_entropy(model(x), torch.zeros(8, dtype=torch.long)).backward()  # trains at the new width


class _Encoder(nn.Module):
    """PyTorch's own encoder layers with a learned position table of the user's (a free parameter)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(4, width)
        self.position = nn.Parameter(torch.randn(1, 16, width))
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=2 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x) + self.position).mean(dim=1))


class _HiddenWidth(nn.Module):
    """Attention that splits q, k and v by a width kept under a name the plan does not know."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.heads = 2
        self.size = width
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(self.size, dim=-1)
        return q * k.sigmoid() + v


class _Model(nn.Module):
    def __init__(self, inner: nn.Module, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, width)
        self.inner = inner
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return self.head(h + self.inner(h))


def test_what_the_forward_hides_is_refused_and_the_model_and_optimizer_are_left_as_they_were() -> None:
    torch.manual_seed(0)
    model = _Model(_HiddenWidth(8))
    x = torch.randint(0, 10, (4, 5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    opt.step()
    state = copy.deepcopy(model.state_dict())
    moments = {k: v.clone() for k, v in opt.state[model.inner.qkv.weight].items()}
    before = model(x).detach()
    with pytest.raises(ValueError, match="uses the width in a way the plan cannot follow"):
        widen_stream(model, x, optimizer=opt)
    assert _shapes(model) == {k: tuple(v.shape) for k, v in state.items()}
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    for k, v in opt.state[model.inner.qkv.weight].items():
        assert torch.equal(v, moments[k]), k
    assert (model.inner.qkv.in_features, model.embed.embedding_dim, model.inner.heads) == (8, 8, 2)
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)


def test_a_convolution_as_wide_as_the_stream_is_refused_by_name() -> None:
    model = _Model(nn.Conv1d(8, 8, 1))
    with pytest.raises(ValueError, match=r"'inner' is a convolution with 8 channels"):
        plan_stream(model)


def test_a_stream_sized_matrix_outside_a_linear_is_refused_by_name() -> None:
    inner = nn.Module()
    inner.mix = nn.Parameter(torch.zeros(8, 8))
    with pytest.raises(ValueError, match=r"'inner.mix' \(Module, shape \(8, 8\)\)"):
        plan_stream(_Model(inner))


def test_a_tied_head_that_reads_no_layernorm_is_refused() -> None:
    torch.manual_seed(0)
    model = _Model(nn.Identity())
    model.head.weight = model.embed.weight
    x = torch.randint(0, 10, (2, 3))
    with pytest.raises(ValueError, match="untie the head or put a LayerNorm right before it"):
        widen_stream(model, x)
    assert model.embed.weight.shape == (10, 8)


def test_the_width_must_be_known_and_the_noise_keep_the_shares_apart() -> None:
    with pytest.raises(ValueError, match="found no embedding and no LayerNorm or RMSNorm"):
        plan_stream(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(ValueError, match=r"found no embedding and norms over \[\(4,\), \(8,\)\]"):
        plan_stream(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 8), nn.LayerNorm(8)))
    model, x, _ = _trained_gpt()
    for noise in (0.0, 0.6):
        with pytest.raises(ValueError, match=r"noise must lie in \(0, 0.5\]"):
            widen_stream(model, x, noise=noise)


def test_a_bfloat16_model_doubles_within_its_own_rounding_and_a_real_change_is_still_caught() -> None:
    model, x, _ = _trained_gpt()
    model = model.to(torch.bfloat16)
    floor = float((copy.deepcopy(model).float()(x) - model(x).float()).abs().max())
    before = model(x).detach().float()
    report = widen_stream(model, x, generator=torch.Generator().manual_seed(0))
    assert model.token.weight.dtype == torch.bfloat16 and report.width_after == 32
    assert report.max_change <= 4 * floor + 1e-4 * (float(before.abs().max()) + 1)
    torch.manual_seed(0)
    hidden = _Model(_HiddenWidth(8)).to(torch.bfloat16)
    with pytest.raises(ValueError, match="in a way the plan cannot follow"):
        widen_stream(hidden, torch.randint(0, 10, (4, 5)))


class _Transposed(nn.Module):
    """RMSNorm, nn.MultiheadAttention (sequence first, no biases) and a tied head, whose logits are
    returned transposed: no Linear's own output is the model's."""

    def __init__(self, width: int = 8, vocab: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm = nn.RMSNorm(width)
        self.attn = nn.MultiheadAttention(width, 2, bias=False)
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.final = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).transpose(0, 1)  # (L, B, D)
        a = self.norm(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.down(F.silu(self.up(h)))
        return self.head(self.final(h)).transpose(0, 1)


def test_the_output_layer_is_found_the_same_way_every_time() -> None:
    from esper_core.kasmina.stream import output_layer

    # Freed outputs' ids are reused by later tensors: a lookup by id alone named an inner layer
    # about once in ten calls here.
    assert {output_layer(_Transposed(), (6,), torch.long) for _ in range(100)} == {""}
    assert {output_layer(GPT(n_embd=16), (12,), torch.long) for _ in range(20)} == {"lm_head"}


def test_a_doubling_is_undone_with_its_own_plan_whatever_sizes_coincide_at_the_wider_width() -> None:
    from esper_core.kasmina.stream import resize_stream

    class Table(nn.Module):
        """A learned position table 16 long on an 8-wide stream: square once the stream is 16."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 8)
            self.position = nn.Parameter(torch.randn(16, 8))
            self.head = nn.Linear(8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(x) + self.position[: x.shape[1]])

    torch.manual_seed(0)
    model = Table()
    shapes = _shapes(model)
    x = torch.randint(0, 10, (2, 5))
    plans = {8: plan_stream(model, output="head")}
    report = widen_stream(model, x, generator=torch.Generator().manual_seed(0))
    plans[8] = report.plan
    with pytest.raises(ValueError, match=r"'position' \(Table, shape \(16, 16\)\)"):
        plan_stream(model, output="head")  # what a plan read off the wide model would refuse
    resize_stream(model, 8, current=16, plans=plans, output="head")
    assert _shapes(model) == shapes
    resize_stream(model, 16, current=8, plans=plans, output="head")
    assert model.position.shape == (16, 16)
    with pytest.raises(ValueError, match="no doubling from 16 was planned"):
        resize_stream(model, 8, current=32, plans=plans)


def test_nanogpts_own_layernorm_before_a_tied_head_is_halved() -> None:
    class LayerNorm(nn.Module):
        """nanoGPT's: a LayerNorm with an optional bias, written with F.layer_norm."""

        def __init__(self, ndim: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(ndim))
            self.bias = nn.Parameter(torch.zeros(ndim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)

    torch.manual_seed(0)
    model = GPT(n_embd=16, n_layer=2, n_head=2)
    model.transformer.ln_f = LayerNorm(16)
    nn.init.normal_(model.transformer.ln_f.weight)
    model.lm_head.weight = model.transformer.wte.weight
    x = torch.randint(0, VOCAB, (4, 12))
    before = model(x).detach()
    widen_stream(model, x, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model(x), before, rtol=0, atol=1e-5)


def test_buffers_as_wide_as_the_stream_are_refused_with_the_fix() -> None:
    model = _Model(nn.Identity())
    model.register_buffer("table", torch.zeros(5, 8))
    with pytest.raises(ValueError, match=r"buffer 'table'.*nn.Parameter\(\.\.\., requires_grad=False\)"):
        plan_stream(model)


def test_an_encoder_over_features_doubles_with_its_width_read_off_its_norms() -> None:
    # No nn.Embedding: the input enters through a Linear (features -> D), the width is the norms',
    # and the block holds attention and MLP as direct children (the MLP still pairs, the fused
    # q/k/v does not).
    torch.manual_seed(0)
    model = ZooEncoder(width=8, depth=2, tokens=10, token_features=4, num_classes=3)
    plan = plan_stream(model, output="head")
    roles = {p.name: p.role for p in plan.parts}
    assert plan.width == 8 and roles["embed"] == "writer" and roles["blocks.0.qkv"] == "fused"
    assert roles["blocks.0.fc"] == roles["blocks.0.proj"] == "through" and roles["position"] == "free"
    x = torch.randn(5, 40)
    before = model(x).detach()
    report = widen_stream(model, x, generator=torch.Generator().manual_seed(0))
    assert report.width_after == 16 and model.blocks[0].heads == 4
    torch.testing.assert_close(model(x), before, rtol=0, atol=1e-5)


def test_an_input_projection_as_wide_as_the_stream_is_refused_before_anything_changes() -> None:
    # Linear(D, D) on the input looks like a projection inside the stream: refused by name at
    # planning, where the doubled model would only fail in its forward.
    model = ZooEncoder(width=8, depth=1, tokens=8, token_features=8, num_classes=3)
    with pytest.raises(ValueError, match="make the input's feature count differ from the model's width"):
        plan_stream(model, output="head")


def test_a_block_whose_mlp_is_as_wide_as_its_fused_projection_is_refused_by_name() -> None:
    # q/k/v (D -> 3D) and an MLP of 3D in one module: proj (3D -> D) could read either.
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = 2
            self.qkv, self.out = nn.Linear(8, 24), nn.Linear(8, 8)
            self.fc, self.proj = nn.Linear(8, 24), nn.Linear(24, 8)

    model = nn.Sequential(nn.Embedding(10, 8), Block(), nn.LayerNorm(8), nn.Linear(8, 10))
    with pytest.raises(ValueError, match=r"'1' holds attention and \['1.qkv', '1.fc'\].*give the MLP a module"):
        plan_stream(model, output="3")
