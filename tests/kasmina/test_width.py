"""Width seeds: tracing a layer's consumer, function preservation, the three inits, the merge."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from esper_core.contracts import SeedStage
from esper_core.kasmina.width import (
    WidthSeed,
    WidthSlot,
    graft_width_slot,
    init_width_seed_,
    merge_width_seed,
    resize_width,
    trace_width_site,
    width_batches,
)
from esper_core.models.chars_gpt import CharGPT
from esper_core.models.mnist1d import MNIST1DCNN, MNIST1DMLP
from tests.helpers.runif import requires_cuda
from tests.helpers.user_gpt import GPT


class BNConvNet(nn.Module):
    """A 2-D CNN the way people write one: Sequential, BatchNorm, pooling, nested names."""

    def __init__(self, channels: int = 6) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 8, 3, padding=1),
            nn.GroupNorm(4, 8),
            nn.GELU(),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(8 * 4 * 4, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc1(x))
        return self.out(h + self.fc2(h))


class Concat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.out = nn.Linear(4, 3), nn.Linear(4, 3), nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.cat([self.a(x), self.b(x)], dim=1))


class NormedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(5, 7), nn.LayerNorm(7), nn.Linear(7, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(self.fc1(x)))


def test_the_trace_finds_each_consumer_and_the_ops_in_between() -> None:
    cnn = MNIST1DCNN(channels=8)
    site = trace_width_site(cnn, "conv3", (40,))
    assert (site.consumer, [s.kind for s in site.steps], site.positions, site.width) == (
        "fc",
        ["elementwise", "flatten"],
        5,
        8,
    )
    assert trace_width_site(cnn, "conv1", (40,)).consumer == "conv2"
    net = BNConvNet()
    site = trace_width_site(net, "features.0", (1, 8, 8))
    assert site.consumer == "features.4"
    assert [s.kind for s in site.steps] == ["batch_norm", "elementwise", "pool"]
    site = trace_width_site(net, "features.4", (1, 8, 8))
    assert (site.consumer, site.positions) == ("head.2", 16)
    assert [s.kind for s in site.steps] == ["group_norm", "elementwise", "flatten", "dropout"]


@pytest.mark.parametrize(
    ("model", "layer", "shape", "reason"),
    [
        (Residual(), "fc1", (6,), "is read twice"),
        (Residual(), "fc2", (6,), "together with another tensor"),
        (Concat(), "a", (4,), "together with another tensor"),
        (NormedMLP(), "fc1", (5,), "normalises across its units"),
        (MNIST1DCNN(channels=4), "fc", (40,), "output layer"),
        (MNIST1DCNN(channels=4), "act1", (40,), "is a ReLU"),
        (MNIST1DCNN(channels=4), "conv9", (40,), "widenable layers are ['conv1', 'conv2', 'conv3', 'fc']"),
    ],
)
def test_what_cannot_take_new_units_is_refused_with_the_reason(
    model: nn.Module, layer: str, shape: tuple[int, ...], reason: str
) -> None:
    with pytest.raises(ValueError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        trace_width_site(model, layer, shape)


@pytest.mark.parametrize(
    ("model", "layer", "reason"),
    [
        # A fused q/k/v projection: split in three, each third read apart, none the model's output.
        (GPT(), "transformer.h.0.attn.c_attn", "is split into parts by split in 'transformer.h.0.attn'"),
        (CharGPT(width=8, heads=2, depth=1), "blocks.0.attn.qkv", "is split into parts by split in 'blocks.0.attn'"),
        (GPT(), "lm_head", "reaches the model's output"),
    ],
)
def test_a_language_models_layers_are_refused_with_the_right_reason(model: nn.Module, layer: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as refused:
        trace_width_site(model, layer, (6,), torch.long)
    assert "output layer" not in str(refused.value) or layer == "lm_head"
    # The FFN's first layer is the one to widen (its output is read whole by the second).
    assert (
        trace_width_site(GPT(), "transformer.h.0.mlp.c_fc", (6,), torch.long).consumer == "transformer.h.0.mlp.c_proj"
    )


def _grown(model: nn.Module, layer: str, shape: tuple[int, ...], units: int) -> tuple[WidthSlot, WidthSeed]:
    site = trace_width_site(model, layer, shape)
    slot = WidthSlot(site=site, batch_max=64)
    graft_width_slot(model, slot)
    seed = WidthSeed(site, model, units=units)
    slot.seed = seed
    return slot, seed


CASES = [
    (lambda: MNIST1DCNN(channels=4), "conv2", (40,), 3),
    (lambda: MNIST1DCNN(channels=4), "conv3", (40,), 2),
    (lambda: MNIST1DMLP(width=6), "fc1", (40,), 4),
    (lambda: BNConvNet(), "features.0", (1, 8, 8), 2),
    (lambda: BNConvNet(), "features.4", (1, 8, 8), 4),
]


@pytest.mark.parametrize(("build", "layer", "shape", "units"), CASES)
def test_a_blended_seed_merges_into_the_same_function(build, layer, shape, units) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    model = build()
    clean = copy.deepcopy(model)  # no hooks: the merge folds the seed into this one
    x = torch.randn(16, *shape)
    slot, seed = _grown(model, layer, shape, units)
    nn.init.normal_(seed.fan_out, std=0.3)  # a seed that has learned something
    slot.stage, slot.alpha = SeedStage.BLENDING, 1.0
    model.eval(), clean.eval(), slot.eval()  # the slot is not registered under this bare model
    merge_width_seed(clean, seed)
    torch.testing.assert_close(clean(x), model(x), rtol=1e-5, atol=1e-5)
    if not any(isinstance(m, nn.Dropout) for m in model.modules()):
        model.train(), clean.train(), slot.train()  # batch statistics of the new channels, too
        torch.testing.assert_close(clean(x), model(x), rtol=1e-5, atol=1e-5)
    width = dict(clean.named_modules())[layer]
    assert (width.out_features if isinstance(width, nn.Linear) else width.out_channels) == seed.site.width + units


@pytest.mark.parametrize("init", ["random", "gradmax", "tiny"])
def test_germination_and_isolation_leave_the_host_function_and_gradients_bit_identical(init: str) -> None:
    torch.manual_seed(0)
    model = MNIST1DCNN(channels=4)
    reference = copy.deepcopy(model)
    x, y = torch.randn(32, 40), torch.randint(0, 10, (32,))
    slot, seed = _grown(model, "conv3", (40,), 3)
    init_width_seed_(seed, init, width_batches(model, seed.site, [(x, y)], F.cross_entropy))
    for stage in (SeedStage.GERMINATED, SeedStage.TRAINING):
        slot.stage = stage
        out = model(x)
        assert torch.equal(out, reference(x))
        F.cross_entropy(out, y).backward()
        F.cross_entropy(reference(x), y).backward()
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad)
        model.zero_grad(), reference.zero_grad()
    if init in ("random", "gradmax"):
        # Function preserved by a zero factor: at alpha 1 the seed still adds nothing.
        slot.stage, slot.alpha = SeedStage.BLENDING, 1.0
        assert torch.equal(model(x), reference(x))


def test_gradmax_units_learn_through_relu_and_aim_along_the_gradient() -> None:
    torch.manual_seed(0)
    model = MNIST1DMLP(width=6)
    x, y = torch.randn(64, 40), torch.randint(0, 10, (64,))
    slot, seed = _grown(model, "fc1", (40,), 3)
    metrics = init_width_seed_(seed, "gradmax", width_batches(model, seed.site, [(x, y)], F.cross_entropy))
    assert 0 < metrics["init_energy"] <= 1
    assert torch.count_nonzero(seed.fan_in) == 0 and torch.count_nonzero(seed.fan_out) > 0
    slot.stage, slot.alpha = SeedStage.BLENDING, 1.0
    F.cross_entropy(model(x), y).backward()
    # ReLU's gradient at 0 would be 0: the seed replays it with the right derivative.
    assert seed.fan_in.grad is not None and seed.fan_in.grad.norm() > 0


def test_tiny_units_lower_the_loss_to_first_order() -> None:
    torch.manual_seed(0)
    model = MNIST1DCNN(channels=4)
    x, y = torch.randn(128, 40), torch.randint(0, 10, (128,))
    slot, seed = _grown(model, "conv2", (40,), 2)
    init_width_seed_(seed, "tiny", width_batches(model, seed.site, [(x, y)], F.cross_entropy))
    slot.stage = SeedStage.BLENDING
    losses = []
    for alpha in (0.0, 1e-3):
        slot.alpha = alpha
        with torch.no_grad():
            losses.append(float(F.cross_entropy(model(x), y)))
    assert losses[1] < losses[0]


@requires_cuda("width seeds' data-aware inits on the GPU (CUDA's lstsq lacks gelsd)")
@pytest.mark.parametrize("init", ["gradmax", "tiny"])
def test_data_aware_inits_on_cuda_capture_what_they_do_on_the_cpu(init: str) -> None:
    torch.manual_seed(0)
    cpu_model = MNIST1DCNN(channels=4)
    cuda_model = copy.deepcopy(cpu_model).cuda()
    x, y = torch.randn(128, 40), torch.randint(0, 10, (128,))
    energy = {}
    for model, device in ((cpu_model, "cpu"), (cuda_model, "cuda")):
        slot, seed = _grown(model, "conv2", (40,), 2)
        batches = width_batches(model, seed.site, [(x.to(device), y.to(device))], F.cross_entropy)
        energy[device] = init_width_seed_(seed, init, batches)["init_energy"]
        assert seed.fan_out.device.type == device and torch.isfinite(seed.fan_out).all()
    # Singular vectors' signs may differ between LAPACK and cuSOLVER; the captured energy may not.
    assert energy["cuda"] == pytest.approx(energy["cpu"], rel=1e-3)


def test_the_merge_keeps_adam_state_and_new_entries_take_the_seeds_step_sizes() -> None:
    torch.manual_seed(0)
    model = MNIST1DMLP(width=5)
    x, y = torch.randn(32, 40), torch.randint(0, 10, (32,))
    slot, seed = _grown(model, "fc1", (40,), 2)
    slot.stage, slot.alpha = SeedStage.BLENDING, 1.0
    opt = torch.optim.Adam([{"params": list(model.parameters())}, {"params": list(seed.parameters())}], lr=1e-2)
    for step in range(3):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if step == 0:
            nn.init.normal_(seed.fan_out, std=0.1)
    fc1 = model.fc1
    old_avg = opt.state[fc1.weight]["exp_avg"].clone()
    seed_avg = opt.state[seed.fan_in]["exp_avg"].clone()
    slot.seed = None
    merge_width_seed(model, seed, opt)
    state = opt.state[fc1.weight]
    assert state["exp_avg"].shape == fc1.weight.shape == (7, 40)
    assert torch.equal(state["exp_avg"][:5], old_avg)
    torch.testing.assert_close(state["exp_avg"][5:], seed_avg)  # same step counts here: no rescale
    assert all(p is not seed.fan_in for g in opt.param_groups for p in g["params"])
    before = fc1.weight.detach().clone()
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    # No oversized first steps for the new rows: Adam's step is at most ~lr per entry.
    assert (fc1.weight.detach() - before).abs().max() <= 1.5e-2


@pytest.mark.parametrize("order", [("conv1", "conv2", "conv3"), ("conv3", "conv2", "conv1")])
def test_adjacent_layers_grown_together_merge_in_either_order(order: tuple[str, ...]) -> None:
    torch.manual_seed(0)
    model = MNIST1DCNN(channels=4)
    clean = copy.deepcopy(model)
    x = torch.randn(8, 40)
    seeds = {}
    for name in ("conv1", "conv2", "conv3"):
        slot, seed = _grown(model, name, (40,), 2)
        nn.init.normal_(seed.fan_out, std=0.3)
        slot.stage, slot.alpha = SeedStage.BLENDING, 1.0
        seeds[name] = seed
    opt = torch.optim.Adam([*clean.parameters()], lr=1e-2)
    F.cross_entropy(clean(x), torch.zeros(8, dtype=torch.long)).backward()
    opt.step()
    model.load_state_dict(clean.state_dict())  # the same host weights after the step
    for name in order:
        merge_width_seed(clean, seeds[name], opt)
    # New units of one layer never fed the next layer's new units: those weights start at zero.
    torch.testing.assert_close(clean(x), model(x), rtol=1e-5, atol=1e-5)
    assert clean.conv2.weight.shape == (6, 6, 3) and clean.fc.in_features == 6 * 5
    assert opt.state[clean.conv2.weight]["exp_avg"].shape == (6, 6, 3)
    opt.zero_grad()
    F.cross_entropy(clean(x), torch.zeros(8, dtype=torch.long)).backward()
    opt.step()


def test_a_unit_that_would_be_dead_after_the_merge_is_refused() -> None:
    model = MNIST1DMLP(width=4)
    x, y = torch.randn(16, 40), torch.randint(0, 10, (16,))
    _, seed = _grown(model, "fc1", (40,), 2)
    init_width_seed_(seed, "gradmax", width_batches(model, seed.site, [(x, y)], F.cross_entropy))
    with pytest.raises(ValueError, match=r"units \[0, 1\] .* all-zero fan-in .* train the seed at least one step"):
        merge_width_seed(copy.deepcopy(model), seed)


def test_resize_width_round_trips_a_checkpoint_of_a_grown_network() -> None:
    torch.manual_seed(0)
    grown, narrow = BNConvNet(), BNConvNet()
    _, seed = _grown(grown, "features.0", (1, 8, 8), 2)
    nn.init.normal_(seed.fan_out)
    seed.fan_in.data.normal_()
    site = merge_width_seed(grown, seed)
    checkpoint = copy.deepcopy(grown.state_dict())
    # A fresh narrow model reshaped to the checkpoint's widths loads it and computes the same.
    resized = resize_width(narrow, trace_width_site(narrow, "features.0", (1, 8, 8)), site.width)
    narrow.load_state_dict(checkpoint)
    grown.eval(), narrow.eval()
    x = torch.randn(4, 1, 8, 8)
    assert torch.equal(narrow(x), grown(x)) and resized.width == 8
    # ...and back down: a rollback to before the merge.
    resize_width(narrow, resized, 6)
    assert narrow.features[0].weight.shape == (6, 1, 3, 3) and narrow.features[4].in_channels == 6


class Encoder(nn.Module):
    """A transformer encoder as people write one (batch_first), read out by mean pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(1))


