"""Compose a run's trainer from its configuration: data, host (built-in or the user's), seeds."""

from __future__ import annotations

from pathlib import Path

from esper_core._capabilities import initialise_pytorch_defaults, resolve_device
from esper_core.data import Dataset, load_dataset
from esper_core.determinism import seed_everything
from esper_core.hosts import Host, HostConfig, build_host_from_config
from esper_core.karn.catalog import KarnCatalog
from esper_core.kasmina.graft import GrowableModel
from esper_core.kasmina.manager import SeedManager
from esper_core.run.config import RunConfig
from esper_core.run.task import vary_dataset
from esper_core.tamiyo.config import GNN_POLICIES
from esper_core.tolaria.collective import Collective
from esper_core.tolaria.loop import Trainer
from esper_core.tolaria.slotgrads import GROWTH_SIGNALS
from esper_core.tolaria.step import DecisionCache


def build_host(config: RunConfig, *, feature_shape: tuple[int, ...], num_classes: int | None) -> Host:
    """The run's host with its seed slots: a built-in host, or the user's model with slots grafted on.

    Raises:
        ValueError: a built-in host without a class count, or slots the user's model cannot take.
    """
    if isinstance(config.host, HostConfig):
        if num_classes is None:
            raise ValueError("a built-in host needs the data set's number of classes")
        return build_host_from_config(config.host, feature_shape=feature_shape, num_classes=num_classes)
    spec = config.host
    return GrowableModel(
        spec.build(),
        slots=spec.slots,
        widen=spec.widen,
        deepen=spec.deepen,
        widen_stream=spec.widen_stream,
        sample_shape=feature_shape,
        batch_max=spec.batch_max,
        input_dtype=spec.input_dtype,
        causal=spec.causal,
    )


def growth_signals(config: RunConfig, *, recorded: bool) -> frozenset[str]:
    """The growth signals (``slotgrads.GROWTH_SIGNALS``) someone reads in a run of ``config``.

    The GNN reads them when it decides; Simic reads them from the packets of every decision
    recorded for it (a run whose registry has a database), whatever policy decided, so that the
    GNN it trains sees at serving time the inputs it was trained on. A run read by neither (the
    heuristic, scheduled, random, periodic or no policy, without recording) measures none.

    Args:
        config: The run's configuration (its ``tamiyo.policy`` decides).
        recorded: Whether the run's decisions are recorded for Simic.
    """
    return frozenset(GROWTH_SIGNALS) if recorded or config.tamiyo.policy in GNN_POLICIES else frozenset()


def load_run_data(config: RunConfig) -> Dataset:
    """The run's data: the recipe's, with the training split varied by ``config.task`` if any.

    The one place a run's splits are loaded, so a varied task applies to bundled data and a
    user's ``DataSpec`` alike.
    """
    data = load_dataset(config.data)
    return data if config.task is None else vary_dataset(data, config.task)


def build_trainer(
    config: RunConfig,
    *,
    catalog: KarnCatalog,
    run_id: str,
    home: Path | None = None,
    data: Dataset | None = None,
    recorded: bool = True,
    collective: Collective | None = None,
) -> Trainer:
    """Seed every RNG, load the data, build the host with its slots and the trainer around it.

    Args:
        config: The run's configuration.
        catalog: Karn catalogue the seed manager checks blueprints against.
        run_id: Carried into every state packet.
        home: ESPER_HOME; the step engine remembers its compile decisions there. None: the
            engine measures afresh.
        data: The run's data, when already loaded (e.g. by the plan); default: loaded here.
        recorded: Whether the run's decisions are recorded for Simic (``growth_signals``).
        collective: The ranks of a data-parallel run (default: one process).
    """
    initialise_pytorch_defaults()
    seed_everything(config.seed)
    device = resolve_device(config.trainer.device)
    data = data or load_run_data(config)
    # Seeded again so the host's initialisation does not depend on what loading the data drew.
    seed_everything(config.seed)
    host = build_host(config, feature_shape=data.feature_shape, num_classes=data.num_classes)
    manager = SeedManager(host.slots(), catalog=catalog, config=config.kasmina)
    return Trainer(
        model=host,
        manager=manager,
        data=data,
        config=config.trainer,
        loss_fn=config.loss,
        batch_size=config.data.batch_size,
        data_seed=config.data.seed,
        device=device,
        run_id=run_id,
        workload=f"{config.recipe}:{type(host).__name__}{host.layer_widths}:b{config.data.batch_size}",
        decision_cache=None if home is None else DecisionCache(home / "step_decisions.json"),
        total_epochs=config.epochs,
        signals=growth_signals(config, recorded=recorded),
        collective=collective,
    )
