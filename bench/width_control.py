"""width_control: a grown network against the static network of its own *shape*.

The study is ``esper_core.studies.width_control`` (what it trains and pairs); this entry point
parses the command line and calls it.

    OMP_NUM_THREADS=1 python -m bench.width_control --recipe mnist1d-mlp-width --widths fc1=64 \
        --growth baselines/growth/width-learned-mlp/growth.json --arm gnn [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench._output import save_json
from esper_core.studies.width_control import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--widths", nargs="+", required=True, metavar="LAYER=UNITS")
    parser.add_argument("--growth", type=Path, required=True, help="a growth benchmark's growth.json")
    parser.add_argument("--arm", default="gnn", help="the arm to pair with (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    widths = {k: int(v) for k, v in (w.split("=", 1) for w in args.widths)}
    torch.set_num_threads(1)
    out = run(args.recipe, widths, json.loads(args.growth.read_text()), args.arm)
    d = out["arm_minus_static_shape"]
    print(
        f"{args.recipe} {args.arm} ({out['arm_params_mean']:.0f} params) {out['arm_test_accuracy_mean']:.2f} % vs "
        f"static at {widths} ({out['static_shape']['params']} params) {out['static_shape']['test_accuracy_mean']:.2f} %: "
        f"{d['mean']:+.2f} [{d['ci95_low']:+.2f}, {d['ci95_high']:+.2f}] over {d['n']} seeds"
    )
    save_json(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
