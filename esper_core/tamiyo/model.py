"""Tamiyo's policy: a hetero-GNN over the training-state graph built by ``graph.build_graph``.

Shape legend: N_t nodes of type t; E_r edges of relation r; G global nodes (1 per graph); S slot
nodes; B blueprint nodes; H = ``hidden_dim``; A = ``len(ACTIONS)``; K = ``len(BlendSchedule)``.

Each message-passing layer computes exactly what torch-geometric's
``HeteroConv({r: SAGEConv((H, H), H) for r in relations}, aggr="sum")`` computes, in a fused
form: for destination type t with incoming relations r_1..r_k,

    h_t' = sum_r (W_r mean_r(h_src) + b_r + R_r h_t) = W_t [h_t | mean_r1 | ... | mean_rk] + b_t

(the root weights R_r and biases b_r of the relations only ever appear summed). One linear per
node type instead of two per relation, and plain ``index_select``/``scatter_add_`` instead of
PyG's generic ``propagate``: 3-4x faster eager on the ``policy-graph`` workload, and a Dynamo
trace of a few hundred ops instead of ~1,800, which is what made the compile warm-up cost 16-40 s.
``tests/tamiyo/test_policy_gnn.py`` checks the equivalence against PyG with mapped weights.

The module is plain eager PyTorch with fixed input widths (no lazy ``-1`` layers, so no dry
run is needed before building an optimizer) and no data-dependent Python control flow in
``forward``, so ``torch.compile(dynamic=True)`` traces it without graph breaks. Compilation,
precision and device placement are applied from outside, in ``build.prepare_policy``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from esper_core.contracts import BlendSchedule, CommandType, SeedOperation
from esper_core.tamiyo.config import TamiyoGNNConfig
from esper_core.tamiyo.graph import EDGE_TYPES, FEATURE_DIMS, NODE_TYPES, EdgeType, NodeType

ACTIONS: tuple[tuple[CommandType, SeedOperation | None], ...] = (
    (CommandType.WAIT, None),
    (CommandType.SEED, SeedOperation.GERMINATE),
    (CommandType.SEED, SeedOperation.ADVANCE),
    (CommandType.SEED, SeedOperation.FOSSILIZE),
    (CommandType.SEED, SeedOperation.CULL),
    (CommandType.OPTIMIZER, None),
    (CommandType.PAUSE, None),
)
POLICY_FORMAT = 2
"""Version of what a stored policy's weights mean: the graph's features and the action space.

