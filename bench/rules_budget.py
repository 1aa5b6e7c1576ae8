"""rules_budget: does the default rule's gap to the static network of its grown shape depend on the
run's length?

The same hosts (members of a zoo drawn under ``--eval-zoo-seed``, whose families tuple is
``--zoo-families``, so that the draw does not change with the budget) run the default rule
(``HeuristicConfig``'s) at each budget of ``--epochs``, paired per (member, seed) with the earlier
rule, no growth and the static networks of its grown shape (``esper_core.studies.rules.evaluate``;
nothing is searched or chosen here). A gap that comes from the seed lifecycle's fixed delay (an
isolated epoch, then blending) would shrink with longer runs.

    OMP_NUM_THREADS=1 python -m bench.rules_budget --epochs 4 12 --families mlp cnn1d \\
        --eval-members 3 --seeds 6 --workers 2 --json baselines/zoo/rules-budget.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from bench._output import save_json
from esper_core.fanout import FanOut
from esper_core.studies.growth import in_home
from esper_core.studies.rules import DEFAULT_RULE, RuleSearchConfig, evaluate
from esper_core.studies.zoo_train import ZooTraining
from esper_core.zoo import FAMILIES, ZooSpec


def run(
    epochs: list[int],
    *,
    families: tuple[str, ...],
    zoo_families: tuple[str, ...],
    eval_zoo_seed: int,
    eval_members: int,
    seeds: int,
    workers: int,
) -> dict[str, Any]:
    """Per budget, per family: each arm's summary and the paired differences."""
    out: dict[str, Any] = {"rule": DEFAULT_RULE.name, "families": list(families), "budgets": {}}
    start = time.perf_counter()
    with FanOut(workers=workers).open() as pool, in_home(None, prefix="esper-rules-budget-") as home:
        for budget in epochs:
            zoo = ZooSpec(epochs=(budget,), families=zoo_families)
            config = RuleSearchConfig(
                training=ZooTraining(zoo=zoo, members=len(zoo_families)),
                rules=(DEFAULT_RULE,),
                families=families,
                eval_zoo_seed=eval_zoo_seed,
                eval_members=eval_members,
                seeds=seeds,
                workers=workers,
            )
            out["budgets"][str(budget)] = evaluate(config, DEFAULT_RULE, pool=pool, home=home, progress=lambda *_: None)
    out["wall_s"] = round(time.perf_counter() - start, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, nargs="+", required=True, help="the budgets, in epochs")
    parser.add_argument("--families", nargs="+", choices=FAMILIES, required=True, help="families evaluated")
    parser.add_argument(
        "--zoo-families",
        nargs="+",
        choices=FAMILIES,
        default=["mlp", "cnn1d", "resnet"],
        help="the zoo's families, which fix the draw (default: %(default)s)",
    )
    parser.add_argument("--eval-zoo-seed", type=int, default=1)
    parser.add_argument("--eval-members", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if missing := sorted(set(args.families) - set(args.zoo_families)):
        parser.error(f"--families {missing} are not among --zoo-families {args.zoo_families}: add them there")
    out = run(
        args.epochs,
        families=tuple(args.families),
        zoo_families=tuple(args.zoo_families),
        eval_zoo_seed=args.eval_zoo_seed,
        eval_members=args.eval_members,
        seeds=args.seeds,
        workers=args.workers,
    )
    for budget, results in out["budgets"].items():
        for family, r in results.items():
            d = r["paired"]["rule_minus_tuned"]
            print(
                f"{budget:>3} epochs {family:<7} rule - tuned static {d['mean']:+.2f} "
                f"[{d['ci95_low']:+.2f}, {d['ci95_high']:+.2f}] over {r['pairs']} pairs"
            )
    save_json(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
