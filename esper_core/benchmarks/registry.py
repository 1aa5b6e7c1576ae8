"""The benchmark workloads and named sweeps that ``benchmark_sweep`` fans out over.

A workload is a function ``run(case) -> dict`` in the style of ``esper_core/benchmarks/training.py``: it times
Esper and the bare PyTorch equivalent in the same process and returns at least ``samples_ms``,
a mapping of series name to per-epoch latency samples. Series names:

- ``eager``: Esper with the step forced eager;
- ``chosen``: Esper on the path Tolaria chose (compiled, CUDA graphs or eager);
- ``bare``: the bare PyTorch loop; every other series is also reported as a ratio to it.

To add a workload, write ``esper_core/benchmarks/<name>.py`` with a ``run`` function (library code:
the ``bench-case`` task imports it, and tasks never import ``bench/``) and add a ``Workload`` to
``WORKLOADS`` below (or call ``register`` from your module): name it as DESIGN.md does
(``policy-graph``, ...) and list the active-seed counts it can time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from esper_core.benchmarks import training
from esper_core.benchmarks.common import BenchConfig

BASELINE_SERIES = "bare"
SERIES_ORDER = ("eager", "chosen", BASELINE_SERIES)


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchCase:
    """One cell of a sweep: a workload on a device with a number of active seeds."""

    workload: str
    device: str
    seeds: int = 0
    """Active seeds in the host while timing."""
    epochs: int = 50
    """Timed epochs per series."""
    warmup_batches: int = 20
    compile: str = "auto"
    """Step engine mode of the ``chosen`` series: ``auto`` (measure, then choose), ``on``, ``off``."""

    @property
    def key(self) -> str:
        """Stable file-name-safe id, e.g. ``seed-reference-cpu-s0``."""
        return f"{self.workload}-{self.device}-s{self.seeds}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """A benchmark the sweep can run."""

    name: str
    description: str
    run: Callable[[BenchCase], dict[str, Any]]
    """Times the case; returns ``{"samples_ms": {series: [ms, ...]}, ...headline numbers}``."""
    seed_counts: tuple[int, ...] = (0,)
    """Numbers of active seeds the workload can time."""
    devices: tuple[str, ...] = ("cpu", "cuda")


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepConfig:
    """A named sweep: which workloads, how long, and what counts as a regression."""

    name: str
    workloads: tuple[str, ...] | None = None
    """``None``: every registered workload."""
    epochs: int = 50
    warmup_batches: int = 20
    compile: str = "auto"
    """Step engine mode of the ``chosen`` series (``off`` skips the compile warm-up: smoke tests)."""
    max_regression: float = 0.25
    """Fail the sweep when a gated figure grows by more than this share over the previous sweep."""
    gated: tuple[str, ...] = ("p50_ms", "ratio_p50")
    """Figures that fail the sweep; p50 rather than p95 because p95 on shared machines is noise."""
    growth_plan: str | None = None
    """Also run the growth benchmark with this plan (``smoke``, ``default``), keep it under
    ``baselines/growth/<plan>`` and publish its frontier plot; None: timings only."""

    def __post_init__(self) -> None:
        if self.epochs < 5:
            raise ValueError(f"sweep {self.name}: epochs must be >= 5 for a p95 to mean anything, got {self.epochs}")
        if self.max_regression <= 0:
            raise ValueError(
                f"sweep {self.name}: max_regression must be > 0 (0.25 = 25 % slower), got {self.max_regression}"
            )


_TRAINING_SERIES = {"esper_eager": "eager", "esper_chosen": "chosen", "bare": BASELINE_SERIES}


def _training(case: BenchCase) -> dict[str, Any]:
    """A ``training.py`` recipe benchmark with the series renamed to the sweep's names."""
    config = BenchConfig(
        epochs=case.epochs,
        warmup_batches=case.warmup_batches,
        device=case.device,
        compile=case.compile,
        seeds=case.seeds,
    )
    result = training.run(case.workload, config)
    samples = {_TRAINING_SERIES.get(k, k): v for k, v in result["samples_ms"].items()}
    return {**{k: v for k, v in result.items() if k != "samples_ms"}, "samples_ms": samples}


