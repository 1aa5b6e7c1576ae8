"""Configuration of the Tamiyo service: which policy decides, its network, compile, risk, breaker."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from esper_core.tamiyo.breaker import BreakerConfig
from esper_core.tamiyo.heuristic import HeuristicConfig
from esper_core.tamiyo.risk import RiskConfig
from esper_core.tamiyo.shipped import DEFAULT_SHIPPED, SHIPPED, check_name

POLICIES = ("shipped", "heuristic", "gnn", "random", "periodic", "scheduled", "none")
"""Who decides: the GNN with the policy shipped in Esper's package (``TamiyoConfig.shipped``;
the heuristic only while it cannot serve, and the run then says it was degraded), the
rule-based heuristic, the GNN with the registry's newest (or a pinned) Simic-trained version,
random germination, periodic germination (every k epochs into the next free slot), a fixed
schedule of germinations (``TamiyoConfig.schedule``), or nobody (always WAIT: the host alone)."""

GNN_POLICIES = ("shipped", "gnn")
"""The policies under which the GNN decides."""


# Here rather than beside the network in model.py: reading a run's configuration (esper recipes,
# a run's spec) must not import model.py's graph module, and with it torch-geometric.
@dataclass(kw_only=True, slots=True)
class TamiyoGNNConfig:
    """Size of the policy network.

    Attributes:
        hidden_dim: Width H of every node embedding.
        num_layers: Number of hetero message-passing layers.
        dropout: Dropout on each layer's messages while training (0 disables).
    """

    hidden_dim: int = 64
    num_layers: int = 4
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.hidden_dim < 1:
            raise ValueError(f"hidden_dim must be >= 1, got {self.hidden_dim}: use e.g. 64")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}: use e.g. 4")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}: use 0.0 to disable")


@dataclass(kw_only=True, slots=True)
class PolicyCompileConfig:
    """How ``prepare_policy`` compiles the GNN policy (seed 002).

    Attributes:
        enabled: Compile the policy's forward. It is compiled only when the GNN decides
            with ``TamiyoConfig.policy == "gnn"`` (the shipped policy is served eagerly, see
            ``TamiyoConfig.compiles``): in the other modes it runs once per epoch for
            telemetry, where a 16-40 s compile on a small CPU would cost more than it saves.
        mode: ``torch.compile`` mode; ``reduce-overhead`` adds CUDA graphs on CUDA and is the
            same as the default on CPU.
        dynamic: Compile with dynamic shapes (graphs differ in node and edge counts).
        backend: ``torch.compile`` backend; ``eager`` or ``aot_eager`` skip code generation
            (fast, for tests). The compiled policy is stored as a file
            (``esper_core.tamiyo.precompile``), so the backend must return code PyTorch can
            serialise (Inductor and those two do); with another one compiling falls back to eager
            after the first attempt.
        background: Compile in the policy server while eager serves decisions; False waits for
            the compile before ``prepare_policy`` (or ``warm``) returns (benchmarks, tests).
        max_shapes: Shape signatures compiled at most (each new one is compiled in the
            background on first sight); later ones are served eagerly.
        warmup_timeout_s: Longest one compile in the policy server may take (a cold one, see
            ``esper_core.tamiyo.server``) before compiling is given up for good.
    """

    enabled: bool = True
    mode: str | None = "reduce-overhead"
    dynamic: bool = True
    backend: str = "inductor"
    background: bool = True
    max_shapes: int = 8
    warmup_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        modes = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
        if self.mode not in modes:
            raise ValueError(f"compile mode must be one of {modes}, got {self.mode!r}")
        if self.max_shapes < 1:
            raise ValueError(f"max_shapes must be >= 1, got {self.max_shapes}")
        if self.warmup_timeout_s <= 0:
            raise ValueError(f"warmup_timeout_s must be > 0 seconds, got {self.warmup_timeout_s}")


@dataclass(kw_only=True, slots=True)
class RandomPolicyConfig:
    """The random-germination baseline.

    Attributes:
        germinate_prob: Chance, each epoch with a germinable dormant slot, of germinating a
            uniformly chosen fitting blueprint into a uniformly chosen such slot.
    """

    germinate_prob: float = 0.3

    def __post_init__(self) -> None:
        if not 0.0 <= self.germinate_prob <= 1.0:
            raise ValueError(f"germinate_prob must lie in [0, 1], got {self.germinate_prob}")


@dataclass(kw_only=True, slots=True)
class PeriodicPolicyConfig:
    """The periodic-growth baseline.

    Attributes:
        every: Germinate after every ``every``-th epoch (epochs ``every - 1``, ``2 * every - 1``,
            ...) into the first DORMANT slot, with the SAFE blueprint of lowest risk that fits it.
    """

    every: int = 5

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be >= 1 (epochs between germinations), got {self.every}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduledGermination:
    """One germination of a fixed schedule (policy ``scheduled``).

    Attributes:
        epoch: Epoch after which the germinate command is issued (0-based).
        slot: Slot id (a ``ModelSpec`` slot's module name, or ``slot<i>`` of a built-in host).
        blueprint: Blueprint id; one of the run's ``blueprints``.
    """

    epoch: int
    slot: str
    blueprint: str

    def __post_init__(self) -> None:
        if self.epoch < 0:
            raise ValueError(f"a scheduled germination's epoch must be >= 0, got {self.epoch}")
        if not self.slot or not self.blueprint:
            raise ValueError(
                f"a scheduled germination needs a slot and a blueprint, got {self.slot!r}, {self.blueprint!r}"
            )


@dataclass(kw_only=True, slots=True)
class TamiyoConfig:
    """Everything ``TamiyoService`` needs to know.

    Attributes:
        policy: Who decides (see ``POLICIES``). The default is the heuristic until a shipped
            policy is measured at least as good as the rule on models it never saw (``esper
            bench transfer`` and the built-in width recipes, docs/zoo.md); ``zoo-1`` is not yet
            (``baselines/zoo/shipped-zoo-1-vs-heuristic``). With ``heuristic`` the GNN still runs
            each epoch and its action probabilities are recorded next to the heuristic's command.
        shipped: With ``policy="shipped"``, the name of the shipped policy to serve
            (``esper policy list``); its weights are checked against the digest pinned in
            ``esper_core.tamiyo.shipped.SHIPPED`` and published to the registry at first use.
        explore: With ``policy="gnn"``, sample actions from the policy's distribution instead of
            taking the most likely one (Simic's on-policy rollouts). Sampling is seeded by run
            and epoch, so a retried decision is the same decision.
        policy_version: With ``policy="gnn"``, the Simic policy version to serve; None serves
            the newest in the registry, checked between epochs (hot swap).
        gnn: Size of the policy network (used when the service builds its own model).
        heuristic: Thresholds of the rule-based policy.
        random: The random-germination baseline's settings.
        periodic: The periodic-growth baseline's settings.
        schedule: The germinations of policy ``scheduled``, at distinct epochs (one command an
            epoch); the run's configuration checks their slots and blueprints.
        risk: Thresholds of the risk engine every proposal passes through.
        breaker: When repeated failures stop Tamiyo from being asked at all.
        compile: How the GNN policy is compiled.
        device: Torch device the policy runs on, e.g. ``"cpu"`` or ``"cuda:0"``.
    """

    policy: str = "heuristic"
    shipped: str = DEFAULT_SHIPPED
    explore: bool = False
    policy_version: int | None = None
    gnn: TamiyoGNNConfig = field(default_factory=TamiyoGNNConfig)
    heuristic: HeuristicConfig = field(default_factory=HeuristicConfig)
    random: RandomPolicyConfig = field(default_factory=RandomPolicyConfig)
    periodic: PeriodicPolicyConfig = field(default_factory=PeriodicPolicyConfig)
    schedule: tuple[ScheduledGermination, ...] = ()
    risk: RiskConfig = field(default_factory=RiskConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    compile: PolicyCompileConfig = field(default_factory=PolicyCompileConfig)
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        check_name(self.shipped)
        if self.policy_version is not None and self.policy_version < 1:
            raise ValueError(
                f"policy_version must be >= 1 (Simic numbers versions from 1) or None, got {self.policy_version}"
            )
        self.schedule = tuple(self.schedule)
        if self.policy == "scheduled" and not self.schedule:
            raise ValueError("policy 'scheduled' needs TamiyoConfig.schedule; for no growth at all use policy='none'")
        if self.schedule and self.policy != "scheduled":
            raise ValueError(f"a schedule is followed only by policy='scheduled', got policy {self.policy!r}")
        epochs = [g.epoch for g in self.schedule]
        if len(set(epochs)) != len(epochs):
            raise ValueError(
                f"scheduled germinations share an epoch ({sorted(epochs)}): Tamiyo issues one command an "
                "epoch; move one to a later epoch"
            )
        if 0 < self.heuristic.grow_from >= self.risk.grow_until:
            raise ValueError(
                f"heuristic.grow_from={self.heuristic.grow_from:g} opens growth at or after risk.grow_until="
                f"{self.risk.grow_until:g} closes it, so the rule would never germinate: lower grow_from, or raise "
                "grow_until (esper run --grow-until)"
            )
        if self.explore and self.policy != "gnn":
            raise ValueError(f"explore=True samples the GNN's actions: it needs policy='gnn', got {self.policy!r}")
        try:
            device = torch.device(self.device)
        except RuntimeError as e:
            raise ValueError(f"device {self.device!r} is not a torch device: use 'cpu' or 'cuda[:index]'") from e
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"device {self.device!r} was requested but CUDA is not available here: "
                "set device='cpu' or run on a machine with a CUDA build of torch and a GPU"
            )

    @property
    def compiles(self) -> bool:
        """Whether the service compiles its policy (only when the GNN decides with ``gnn``).

        The shipped policy, every run's default, is served eagerly: a run makes tens of ~1 ms
        decisions, which a 16-40 s background compile does not repay, and an eager forward is the
        same computation on a busy machine as on an idle one (whether the compile had finished
        can never change a decision)."""
        return self.compile.enabled and self.policy == "gnn"


PINNED_POLICIES = ("shipped", "heuristic", "gnn", "none")
"""What a run may be pinned to by name (``esper run --policy``), besides a shipped policy's name;
``random``, ``periodic`` and ``scheduled`` need settings a name cannot carry."""


GNN_VERSION_PREFIX = "gnn:"
"""``gnn:<N>`` pins a run to Simic version N of this registry (``TamiyoConfig.policy_version``):
what ``esper policy tune`` publishes, or any version ``esper registry`` lists."""


def pinnable_policies() -> tuple[str, ...]:
    """``PINNED_POLICIES`` and every shipped policy's name (and ``gnn:<N>`` for any version N)."""
    return (*PINNED_POLICIES, *sorted(SHIPPED))


def pinned_version(choice: str) -> int | None:
    """The version N of a ``gnn:<N>`` choice, None for any other name.

    Raises:
        ValueError: ``gnn:`` followed by anything but a version number >= 1.
    """
    if not choice.startswith(GNN_VERSION_PREFIX):
        return None
    number = choice.removeprefix(GNN_VERSION_PREFIX)
    if re.fullmatch(r"[1-9][0-9]*", number) is None:
        raise ValueError(f"policy {choice!r}: write gnn:<N> with a Simic version N >= 1, e.g. gnn:3")
    return int(number)


def check_pinnable(choice: str) -> None:
    """Refuse what a run cannot be pinned to, naming what it can.

    Raises:
        ValueError: ``choice`` is neither in ``pinnable_policies()`` nor ``gnn:<N>``.
    """
    if pinned_version(choice) is None and choice not in pinnable_policies():
        raise ValueError(f"policy must be one of {pinnable_policies()} or gnn:<N> (Simic version N), got {choice!r}")


def with_policy(tamiyo: TamiyoConfig, choice: str) -> TamiyoConfig:
    """``tamiyo`` deciding by ``choice`` (``check_pinnable``), its schedule dropped; ``gnn:<N>``
    serves version N.

    Raises:
        ValueError: ``choice`` is not pinnable (the message lists what is).
    """
    check_pinnable(choice)
    if (version := pinned_version(choice)) is not None:
        return dataclasses.replace(tamiyo, policy="gnn", policy_version=version, schedule=())
    # Any other choice drops a version the recipe pinned: `gnn` means the newest.
    if choice in SHIPPED:
        return dataclasses.replace(tamiyo, policy="shipped", shipped=choice, schedule=(), policy_version=None)
    if choice == "shipped":
        return dataclasses.replace(tamiyo, policy="shipped", shipped=DEFAULT_SHIPPED, schedule=(), policy_version=None)
    return dataclasses.replace(tamiyo, policy=choice, schedule=(), policy_version=None)


def policy_record(tamiyo: TamiyoConfig, *, served: str | None) -> dict[str, Any]:
    """Who decides a run, as ``run.json`` and the summary record it: the policy, the heuristic's
    thresholds and the risk engine's (``check_same_controller`` compares them on a resume).

    Args:
        tamiyo: The run's Tamiyo configuration.
        served: The label of the weights the GNN served (``TamiyoService.policy_version``);
            None before the run (``run.json``) or when none were.
    """
    record: dict[str, Any] = {"policy": tamiyo.policy, "served": served}
    # The heuristic's thresholds, whatever the policy: their defaults change between versions
    # (``HeuristicConfig``), and they also set the GNN's blend length, a shipped policy's
    # fallback and the lifecycle steps of scheduled, random and periodic runs.
    record["heuristic"] = dataclasses.asdict(tamiyo.heuristic)
    # The risk engine's thresholds, which veto or downgrade every policy's proposals (its
    # ``grow_until`` among them: a run's own, ``esper run --grow-until``, or the recipe's).
    record["risk"] = dataclasses.asdict(tamiyo.risk)
    if tamiyo.policy == "shipped":
        record |= {"name": tamiyo.shipped, "sha256": SHIPPED[tamiyo.shipped]}
    elif tamiyo.policy == "gnn":
        record["pinned_version"] = tamiyo.policy_version
    return record
