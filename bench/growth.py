"""``esper bench growth``: the command-line entry point of the growth benchmark.

The benchmark itself (plans, arms, the Dask fan-out, the report) is ``esper_core.benchmarks.growth``,
which the ``benchmark_sweep`` flow runs too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from esper_core.benchmarks.growth import GrowthBenchConfig, Progress, run, save_baseline
from esper_core.benchmarks.growth_report import format_table


def cli(args: Any, *, progress: Progress | None = None) -> int:  # noqa: ANN401  (argparse.Namespace)
    """``esper bench growth``: print the table (``--json``: one JSON object)."""
    result = run(
        GrowthBenchConfig(
            recipes=tuple(args.recipes),
            plan=args.plan,
            seeds=args.seeds,
            epochs=args.epochs,
            widths=None if args.widths is None else tuple(args.widths),
            simic_plan=args.simic_plan,
            policy_version=args.policy_version,
            home=args.home,
            device=args.device,
            workers=args.workers,
            dask_address=args.dask_address,
        ),
        progress=progress,
    )
    if args.save_baseline is not None:
        save_baseline(result, Path(args.save_baseline))
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


__all__ = ["cli"]