WORKLOADS: dict[str, Workload] = {
    name: Workload(name=name, description=text, run=_training, seed_counts=(0, 1))
    for name, text in (
        ("seed-reference", "Linear 16->4, 16 samples, batch 4 (the seeds' Phase 0 workload)"),
        ("digits-mlp", "64-64 MLP on the bundled 8x8 digits, two seed slots"),
        ("digits-cnn", "16-32 channel CNN on the digits as 1x8x8 images, two seed slots"),
    )
}

SweepName = Literal["growth", "nightly", "smoke"]
"""The named sweeps, for the flow's ``sweep`` parameter (a test keeps it equal to ``SWEEPS``)."""

SWEEPS: dict[str, SweepConfig] = {
    "nightly": SweepConfig(name="nightly", epochs=100, warmup_batches=20),
    # The growth benchmark's default plan (8 paired seeds on the MNIST-1D CNN: ~9 minutes on 2
    # cores) after a short timing sweep; its frontier plot is published with the sweep's artifacts.
    "growth": SweepConfig(name="growth", workloads=("seed-reference",), growth_plan="default"),
    # Checks the sweep machinery end to end (tests, a new worker machine); 5 epochs are too
    # few for timings to mean anything, so nothing is gated.
    "smoke": SweepConfig(
        name="smoke", workloads=("seed-reference",), epochs=5, warmup_batches=0, compile="off", gated=()
    ),
}


def register(workload: Workload) -> None:
    """Add (or replace) a workload by name."""
    WORKLOADS[workload.name] = workload


def get_workload(name: str) -> Workload:
    """The workload ``name``.

    Raises:
        ValueError: For an unknown name (the message lists the known ones).
    """
    workload = WORKLOADS.get(name)
    if workload is None:
        raise ValueError(
            f"unknown workload {name!r}; registered in esper_core/benchmarks/registry.py: {sorted(WORKLOADS)}"
        )
    return workload


def get_sweep(name: str) -> SweepConfig:
    """The named sweep ``name``.

    Raises:
        ValueError: For an unknown name (the message lists the known ones).
    """
    config = SWEEPS.get(name)
    if config is None:
        raise ValueError(f"unknown sweep {name!r}; choose one of {sorted(SWEEPS)} (esper_core/benchmarks/registry.py)")
    return config


def devices_present() -> tuple[str, ...]:
    """``("cpu",)``, plus ``"cuda"`` when a CUDA device is present."""
    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


def plan_cases(
    config: SweepConfig, *, workloads: list[str] | None = None, devices: tuple[str, ...] | None = None
) -> list[BenchCase]:
    """Every (workload, device, seed count) the sweep times, in a stable order.

    Args:
        config: The named sweep.
        workloads: Narrow the sweep to these workloads (default: the sweep's own list).
        devices: Devices to time on (default: every device present).

    Returns:
        The cases; a workload that does not support a device present is skipped.

    Raises:
        ValueError: For an unknown workload, or when nothing is left to time.
    """
    names = list(workloads or config.workloads or WORKLOADS)
    present = devices if devices is not None else devices_present()
    cases = []
    for name in names:
        workload = get_workload(name)
        for device in present:
            if device not in workload.devices:
                continue
            for seeds in workload.seed_counts:
                cases.append(
                    BenchCase(
                        workload=name,
                        device=device,
                        seeds=seeds,
                        epochs=config.epochs,
                        warmup_batches=config.warmup_batches,
                        compile=config.compile,
                    )
                )
    if not cases:
        raise ValueError(f"sweep {config.name}: no case to time for workloads {names} on devices {list(present)}")
    return cases