A stored policy records it (``PolicyVersion.provenance["policy_format"]``) and one of another
format is refused (``PolicyVersion.require_current_inputs``): equal widths are not enough when a
column or an action changes meaning. Bump it with any such change. 1: policies published up to
2026-11-27 (no recorded format): latency among the features, layers described by width alone.
2: no wall-clock feature; layers by kind, fans and shares of the host; slots and blueprints by
kind (branch, width, depth)."""

# Same spelling as ``AdaptationCommand.action``.
ACTION_NAMES: tuple[str, ...] = tuple(op.value if op is not None else ctype.value for ctype, op in ACTIONS)
BLEND_SCHEDULES: tuple[BlendSchedule, ...] = tuple(BlendSchedule)

# Heads read only these node types, so the last message-passing layer updates only them.
_HEAD_NODE_TYPES: frozenset[NodeType] = frozenset({"global", "slot", "blueprint"})


class PolicyOutput(NamedTuple):
    """Everything the policy predicts for one graph (or a batch of G graphs)."""

    action_logits: Tensor  # (G, A) over ACTIONS
    slot_scores: Tensor  # (S,) one score per slot node, for choosing the slot to act on
    blueprint_scores: Tensor  # (B,) one score per blueprint node, for choosing what to germinate
    blend_logits: Tensor  # (G, K) over BLEND_SCHEDULES
    lr_adjust: Tensor  # (G,) in (-1, 1): log-scale learning-rate adjustment
    value: Tensor  # (G,) state value estimate
    risk: Tensor  # (G,) in (0, 1): predicted probability the proposal regresses the run


class TamiyoGNN(nn.Module):
    """Hetero-GNN policy: input projections, residual hetero-SAGE layers, and heads.

    Args:
        config: Network size.
    """

    def __init__(self, config: TamiyoGNNConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_dim
        self.input_proj = nn.ModuleDict(
            {node_type: nn.Linear(FEATURE_DIMS[node_type], hidden) for node_type in NODE_TYPES}
        )
        self.convs = nn.ModuleList(
            HeteroSAGELayer(hidden, last=(i == config.num_layers - 1)) for i in range(config.num_layers)
        )
        self.dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        self.action_head = _mlp(hidden, len(ACTIONS))
        self.slot_head = _mlp(hidden, 1)
        self.blueprint_head = _mlp(hidden, 1)
        self.blend_head = _mlp(hidden, len(BLEND_SCHEDULES))
        self.lr_head = _mlp(hidden, 1)
        self.value_head = _mlp(hidden, 1)
        self.risk_head = _mlp(hidden, 1)

    def forward(self, x_dict: dict[NodeType, Tensor], edge_index_dict: dict[EdgeType, Tensor]) -> PolicyOutput:
        """Score a training-state graph (or a batch of graphs with G global nodes).

        Args:
            x_dict: Node features per node type, ``(N_t, FEATURE_DIMS[t])``; every type in
                ``NODE_TYPES`` must be present (possibly with 0 rows).
            edge_index_dict: int64 ``(2, E_r)`` indices per edge type in ``EDGE_TYPES``.

        Returns:
            The policy's predictions; score tensors are empty when there are no slot or
            blueprint nodes.
        """
        # Mean-aggregation weights depend only on the graph: computed once, shared by all layers.
        edges = {et: _mean_edges(edge_index_dict[et], x_dict[et[2]]) for et in EDGE_TYPES}
        h_dict = {nt: self.input_proj[nt](x_dict[nt]) for nt in NODE_TYPES}  # (N_t, H)
        for conv in self.convs:
            msg_dict = conv(h_dict, edges)  # (N_t, H) for each destination type
            # Residual update; types a layer does not update (``layer`` in the last) pass through.
            h_dict = {nt: h + self.dropout(F.relu(msg_dict[nt])) if nt in msg_dict else h for nt, h in h_dict.items()}
        h_global = h_dict["global"]  # (G, H)
        return PolicyOutput(
            action_logits=self.action_head(h_global),
            slot_scores=self.slot_head(h_dict["slot"]).squeeze(-1),
            blueprint_scores=self.blueprint_head(h_dict["blueprint"]).squeeze(-1),
            blend_logits=self.blend_head(h_global),
            lr_adjust=torch.tanh(self.lr_head(h_global)).squeeze(-1),
            value=self.value_head(h_global).squeeze(-1),
            risk=torch.sigmoid(self.risk_head(h_global)).squeeze(-1),
        )


# (src index (E,), dst index (E,), 1 / in-degree of each edge's destination (E, 1))
_MeanEdges = tuple[Tensor, Tensor, Tensor]


def _mean_edges(edge_index: Tensor, x_dst: Tensor) -> _MeanEdges:
    src, dst = edge_index[0], edge_index[1]
    ones = x_dst.new_ones(dst.shape[0])
    # scatter_add_ rather than index_add_: Inductor's CPU vectoriser (torch 2.13) asserts on an
    # index_add_ whose result feeds a pointwise op, which is exactly this degree computation.
    degree = x_dst.new_zeros(x_dst.shape[0]).scatter_add_(0, dst, ones)  # (N_dst,)
    return src, dst, degree.clamp(min=1.0).reciprocal().index_select(0, dst).unsqueeze(-1)


class HeteroSAGELayer(nn.Module):
    """One message-passing layer: SAGE (mean) per relation, summed per destination type, fused.

    Equivalent to ``HeteroConv({r: SAGEConv((H, H), H)}, aggr="sum")`` (see the module docstring);
    ``lin[t]`` reads ``[h_t | mean over relation 1 | ... ]`` in ``relations[t]`` order.

    Args:
        hidden: Width H of the node embeddings.
        last: Update only the node types the heads read (``layer`` nodes then only send).
    """

    def __init__(self, hidden: int, *, last: bool) -> None:
        super().__init__()
        self.relations: dict[NodeType, tuple[EdgeType, ...]] = {
            nt: tuple(et for et in EDGE_TYPES if et[2] == nt) for nt in NODE_TYPES if not last or nt in _HEAD_NODE_TYPES
        }
        self.lin = nn.ModuleDict(
            {nt: nn.Linear((len(rels) + 1) * hidden, hidden) for nt, rels in self.relations.items()}
        )

    def forward(self, h_dict: dict[NodeType, Tensor], edges: dict[EdgeType, _MeanEdges]) -> dict[NodeType, Tensor]:
        """Messages for each updated node type, ``(N_t, H)``."""
        out = {}
        for nt, rels in self.relations.items():
            h_dst = h_dict[nt]  # (N_t, H)
            parts = [h_dst]
            for et in rels:
                src, dst, inv_degree = edges[et]
                msg = h_dict[et[0]].index_select(0, src) * inv_degree  # (E_r, H)
                # Summed in the message's dtype: under bf16 autocast the embeddings are bf16 but
                # the fp32 degrees promote the message to fp32 (cat then promotes the parts).
                parts.append(msg.new_zeros(h_dst.shape).scatter_add_(0, dst.unsqueeze(-1).expand_as(msg), msg))
            out[nt] = self.lin[nt](torch.cat(parts, dim=-1))
        return out


def _mlp(hidden: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))


def untrained_policy(config: TamiyoGNNConfig) -> TamiyoGNN:
    """A policy network with fixed random weights (seed 0), drawn without touching the caller's random state.

    A run draws its seeds' initial weights from the process's random stream after Tamiyo is
    built: drawing the network's weights from that stream made every run's numbers after its
    first growth depend on the size of Tamiyo's network (a new graph feature changed the
    golden runs). Until a policy version replaces them, these weights only score in the shadow.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return TamiyoGNN(config)
