"""The run layer, and Esper's public API for growing your own model.

One place composes a run from the subsystems: ``config`` (what a run is), ``recipes`` (built-in
and import-path recipes), ``plan`` (shapes, slots and kernels), ``spec`` (a run resolved and
planned once, what the flow's tasks receive), ``build`` (data, host, seed manager, trainer),
``session`` (the committed steps a Prefect task retries exactly). This layer is one run only:
code that runs many runs (episodes, Simic's training, the growth benchmark) is in
``esper_core.studies``, above it.

Growing your own model takes a recipe function returning a ``RunConfig``::

    from esper_core.run import DataSpec, DataSplits, ModelSpec, RunConfig

    def recipe() -> RunConfig:
        return RunConfig(
            epochs=20,
            host=ModelSpec(build=MyNet, slots=("body.1", "head")),
            data=DataSpec(load=my_splits, batch_size=64),
        )

and ``esper run --recipe mypackage.mymodule:recipe`` (see ``examples/grow_your_own.py``).

Without Prefect (a notebook, a script), the same run is a ``Run``, stepped epoch by epoch::

    from esper_core.run import Run, RunSpec, finish_run, grow_epoch
    from esper_core.settings import EsperSettings

    run = Run.start(RunSpec(recipe="mnist1d-cnn-width", epochs=10, device="cpu"), settings=EsperSettings())
    for epoch in range(run.epoch, run.config.epochs):
        print(grow_epoch(run, epoch))  # train, commit, decide, apply, commit
    summary = finish_run(run)
    run.close()

``Run.resume(settings=..., run_id=...)`` reopens a run folder at its last commit. A run loads its
seeds' kernels from the registry and never compiles: ``esper run`` and the flow compile the
missing ones first, and so does ``publish_missing_kernels(settings, [spec.config()], device="cpu")``
before ``Run.start``.
"""

from typing import TYPE_CHECKING

from esper_core._lazy import lazy_exports

if TYPE_CHECKING:
    from esper_core.data import DataSpec, DataSplits
    from esper_core.kasmina.config import KasminaConfig
    from esper_core.run.config import ModelSpec, RunConfig
    from esper_core.run.kernels import publish_missing_kernels
    from esper_core.run.reports import finish_run
    from esper_core.run.session import Run
    from esper_core.run.spec import RunSpec
    from esper_core.run.steps import grow_epoch
    from esper_core.tamiyo.config import ScheduledGermination, TamiyoConfig
    from esper_core.tamiyo.heuristic import HeuristicConfig
    from esper_core.tolaria.checkpoint import CheckpointConfig
    from esper_core.tolaria.config import TrainerConfig
    from esper_core.tolaria.step import StepEngineConfig

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "esper_core.data": ("DataSpec", "DataSplits"),
        "esper_core.kasmina.config": ("KasminaConfig",),
        "esper_core.run.config": ("ModelSpec", "RunConfig"),
        "esper_core.run.kernels": ("publish_missing_kernels",),
        "esper_core.run.reports": ("finish_run",),
        "esper_core.run.session": ("Run",),
        "esper_core.run.spec": ("RunSpec",),
        "esper_core.run.steps": ("grow_epoch",),
        "esper_core.tamiyo.config": ("ScheduledGermination", "TamiyoConfig"),
        "esper_core.tamiyo.heuristic": ("HeuristicConfig",),
        "esper_core.tolaria.checkpoint": ("CheckpointConfig",),
        "esper_core.tolaria.config": ("TrainerConfig",),
        "esper_core.tolaria.step": ("StepEngineConfig",),
    },
)

__all__ = [
    "CheckpointConfig",
    "DataSpec",
    "DataSplits",
    "HeuristicConfig",
    "KasminaConfig",
    "ModelSpec",
    "Run",
    "RunConfig",
    "RunSpec",
    "StepEngineConfig",
    "ScheduledGermination",
    "TamiyoConfig",
    "TrainerConfig",
    "finish_run",
    "grow_epoch",
    "publish_missing_kernels",
]
