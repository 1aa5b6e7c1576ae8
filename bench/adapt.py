"""adapt: does a learned growth policy adapt to the task, and does adapting pay?

The study is ``esper_core.studies.adapt`` (what it runs and reports); this entry point parses the
command line and calls it.

    OMP_NUM_THREADS=1 python -m bench.adapt --recipe mnist1d-cnn-width --home H --policy-version 4 \\
        [--seeds 20] [--selection-seeds 4] [--json PATH]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench._output import save_json
from esper_core.studies.adapt import DEFAULT_TASKS, Task, run


def parse_task(text: str) -> Task:
    """``width=0.5``, ``train_fraction=0.5`` or both, comma-separated."""
    fields: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key not in ("width", "train_fraction") or not value:
            raise argparse.ArgumentTypeError(
                f"a task is width=F and/or train_fraction=F, comma-separated (e.g. width=0.5), got {text!r}"
            )
        fields[key] = float(value)
    task = Task(**fields)
    task.for_seed(0)  # EpisodeTask's own checks: a width > 0, a fraction in (0, 1]
    return task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", required=True, help="a recipe the policy was trained on, e.g. mnist1d-cnn-width")
    parser.add_argument("--home", type=Path, required=True, help="ESPER_HOME whose registry holds the policy")
    parser.add_argument("--policy-version", type=int, required=True)
    parser.add_argument("--seeds", type=int, default=20, help="held-out evaluation seeds 0 .. N-1")
    parser.add_argument("--selection-seeds", type=int, default=4, help="seeds the best fixed schedule is searched on")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default: the recipe's)")
    parser.add_argument(
        "--task",
        type=parse_task,
        action="append",
        dest="tasks",
        help="a task, e.g. width=0.5 or train_fraction=0.5 (repeat; default: width=0.5, width=2, train_fraction=0.5)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    if args.seeds < 2 or args.selection_seeds < 1:
        parser.error("--seeds must be >= 2 (a paired interval needs two) and --selection-seeds >= 1")
    if not (args.home / "registry.db").exists():
        parser.error(f"{args.home} holds no registry: pass the ESPER_HOME the policy was trained or stored in")
    result = run(
        args.recipe,
        home=args.home,
        policy_version=args.policy_version,
        seeds=args.seeds,
        selection_seeds=args.selection_seeds,
        tasks=tuple(args.tasks or DEFAULT_TASKS),
        epochs=args.epochs,
    )
    print(save_json(result, args.json))


if __name__ == "__main__":
    main()
