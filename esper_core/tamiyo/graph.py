"""Turn a run's recent ``SystemStatePacket``s into the hetero graph Tamiyo's policy reads.

Node types and their features (names in the ``*_FEATURES`` tuples, sizes in the ``*_DIM``
constants, so the policy has fixed input widths):

- ``global`` (1 node): losses, accuracy, their trends and volatility, generalisation gap,
  learning rate, host size (parameters and FLOPs per sample), parameters added by seeds, epoch
  and progress through the run, the share of slots holding a seed, training accuracy and its gap
  to validation accuracy (under- vs over-fitting), and the parameter budget the risk engine
  leaves seeds (what remains, and the share used).
- ``layer`` (one per ``LayerState``, in host order): kind (linear, conv1d, conv2d, attention,
  recurrent, norm, embedding, other), width (absolute and against the host's other layers),
  fan-in and fan-out, share of the host's parameters and of its FLOPs per sample, activation
  statistics, gradient norm, relative depth.
- ``slot`` (one per ``SeedState``): kind (branch, width, depth), lifecycle stage, blend alpha,
  ages, size (absolute and as a share of the host), gradient norm, samples seen, the seed's
  effect on validation loss, last gate verdict, and the bottleneck signal: the loss gradient's
  norm at the slot's activation (DORMANT slots too).
- ``blueprint`` (one per ``BlueprintCandidate``): the kind of slot it grows, tier, risk,
  parameter cost (absolute and relative to the host), the share of slots it fits, and what the
  seed adds (Karn's capacity, averaged over the profiles it has an artifact for): FLOPs per
  sample (absolute and relative to the host's) and the share of those profiles where its delta
  is linear (folds into the next layer).

Two rules hold for every feature, so that one policy can read any host on any machine:

- **No wall-clock quantity.** Epoch latency, latency budgets, kernel timings and timestamps stay
  in the packets and telemetry and are never read here: the same run on a busy machine must
  build the same graph, bit for bit. Costs are counts (parameters, FLOPs per sample).
- **Nothing tied to a recipe's layer names or counts.** Layers are described by kind, fans and
  shares of the host; counts that depend on how many layers or slots a recipe has become shares
  (of slots, of parameters, of FLOPs). Absolute log sizes are kept beside the shares where scale
  itself carries meaning (a 1k-parameter host and a 10M one should not grow alike).

``TamiyoGraph.coverage`` is the share of feature entries that were observed; ``missing`` names
the features that were not (e.g. ``slot.grad_norm`` before a seed has trained, or a layer's kind
in a packet recorded before layers reported it).

Every relation has an explicit reverse so that every node type receives messages, and every
edge type is always present (possibly with zero edges) so the graph metadata never changes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch

from esper_core.contracts import BlueprintTier, LayerState, SeedStage, SeedState, SystemStatePacket
from esper_core.contracts.enums import LayerKind, SlotKind
from esper_core.tamiyo.candidates import BlueprintCandidate

if TYPE_CHECKING:
    from torch_geometric.data import HeteroData

NodeType = str
EdgeType = tuple[str, str, str]

NODE_TYPES: tuple[NodeType, ...] = ("global", "layer", "slot", "blueprint")

# Forward relations first, then their reverses in the same order.
FORWARD_EDGE_TYPES: tuple[EdgeType, ...] = (
    ("layer", "feeds", "layer"),
    ("layer", "hosts", "slot"),
    ("blueprint", "fits", "slot"),
    ("global", "context", "layer"),
    ("global", "context", "slot"),
    ("global", "context", "blueprint"),
)
REVERSE_EDGE_TYPES: tuple[EdgeType, ...] = (
    ("layer", "fed_by", "layer"),
    ("slot", "hosted_in", "layer"),
    ("slot", "fitted_by", "blueprint"),
    ("layer", "informs", "global"),
    ("slot", "informs", "global"),
    ("blueprint", "informs", "global"),
)
EDGE_TYPES: tuple[EdgeType, ...] = FORWARD_EDGE_TYPES + REVERSE_EDGE_TYPES

GLOBAL_FEATURES: tuple[str, ...] = (
    "train_loss",
    "val_loss",
    "val_accuracy",
    "val_loss_slope",  # least-squares slope per epoch over the last TREND_WINDOW epochs
    "val_loss_volatility",  # population std of the last TREND_WINDOW val losses
    "log_learning_rate",
    "log1p_host_params",  # absolute scale, beside the shares below
    "log1p_epoch",
    "active_slot_share",  # slots holding an active seed / slots (0 without slots)
    "val_accuracy_slope",  # least-squares slope per epoch over the last TREND_WINDOW epochs
    "val_accuracy_volatility",
    "train_loss_slope",
    "generalisation_gap",  # val_loss - train_loss
    "seed_param_share",  # parameters of active seeds / host parameters
    "progress",  # epoch / (total_epochs - 1), the share of the run done; unobserved when its length is not given
    "train_accuracy",  # unobserved for non-class targets and packets recorded before it existed
    "train_val_accuracy_gap",  # train_accuracy - val_accuracy: > 0 over-fits, ~0 under-fits
    "log1p_remaining_param_budget",  # signed log1p(param_budget - active seeds' parameters)
    "param_budget_used",  # active seeds' parameters / param_budget: the scale-free budget
    "log1p_host_flops_per_sample",  # sum over the layers; unobserved if any layer's is
)
_LAYER_KINDS: tuple[LayerKind, ...] = tuple(LayerKind)
LAYER_FEATURES: tuple[str, ...] = (
    "log_width",  # absolute: a 4-unit layer is a bottleneck on any host; log_width_rel is the scale-free one
    "activation_mean",
    "activation_std",
    "log1p_grad_norm",
    "relative_depth",  # 0 for the first layer, 1 for the last
    *(f"kind_{k.value}" for k in _LAYER_KINDS),
    "log_width_rel",  # log(width) minus the mean log width of the host's layers: scale-free
    "log_fan_in",
    "log_fan_out",
    "param_share",  # the layer's parameters / host parameters
    "flops_share",  # the layer's FLOPs per sample / the host layers' sum
)
_SLOT_STAGES: tuple[SeedStage, ...] = tuple(SeedStage)
# The action space's kinds: a GERMINATE in a depth slot is already a choice the policy can encode.
_SLOT_KINDS: tuple[SlotKind, ...] = tuple(SlotKind)
SLOT_FEATURES: tuple[str, ...] = tuple(f"stage_{s.value}" for s in _SLOT_STAGES) + (
    "alpha",
    "log1p_age_epochs",
    "log1p_epochs_in_stage",
    "log1p_param_count",
    "log1p_grad_norm",
    "log1p_samples",
    "val_loss_with_seed_delta",  # metrics["val_loss_with_seed"] - packet val_loss
    "val_loss_without_seed_delta",  # metrics["val_loss_without_seed"] - packet val_loss
    "gate_passed",
    "gate_failed",
    "gate_none",
    "log1p_activation_grad_norm",  # SeedState.activation_grad_norm (Tolaria's slot probe)
    *(f"kind_{k.value}" for k in _SLOT_KINDS),
    "param_share",  # param_count / host parameters
)
_TIERS: tuple[BlueprintTier, ...] = tuple(BlueprintTier)
BLUEPRINT_FEATURES: tuple[str, ...] = tuple(f"tier_{t.value}" for t in _TIERS) + (
    "risk",
    "log1p_param_cost",
    "fit_share",  # share of the state's slots whose profile it has an artifact for
    "param_cost_share",  # param_cost / host parameters
    "log1p_flops_per_sample",  # mean over the candidate's profiles with a known capacity
    "linear_share",  # share of those profiles where the seed's delta is affine (adds no capacity)
    *(f"kind_{k.value}" for k in _SLOT_KINDS),  # the kind of slot it grows in
    "flops_share",  # its FLOPs per sample / the host's: a count, where latency was a timing
)

GLOBAL_DIM = len(GLOBAL_FEATURES)
LAYER_DIM = len(LAYER_FEATURES)
SLOT_DIM = len(SLOT_FEATURES)
BLUEPRINT_DIM = len(BLUEPRINT_FEATURES)
FEATURE_NAMES: dict[NodeType, tuple[str, ...]] = {
    "global": GLOBAL_FEATURES,
    "layer": LAYER_FEATURES,
    "slot": SLOT_FEATURES,
    "blueprint": BLUEPRINT_FEATURES,
}
FEATURE_DIMS: dict[NodeType, int] = {
    "global": GLOBAL_DIM,
    "layer": LAYER_DIM,
    "slot": SLOT_DIM,
    "blueprint": BLUEPRINT_DIM,
}

TREND_WINDOW = 5
# Bounds every feature: a diverged loss of 1e30 must not saturate the policy's activations.
FEATURE_CLIP = 1e4

# A feature row before tensorisation; ``None`` marks an entry that was not observed.
_Row = list[float | None]
_V = TypeVar("_V", LayerKind, SlotKind)


@dataclass(frozen=True, kw_only=True, slots=True)
class TamiyoGraph:
    """The policy's input graph plus the ids needed to map node scores back to commands.

    The graph is kept as plain tensor dicts, which is all the policy reads: a run builds one every
    epoch (its policy, or the GNN's shadow scoring under the heuristic), and torch-geometric's
    ``HeteroData`` would cost every run its import (seconds). ``hetero_data()`` builds one for what
    batches graphs (Simic's dataset).

    Attributes:
        x_dict: Node features per node type, in ``NODE_TYPES`` order;
            ``(num_nodes, FEATURE_DIMS[node_type])`` float32 each.
        edge_index_dict: ``(2, E)`` int64 edge indices for every edge type in ``EDGE_TYPES``
            (each forward relation followed by its reverse).
        slot_ids: Slot id of each ``slot`` node, in node order.
        blueprint_ids: Blueprint id of each ``blueprint`` node, in node order.
        coverage: Share of feature entries that were observed rather than defaulted to 0.
        missing: ``<node type>.<feature>`` names with at least one unobserved entry, sorted.
    """

    x_dict: dict[NodeType, torch.Tensor]
    edge_index_dict: dict[EdgeType, torch.Tensor]
    slot_ids: tuple[str, ...]
    blueprint_ids: tuple[str, ...]
    coverage: float
    missing: tuple[str, ...] = ()

    def hetero_data(self) -> HeteroData:
        """The graph as a torch-geometric ``HeteroData`` holding these same tensors.

        Returns:
            A new ``HeteroData`` on each call (its node and edge stores refer back to it, so keep
            it while they are read).
        """
        from torch_geometric.data import HeteroData

        data = HeteroData()
        for node_type, x in self.x_dict.items():
            data[node_type].x = x
        for edge_type, edge_index in self.edge_index_dict.items():
            data[edge_type].edge_index = edge_index
        return data

    def inputs(self, device: torch.device) -> tuple[dict[NodeType, torch.Tensor], dict[EdgeType, torch.Tensor]]:
        """The policy's ``(x_dict, edge_index_dict)`` on ``device``.

        Args:
            device: Where the policy runs.

        Returns:
            Node features per node type and edge indices per edge type.
        """
        # non_blocking only overlaps anything for pinned host memory; it is harmless otherwise.
        x_dict = {nt: x.to(device, non_blocking=True) for nt, x in self.x_dict.items()}
        edge_index_dict = {et: ei.to(device, non_blocking=True) for et, ei in self.edge_index_dict.items()}
        return x_dict, edge_index_dict


def build_graph(
    history: Sequence[SystemStatePacket],
    candidates: Sequence[BlueprintCandidate],
    *,
    total_epochs: int | None = None,
    param_budget: int | None = None,
) -> TamiyoGraph:
    """Build Tamiyo's hetero graph for the current epoch.

    Args:
        history: The run's packets, oldest first; ``history[-1]`` is the current epoch. Earlier
            packets only feed the trends and volatilities (the last ``TREND_WINDOW``).
        candidates: Blueprints that can be germinated, one ``blueprint`` node each.
        total_epochs: Length of the run, for the ``progress`` feature; None leaves it unobserved.
        param_budget: Parameters all active seeds may hold together now (the risk engine's
            ``RiskConfig.seed_param_limit``), for ``log1p_remaining_param_budget``; None leaves
            it unobserved.

    Returns:
        The graph with every node type and every edge type in ``EDGE_TYPES`` present (possibly
        empty), float32 features bounded by ``FEATURE_CLIP`` and int64 ``(2, E)`` edge indices.

    Raises:
        ValueError: If ``history`` is empty.
    """
    if not history:
        raise ValueError("history is empty: pass at least the current epoch's SystemStatePacket")
    current = history[-1]
    host_flops = _host_flops(current.layers)
    log_widths = [math.log(layer.width) for layer in current.layers]
    mean_log_width = statistics.fmean(log_widths) if log_widths else 0.0
    rows: dict[NodeType, list[_Row]] = {
        "global": [_global_row(history, total_epochs, param_budget, host_flops)],
        "layer": [
            _layer_row(layer, i, len(current.layers), current.host_params, host_flops, mean_log_width)
            for i, layer in enumerate(current.layers)
        ],
        "slot": [_slot_row(seed, current.val_loss, current.host_params) for seed in current.seeds],
        "blueprint": [_blueprint_row(c, current, host_flops) for c in candidates],
    }
    x_dict: dict[NodeType, torch.Tensor] = {}
    observed = total = 0
    missing: set[str] = set()
    for node_type, node_rows in rows.items():
        x, unobserved = _tensorise(node_rows, FEATURE_DIMS[node_type])
        x_dict[node_type] = x  # (num_nodes, FEATURE_DIMS[node_type])
        observed += x.numel() - len(unobserved)
        total += x.numel()
        names = FEATURE_NAMES[node_type]
        missing.update(f"{node_type}.{names[col]}" for col in unobserved)
    edge_index_dict = {
        edge_type: torch.tensor([src, dst], dtype=torch.long)  # (2, E)
        for edge_type, (src, dst) in _edges(current, candidates).items()
    }
    return TamiyoGraph(
        x_dict=x_dict,
        edge_index_dict=edge_index_dict,
        slot_ids=tuple(s.slot_id for s in current.seeds),
        blueprint_ids=tuple(c.blueprint_id for c in candidates),
        coverage=observed / total,
        missing=tuple(sorted(missing)),
    )


def _tensorise(rows: list[_Row], dim: int) -> tuple[torch.Tensor, list[int]]:
    """Stack rows into a bounded float32 tensor; list the column of every unobserved entry."""
    values: list[list[float]] = []
    unobserved: list[int] = []
    for row in rows:
        assert len(row) == dim, f"feature row has {len(row)} entries, expected {dim}"
        clean: list[float] = []
        for col, value in enumerate(row):
            if value is None or not math.isfinite(value):
                clean.append(0.0)
                unobserved.append(col)
            else:
                clean.append(max(-FEATURE_CLIP, min(FEATURE_CLIP, value)))
        values.append(clean)
    # Not ``torch.tensor(values).reshape(...)``: that is a view, and a view input makes Dynamo
    # guard on its base as well.
    x = torch.tensor(values, dtype=torch.float32) if values else torch.zeros(0, dim)
    return x, unobserved


def _global_row(
    history: Sequence[SystemStatePacket], total_epochs: int | None, param_budget: int | None, host_flops: int | None
) -> _Row:
    current = history[-1]
    window = history[-TREND_WINDOW:]
    losses = [p.val_loss for p in window]
    accuracies = [p.val_accuracy for p in window]
    trended = len(window) >= 2
    seed_params = sum(s.param_count for s in current.seeds if s.stage.is_active)
    progress = None
    if total_epochs is not None:
        progress = current.epoch / (total_epochs - 1) if total_epochs > 1 else 1.0
    train_accuracy = current.train_accuracy
    active = sum(s.stage.is_active for s in current.seeds)
    return [
        current.train_loss,
        current.val_loss,
        current.val_accuracy,
        _slope(losses) if trended else None,
        statistics.pstdev(losses) if trended else None,
        math.log(current.learning_rate),
        math.log1p(current.host_params),
        math.log1p(current.epoch),
        active / len(current.seeds) if current.seeds else 0.0,
        _slope(accuracies) if trended else None,
        statistics.pstdev(accuracies) if trended else None,
        _slope([p.train_loss for p in window]) if trended else None,
        current.val_loss - current.train_loss,
        seed_params / max(current.host_params, 1),
        progress,
        train_accuracy,
        None if train_accuracy is None else train_accuracy - current.val_accuracy,
        None if param_budget is None else _log1p_nonneg(param_budget - seed_params),
        # A budget of 0 is used up by the first seed parameter.
        None if param_budget is None else seed_params / param_budget if param_budget > 0 else float(seed_params > 0),
        None if host_flops is None else math.log1p(host_flops),
    ]


def _host_flops(layers: Sequence[LayerState]) -> int | None:
    """FLOPs per sample of the host's weight layers; None when any layer's is unknown (a partial
    sum would read as a smaller host)."""
    flops = [layer.flops_per_sample for layer in layers]
    if not flops or any(f is None for f in flops):
        return None
    return sum(f for f in flops if f is not None)


def _slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` against 0, 1, 2, ... (needs at least two values)."""
    n = len(values)
    x_mean = (n - 1) / 2
    y_mean = sum(values) / n
    cov = sum((i - x_mean) * (y - y_mean) for i, y in enumerate(values))
    var = sum((i - x_mean) ** 2 for i in range(n))
    return cov / var


def _layer_row(
    layer: LayerState,
    index: int,
    num_layers: int,
    host_params: int,
    host_flops: int | None,
    mean_log_width: float,
) -> _Row:
    kind = _one_hot(layer.kind, _LAYER_KINDS)
    flops = layer.flops_per_sample
    return [
        math.log(layer.width),
        layer.activation_mean,
        layer.activation_std,
        _log1p_nonneg(layer.grad_norm),
        index / (num_layers - 1) if num_layers > 1 else 0.0,
        *kind,
        math.log(layer.width) - mean_log_width,
        None if layer.fan_in is None else math.log(layer.fan_in),
        None if layer.fan_out is None else math.log(layer.fan_out),
        None if layer.params is None else layer.params / max(host_params, 1),
        None if flops is None or not host_flops else flops / host_flops,
    ]


def _one_hot(value: _V | None, vocabulary: tuple[_V, ...]) -> _Row:
    """One-hot of ``value`` over ``vocabulary``; every entry unobserved when ``value`` is None."""
    if value is None:
        return [None] * len(vocabulary)
    return [float(value == v) for v in vocabulary]


def _slot_row(seed: SeedState, val_loss: float, host_params: int) -> _Row:
    stage_onehot: _Row = [float(seed.stage is s) for s in _SLOT_STAGES]
    grad_norm = seed.metrics.get("grad_norm")
    samples = seed.metrics.get("samples")
    with_seed = seed.metrics.get("val_loss_with_seed")
    without_seed = seed.metrics.get("val_loss_without_seed")
    gate = seed.last_gate
    return stage_onehot + [
        seed.alpha,
        math.log1p(seed.age_epochs),
        math.log1p(seed.epochs_in_stage),
        math.log1p(seed.param_count),
        None if grad_norm is None else _log1p_nonneg(grad_norm),
        None if samples is None else _log1p_nonneg(samples),
        None if with_seed is None else with_seed - val_loss,
        None if without_seed is None else without_seed - val_loss,
        float(gate is not None and gate.passed),
        float(gate is not None and not gate.passed),
        float(gate is None),
        None if seed.activation_grad_norm is None else _log1p_nonneg(seed.activation_grad_norm),
        *_one_hot(seed.kind, _SLOT_KINDS),
        seed.param_count / max(host_params, 1),
    ]


def _blueprint_row(candidate: BlueprintCandidate, current: SystemStatePacket, host_flops: int | None) -> _Row:
    tier_onehot: _Row = [float(candidate.descriptor.tier is t) for t in _TIERS]
    known = [c for c in candidate.capacity if c.profile in candidate.shape_profiles]
    flops = statistics.fmean(c.flops_per_sample for c in known) if known else None
    seeds = current.seeds
    return tier_onehot + [
        candidate.descriptor.risk,
        math.log1p(candidate.param_cost),
        sum(candidate.fits(s.shape_profile) for s in seeds) / len(seeds) if seeds else None,
        candidate.param_cost / max(current.host_params, 1),
        statistics.fmean(math.log1p(c.flops_per_sample) for c in known) if known else None,
        statistics.fmean(float(c.linear) for c in known) if known else None,
        *_one_hot(candidate.kind, _SLOT_KINDS),
        None if flops is None or not host_flops else flops / host_flops,
    ]


def _log1p_nonneg(value: float) -> float:
    # Norms are >= 0 by definition; a negative one is a reporting bug, so keep its sign visible
    # to the policy instead of producing log1p(<-1) = nan.
    return math.copysign(math.log1p(abs(value)), value)


def _edges(
    current: SystemStatePacket, candidates: Sequence[BlueprintCandidate]
) -> dict[EdgeType, tuple[list[int], list[int]]]:
    """(src, dst) node indices for every edge type in ``EDGE_TYPES``."""
    num_layers, num_slots = len(current.layers), len(current.seeds)
    layer_index: dict[str, list[int]] = {}
    for i, layer in enumerate(current.layers):
        layer_index.setdefault(layer.name, []).append(i)
    hosts = [(i, j) for j, s in enumerate(current.seeds) for i in layer_index.get(s.layer, [])]
    fits = [
        (b, j) for b, cand in enumerate(candidates) for j, s in enumerate(current.seeds) if cand.fits(s.shape_profile)
    ]
    forward: dict[EdgeType, list[tuple[int, int]]] = {
        ("layer", "feeds", "layer"): [(i, i + 1) for i in range(num_layers - 1)],
        ("layer", "hosts", "slot"): hosts,
        ("blueprint", "fits", "slot"): fits,
        ("global", "context", "layer"): [(0, i) for i in range(num_layers)],
        ("global", "context", "slot"): [(0, j) for j in range(num_slots)],
        ("global", "context", "blueprint"): [(0, b) for b in range(len(candidates))],
    }
    edges: dict[EdgeType, tuple[list[int], list[int]]] = {}
    for fwd, rev in zip(FORWARD_EDGE_TYPES, REVERSE_EDGE_TYPES, strict=True):
        pairs = forward[fwd]
        src = [p[0] for p in pairs]
        dst = [p[1] for p in pairs]
        edges[fwd] = (src, dst)
        edges[rev] = (dst, src)
    return edges
