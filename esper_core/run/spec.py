"""A run planned once: the request and what its plan decided, handed from task to task.

``plan_spec`` resolves the recipe, loads its data and plans it (``plan_run``: the meta-host dry
forward, the kernels, their costs) once, and returns a ``PlannedRun``: its ``spec`` is the small
serialisable ``RunSpec`` (the request, its jobs and approvals), the rest (the resolved
configuration, the plan, the data) is not, since a user's recipe holds callables such as
``ModelSpec.build`` and the data its tensors. The morphogenesis flow hands the planned run
explicitly to the tasks that need it (Prefect passes a task's result in memory within a flow
run): the readiness check reads the spec's jobs, the compile builds them, the session starts
from the plan. A flow run executed again in another process plans again from its first task,
and a run started from a spec alone (a notebook, a data-parallel rank) resolves it itself
(``resolve``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import torch
from pydantic import Field

from esper_core._capabilities import DEVICE_CHOICES, resolve_device
from esper_core.data import Dataset
from esper_core.karn.catalog import KarnCatalog
from esper_core.karn.entries import default_catalog
from esper_core.pipeline import CompileJob
from esper_core.run.build import load_run_data
from esper_core.run.config import RunConfig
from esper_core.run.plan import RunPlan, plan_compile_jobs, plan_run, recipe_feature_shape
from esper_core.run.recipes import get_recipe
from esper_core.run.spec_file import SPEC_FILE, SPEC_VERSION, read_spec_file
from esper_core.tamiyo.config import check_pinnable, policy_record, with_policy
from esper_core.tezzeret.config import Backend

Epochs = Annotated[int, Field(ge=1, description="Epochs to train (at least 1)")]
"""An epoch count as a flow parameter: the bound is in the deployment's schema, so the server
refuses ``epochs=0`` before a flow run exists (``RunSpec`` checks the same)."""
Processes = Annotated[int, Field(ge=1, description="Data-parallel processes (at least 1)")]
"""A process count as a flow parameter (``RunSpec.nproc``)."""
Seed = Annotated[int, Field(ge=0, description="Random seed (0 or more)")]
"""A random seed as a flow parameter (``RunSpec.seed``): NumPy's generators take none below 0."""
MaxParams = Annotated[int, Field(ge=1, description="Most parameters the grown network may hold")]
"""A growth cap as a flow parameter (``RunSpec.max_params``)."""
MaxFlops = Annotated[int, Field(ge=1, description="Most forward FLOPs a sample the grown network may cost")]
"""A compute cap on growth as a flow parameter (``RunSpec.max_flops``)."""
GrowUntil = Annotated[
    float, Field(gt=0, le=1, description="Share of the run's epochs after which no seed germinates, in (0, 1]")
]
"""Growth that stops as a flow parameter (``RunSpec.grow_until``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    """One run as requested and planned: what the morphogenesis flow's tasks receive.

    Attributes:
        recipe: A built-in recipe or ``package.module:function``.
        epochs: Override of the recipe's epoch count (None: the recipe's).
        device: ``auto``, ``cpu`` or ``cuda``, as requested (each process resolves it); None:
            the recipe's own.
        seed: Override of the recipe's seed (None: the recipe's).
        run_id: The run to create or resume (None: named by whoever starts it).
        nproc: Data-parallel processes training the run.
        policy: Who decides, pinned for this run (``tamiyo.config.with_policy``): ``shipped``
            (the default shipped policy), a shipped policy's name (``esper policy list``),
            ``heuristic``, ``gnn`` (the registry's newest Simic version), ``gnn:<N>`` (version N,
            e.g. what ``esper policy tune`` published) or ``none``; None: the recipe's own.
        max_params: Cap on the network's parameters (``KasminaConfig.max_params``); None: the
            recipe's own.
        max_flops: Cap on the network's forward FLOPs a sample (``KasminaConfig.max_flops``);
            None: the recipe's own.
        grow_until: Share of the run's epochs after which no seed germinates
            (``RiskConfig.grow_until``, the risk rule ``growth_window``); None: the recipe's own.
        approved: The recipe's approved experimental / high-risk blueprints (what its compile
            approves, and what its session may germinate).
        jobs: Every (blueprint, slot profile) kernel the run may germinate, approved ones
            included: what the readiness check looks up and the compile builds.
    """

    recipe: str
    epochs: int | None = None
    device: str | None = "auto"
    seed: int | None = None
    run_id: str | None = None
    nproc: int = 1
    policy: str | None = None
    max_params: int | None = None
    max_flops: int | None = None
    grow_until: float | None = None
    approved: tuple[str, ...] = ()
    jobs: tuple[CompileJob, ...] = ()

    def __post_init__(self) -> None:
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs must be >= 1 (or None for the recipe's), got {self.epochs}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0 (or None for the recipe's), got {self.seed}")
        if self.device is not None and self.device not in DEVICE_CHOICES:
            raise ValueError(f"device must be one of {DEVICE_CHOICES} (or None for the recipe's), got {self.device!r}")
        if self.nproc < 1:
            raise ValueError(f"nproc must be >= 1 (processes training the run together), got {self.nproc}")
        if self.policy is not None:
            check_pinnable(self.policy)
        if self.max_params is not None and self.max_params < 1:
            raise ValueError(f"max_params must be a positive parameter count (or None), got {self.max_params}")
        if self.max_flops is not None and self.max_flops < 1:
            raise ValueError(f"max_flops must be a positive FLOP count a sample (or None), got {self.max_flops}")
        if self.grow_until is not None and not 0.0 < self.grow_until <= 1.0:
            raise ValueError(
                f"grow_until must be a share of the run's epochs in (0, 1] (or None for the recipe's), got "
                f"{self.grow_until}: e.g. 0.25 to germinate only in the first quarter, 1.0 for no limit"
            )

    @property
    def key(self) -> tuple[str, int | None, str | None, int | None, str | None, int | None, int | None, float | None]:
        """What decides the resolved configuration (run id and process count do not)."""
        return (
            self.recipe,
            self.epochs,
            self.device,
            self.seed,
            self.policy,
            self.max_params,
            self.max_flops,
            self.grow_until,
        )

    def config(self) -> RunConfig:
        """The recipe with this spec's overrides (``get_recipe``), resolved now.

        Raises:
            ValueError: an unknown or unloadable recipe, or a bad override.
        """
        config = get_recipe(self.recipe, epochs=self.epochs, device=self.device, seed=self.seed)
        if self.policy is not None:
            config.tamiyo = with_policy(config.tamiyo, self.policy)
        if self.max_params is not None:
            config.kasmina = dataclasses.replace(config.kasmina, max_params=self.max_params)
        if self.max_flops is not None:
            config.kasmina = dataclasses.replace(config.kasmina, max_flops=self.max_flops)
        if self.grow_until is not None:
            risk = dataclasses.replace(config.tamiyo.risk, grow_until=self.grow_until)
            config.tamiyo = dataclasses.replace(config.tamiyo, risk=risk)
        return config

    def save(self, run_dir: Path, *, config: RunConfig) -> None:
        """Record the request in ``run_dir/run.json``, from which the run resumes (``load``).

        Args:
            run_dir: The run's folder.
            config: This spec resolved (``config()``), whose Tamiyo configuration says who
                decides (``decides``, for a reader; a resume reads the request's own fields).

        The plan's outputs (``approved``, ``jobs``) are not kept: a resume plans again."""
        run_dir.mkdir(parents=True, exist_ok=True)
        fields = {"version": SPEC_VERSION, "run_id": run_dir.name, "recipe": self.recipe, "epochs": self.epochs}
        fields |= {"device": self.device, "seed": self.seed, "nproc": self.nproc}
        fields |= {"policy": self.policy, "max_params": self.max_params, "max_flops": self.max_flops}
        fields["grow_until"] = self.grow_until
        # Resolved, not read back: what `esper runs list` shows without loading the recipe.
        fields["total_epochs"] = config.epochs
        # Who decided, resolved: a run records the shipped policy's name and pinned digest (the
        # summary adds the registry version it was served as). Not read back: the fields above are.
        fields["decides"] = policy_record(config.tamiyo, served=None)
        (run_dir / SPEC_FILE).write_text(json.dumps(fields, indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> RunSpec:
        """The request a run was started with, from its ``run.json`` (either version).

        Raises:
            ValueError: no ``run.json`` there, a newer format, or fields a spec refuses.
        """
        saved = read_spec_file(run_dir)
        # The request's own fields (the plan's outputs are planned again). An older run.json lacks
        # the later ones: they keep the spec's defaults (the recipe's own).
        keys = [f.name for f in dataclasses.fields(cls) if f.name not in ("approved", "jobs")]
        return cls(**{k: saved[k] for k in keys if k in saved})


def check_same_controller(run_dir: Path, config: RunConfig) -> None:
    """Refuse to resume the run in ``run_dir`` with ``config`` (its saved request resolved now)
    if what decides it resolves differently from when it started: a default that changed between
    Esper versions (the heuristic's or the risk engine's thresholds, the recipe's policy, the
    shipped policy's digest) would otherwise switch a run's controller halfway, silently. A run
    whose ``run.json`` predates the record is not checked, nor is what it did not record.

    Raises:
        ValueError: the recorded and the resolved controller differ; the message names both.
    """
    recorded = read_spec_file(run_dir).get("decides")
    if not recorded:
        return
    now = json.loads(json.dumps(policy_record(config.tamiyo, served=None)))
    changed = sorted(k for k in recorded if k != "served" and not _same(recorded[k], now.get(k)))
    if changed:
        raise ValueError(
            f"run {run_dir.name} was decided by {_fields(recorded, changed)}, but its recipe now resolves to "
            f"{_fields(now, changed)} (Esper's defaults changed since it started): resume it with the Esper "
            "version that started it, or start a new run"
        )


def _same(recorded: object, now: object) -> bool:
    """Whether what a run recorded still holds: of a mapping (the heuristic's thresholds) only the
    keys it recorded are compared, so a field a later version adds with a default does not
    refuse every older run."""
    if isinstance(recorded, dict) and isinstance(now, dict):
        return all(now.get(k) == v for k, v in recorded.items())
    return recorded == now


def check_resume(run_dir: Path, planned: PlannedRun) -> None:
    """``check_same_controller`` before any work of a resume, for ``esper run --run-id``: the
    saved request resolved as the resume will (``planned``'s when it asks for the same, else the
    saved one's). A run not yet started is not checked."""
    if not (run_dir / SPEC_FILE).exists():
        return
    saved = RunSpec.load(run_dir)
    check_same_controller(run_dir, planned.config if planned.spec.key == saved.key else saved.config())


def _fields(record: dict[str, object], keys: Sequence[str]) -> str:
    return ", ".join(f"{k}={record.get(k)!r}" for k in keys)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannedRun:
    """A spec resolved and planned in this process: what ``Run.start`` builds the run from.

    Not serialisable (the configuration may hold a user's callables and the data its tensors):
    it goes from task to task of one flow run in memory, and a new process plans again.

    Attributes:
        spec: The request, with what its plan decided (``approved``, ``jobs``).
        config: The recipe with the spec's overrides (``get_recipe``).
        plan: Its plan (``plan_run``).
        data: Its data (``load_run_data``), from which the plan took its shapes.
    """

    spec: RunSpec
    config: RunConfig
    plan: RunPlan
    data: Dataset


def plan_spec(
    recipe: str,
    *,
    epochs: int | None = None,
    device: str = "auto",
    seed: int | None = None,
    run_id: str | None = None,
    nproc: int = 1,
    policy: str | None = None,
    max_params: int | None = None,
    max_flops: int | None = None,
    grow_until: float | None = None,
) -> PlannedRun:
    """Resolve ``recipe`` with its overrides, plan it, and check it for ``nproc`` processes.

    Args:
        recipe: A built-in recipe or ``package.module:function``.
        epochs: Override the recipe's epoch count.
        device: ``auto``, ``cpu`` or ``cuda``.
        seed: Override the recipe's seed.
        run_id: The run to create or resume.
        nproc: Data-parallel processes training the run together.
        policy: Pin who decides (``RunSpec.policy``).
        max_params: Cap the network's parameters (``RunSpec.max_params``).
        max_flops: Cap the network's forward FLOPs a sample (``RunSpec.max_flops``).
        grow_until: Stop germinating after this share of the run (``RunSpec.grow_until``).

    Returns:
        The planned run: its ``spec`` for every task, its configuration, plan and data for the
        session (``Run.start(planned.spec, planned=planned)``).

    Raises:
        ValueError: an unknown or unloadable recipe, a bad override, a slot the model cannot
            take, a blueprint that fits no slot (each message names the fix; see ``plan_run``),
            or a run ``nproc`` processes cannot share (``check_parallel``).
        ApprovalRequiredError: a listed non-safe blueprint the recipe does not approve.
    """
    spec = RunSpec(
        recipe=recipe,
        epochs=epochs,
        device=device,
        seed=seed,
        run_id=run_id,
        nproc=nproc,
        policy=policy,
        max_params=max_params,
        max_flops=max_flops,
        grow_until=grow_until,
    )
    planned = resolve(spec)
    if nproc != 1:
        check_parallel(planned.config, nproc, train_samples=len(planned.data.train))
    return planned


def resolve(spec: RunSpec, *, catalog: KarnCatalog | None = None) -> PlannedRun:
    """Resolve ``spec``'s recipe, load its data and plan it, now.

    Returns:
        The planned run; its ``spec`` is ``spec`` with the plan's approvals and jobs.

    Raises:
        ValueError, ApprovalRequiredError: as ``plan_spec``.
    """
    config = spec.config()
    data = load_run_data(config)
    plan = plan_run(config, catalog=catalog or default_catalog(), data=data, approved=config.approved_blueprints)
    planned_spec = dataclasses.replace(spec, approved=config.approved_blueprints, jobs=plan.jobs)
    return PlannedRun(spec=planned_spec, config=config, plan=plan, data=data)


def compile_jobs(
    recipe: str,
    *,
    blueprints: Sequence[str] | None = None,
    backend: Backend | str = Backend.EXPORT,
    approved: Collection[str] = (),
    catalog: KarnCatalog | None = None,
) -> list[CompileJob]:
    """The compile jobs of ``recipe`` (optionally narrowed to ``blueprints``), for the compile flow.

    The recipe is resolved and planned here: what the ``compile_catalog`` flow compiles when asked
    for a recipe. (A planned run's compile takes its ``spec.jobs`` instead of planning again.)

    Raises:
        ValueError, ApprovalRequiredError: as ``plan_run``.
    """
    config = get_recipe(recipe)
    if blueprints:
        config.blueprints = tuple(blueprints)
    return plan_compile_jobs(
        config,
        feature_shape=recipe_feature_shape(recipe),
        catalog=catalog or default_catalog(),
        backend=backend,
        approved=tuple(approved),
    )


def check_parallel(config: RunConfig, nproc: int, *, train_samples: int) -> None:
    """Refuse a run that ``nproc`` ranks cannot share, with what to change.

    Every rank must get at least one sample of every global batch (a rank with none would have no
    loss to differentiate), and on CUDA each rank needs a GPU of its own.

    Raises:
        ValueError: ``nproc`` < 1, or the batch, the last batch or the GPUs do not go round.
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1 (processes training the run together), got {nproc}")
    batch = config.data.batch_size
    if batch < nproc:
        raise ValueError(
            f"batch_size {batch} cannot be shared by {nproc} processes (each needs at least one sample of "
            f"every batch): use --nproc {batch} or fewer, or a recipe with a larger batch"
        )
    last = train_samples % batch
    if 0 < last < nproc:
        raise ValueError(
            f"the last batch of each epoch holds {last} of {train_samples} training samples, fewer than "
            f"--nproc {nproc} (each process needs at least one): use --nproc {last} or fewer, or a batch size "
            f"that leaves a last batch of 0 or at least {nproc}"
        )
    device = resolve_device(config.trainer.device)
    if device.type == "cuda" and torch.cuda.device_count() < nproc:
        raise ValueError(
            f"--nproc {nproc} on CUDA needs one GPU per process, but {torch.cuda.device_count()} are visible: "
            "use fewer processes, or --device cpu"
        )
