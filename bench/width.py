"""Width growth against the static frontier, the three initialisations side by side.

The study is ``esper_core.studies.width`` (its arms, how a grown arm is grown, what is reported);
this entry point parses the command line and calls it.

Run: ``OMP_NUM_THREADS=1 python -m bench.width --seeds 20 --json out.json``.
"""

from __future__ import annotations

import argparse
import json

from esper_core.kasmina.width import WIDTH_INITS
from esper_core.run.recipes import load_recipe
from esper_core.studies.width import combine, run_arms, summarise, widenable_layers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="mnist1d-cnn")
    parser.add_argument(
        "--layers", nargs="+", default=None, help="layers to widen (default: every hidden weight layer)"
    )
    parser.add_argument("--factor", type=float, default=1.5)
    parser.add_argument("--grow-at", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument(
        "--side-epochs", type=int, default=1, help="epochs the new units train as side modules before the merge"
    )
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=5000)
    parser.add_argument("--inits", nargs="+", default=list(WIDTH_INITS), choices=WIDTH_INITS)
    parser.add_argument("--json", default=None, help="write config, summary and every run here")
    parser.add_argument(
        "--combine",
        nargs="+",
        default=None,
        metavar="JSON",
        help="instead of running: pool the runs of several --json outputs (disjoint seeds, e.g. two processes) into --json",
    )
    args = parser.parse_args(argv)
    if args.combine:
        combine(args.combine, args.json)
        return
    recipe = load_recipe(args.recipe)
    epochs = args.epochs or recipe.epochs
    host = recipe.host.build()
    sample_shape = tuple(recipe.data.load().train[0][0].shape)
    layers = args.layers or widenable_layers(host, sample_shape)
    arms = ["static-x1", f"static-x{args.factor:g}", *(f"grown-{i}" for i in args.inits)]
    results = run_arms(
        recipe,
        arms,
        range(args.first_seed, args.first_seed + args.seeds),
        factor=args.factor,
        grow_at=args.grow_at,
        epochs=epochs,
        layers=layers,
        side_epochs=args.side_epochs,
    )
    summary = summarise(results, arms, args.factor)
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"config": vars(args) | {"layers": layers, "epochs": epochs}, "summary": summary, "runs": results},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
