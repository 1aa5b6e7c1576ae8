"""Assemble a trainer (data, host, seed manager) from a run configuration."""

from __future__ import annotations

from pathlib import Path

from esper_core._capabilities import initialise_pytorch_defaults, resolve_device
from esper_core.data import load_dataset
from esper_core.determinism import seed_everything
from esper_core.hosts import build_host
from esper_core.karn.catalog import KarnCatalog
from esper_core.kasmina.manager import SeedManager
from esper_core.recipes import RunConfig
from esper_core.tolaria.loop import Trainer
from esper_core.tolaria.step import DecisionCache


def build_trainer(config: RunConfig, *, catalog: KarnCatalog, run_id: str, home: Path | None = None) -> Trainer:
    """Seed every RNG, load the data, build the host with its slots and the trainer around it.

    Args:
        config: The run's configuration.
        catalog: Karn catalogue the seed manager checks blueprints against.
        run_id: Carried into every state packet.
        home: ESPER_HOME; the step engine remembers its compile decisions there. None: the
            engine measures afresh.
    """
    initialise_pytorch_defaults()
    seed_everything(config.seed)
    device = resolve_device(config.trainer.device)
    data = load_dataset(config.data)
    host = build_host(config.host, feature_shape=data.feature_shape, num_classes=data.num_classes)
    manager = SeedManager(host.slots(), catalog=catalog, config=config.kasmina)
    return Trainer(
        model=host,
        manager=manager,
        data=data,
        config=config.trainer,
        batch_size=config.data.batch_size,
        data_seed=config.data.seed,
        device=device,
        run_id=run_id,
        workload=f"{config.recipe}:{type(host).__name__}{host.layer_widths}:b{config.data.batch_size}",
        decision_cache=None if home is None else DecisionCache(home / "step_decisions.json"),
    )