@pytest.mark.parametrize("init", ["random", "gradmax", "tiny"])
def test_a_transformers_ffn_pair_widens_token_by_token(init: str) -> None:
    torch.manual_seed(0)
    model = Encoder()
    clean = copy.deepcopy(model)
    site = trace_width_site(model, "encoder.layers.0.linear1", (5, 8))
    assert (site.consumer, [s.kind for s in site.steps]) == ("encoder.layers.0.linear2", ["elementwise", "dropout"])
    x, y = torch.randn(4, 5, 8), torch.randint(0, 3, (4,))
    slot, seed = _grown(model, "encoder.layers.0.linear1", (5, 8), 8)
    init_width_seed_(seed, init, width_batches(model, site, [(x, y)], F.cross_entropy))
    nn.init.normal_(seed.fan_out)
    seed.fan_in.data.normal_()
    slot.stage, slot.alpha = SeedStage.BLENDING, 1.0
    model.eval(), clean.eval(), slot.eval()
    merge_width_seed(clean, seed)
    with torch.inference_mode():  # the encoder's inference fast path must not bypass the units
        torch.testing.assert_close(clean(x), model(x), rtol=1e-5, atol=1e-5)
    assert clean.encoder.layers[0].linear1.out_features == 40


@pytest.mark.parametrize(
    ("kind", "shape", "weight", "kw"),
    [
        ("linear", (5, 3, 7), (1, 7), {}),
        ("conv1d", (4, 3, 11), (1, 3, 3), {"stride": (2,), "padding": (1,), "dilation": (2,)}),
        ("conv2d", (2, 3, 8, 7), (1, 3, 3, 2), {"stride": (1, 2), "padding": (1, 0), "dilation": (1, 1)}),
        ("conv2d", (2, 2, 6, 6), (1, 2, 3, 3), {"stride": (1, 1), "padding": "same", "dilation": (1, 1)}),
    ],
)
def test_the_rows_a_unit_reads_are_the_jacobian_of_a_one_output_layer(kind, shape, weight, kw) -> None:  # noqa: ANN001
    """The im2col fast path (and the Linear one) equals the definition: d(one output)/d(weight)."""
    from torch.func import jacrev

    from esper_core.kasmina.width.init import _rows
    from esper_core.kasmina.width.seed import _apply

    t, w = torch.randn(*shape), torch.zeros(*weight)
    expected = jacrev(lambda v: _apply((kind, kw), t, v, None).flatten())(w).reshape(-1, w[0].numel())
    torch.testing.assert_close(_rows((kind, kw), t, w), expected)
