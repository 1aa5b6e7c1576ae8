"""chars-gpt: the static frontier (widths and depths) and one growth row, on paired seeds.

    OMP_NUM_THREADS=1 python -m bench.chars_frontier --seeds 3 --epochs 10 --out baselines/growth/chars-gpt

Every run is a whole episode (``run_episode``) of the ``chars-gpt`` recipe on the same seeds
(same initialisation and data order per seed): ``none`` (the recipe's 64-wide, 2-block model
alone), ``heuristic`` (Tamiyo's rules grow it), and static models at other widths and depths.
The score is bits per character on the held-out test files (lower is better); differences are
paired by seed with bootstrap 95 % intervals (``esper_core.studies.growth_report``, lower-is-better metric).
The growth benchmark's learned arm (a Simic-trained policy) is not run here: training it costs
hours of CPU on this workload.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from esper_core.run.recipes import CHARS_CONTEXT, chars_gpt_model
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import EpisodeResult, count_halted, episode_config, run_episode
from esper_core.studies.growth import compile_kernels, fresh_run_id, in_home
from esper_core.studies.growth_report import BITS_PER_CHAR, static_same_params
from esper_core.telemetry.paired import paired_difference

RECIPE = "chars-gpt"
WIDTHS = (0.5, 1.5)
"""Width factors of the static frontier besides the recipe's own (64 wide: 32 and 96)."""
DEPTHS = (3,)
"""Depths of the static frontier besides the recipe's own 2 blocks (at width 64)."""


def _static(seed: int, epochs: int, *, width: float = 1.0, depth: int = 2) -> Any:  # noqa: ANN401
    config = episode_config(RECIPE, seed=seed, policy="none", epochs=epochs)
    build = lambda: chars_gpt_model(width, width=64, depth=depth)  # noqa: E731
    config.host = dataclasses.replace(config.host, build=build)
    return config


def run(seeds: int, epochs: int, home: Path | None) -> dict[str, Any]:
    """Train every arm on ``seeds`` paired seeds; returns the runs and the paired differences."""
    arms: dict[str, list[EpisodeResult]] = {}
    with in_home(home, prefix="esper-chars-") as root:
        settings = EsperSettings(home=root)
        start = time.perf_counter()
        compile_kernels(settings, (RECIPE,), "cpu")
        for seed in range(seeds):
            configs = {
                "none": _static(seed, epochs),
                "heuristic": episode_config(RECIPE, seed=seed, policy="heuristic", epochs=epochs),
                **{f"static x{w:g}": _static(seed, epochs, width=w) for w in WIDTHS},
                **{f"static depth {d}": _static(seed, epochs, depth=d) for d in DEPTHS},
            }
            for arm, config in configs.items():
                run_id = fresh_run_id(settings, f"chars-{arm.replace(' ', '-')}-s{seed}")
                result = run_episode(config, settings=settings, run_id=run_id)
                arms.setdefault(arm, []).append(result)
                print(f"{arm} seed {seed}: {BITS_PER_CHAR.value(result):.4f} bits/char, "
                      f"{result.total_params} params, {result.wall_s:.0f} s", flush=True)  # fmt: skip
        wall_s = time.perf_counter() - start
    bits = {arm: [BITS_PER_CHAR.value(r) for r in runs] for arm, runs in arms.items()}
    width_frontier = [[arms[a][i] for a in ("static x0.5", "none", "static x1.5")] for i in range(seeds)]
    statics = [static_same_params(width_frontier[i], r.total_params, BITS_PER_CHAR)[0] for i, r in enumerate(arms["heuristic"])]  # fmt: skip
    paired = {
        "heuristic_minus_none": paired_difference(bits["heuristic"], bits["none"], higher_is_better=False),
        "heuristic_minus_static_same_params": paired_difference(bits["heuristic"], statics, higher_is_better=False),
    }
    return {
        "bench": "chars-frontier",
        "recipe": RECIPE,
        "context": CHARS_CONTEXT,
        "seeds": seeds,
        "epochs": epochs,
        "metric": "test bits per character (lower is better)",
        "wall_s": wall_s,
        "arms": {
            arm: {
                "bits_mean": sum(b) / len(b),
                "params_mean": sum(r.total_params for r in arms[arm]) / len(b),
                # Halted runs stay in their pairs, scored at their last commit (run_episode).
                "halted": count_halted(arms[arm]),
                "runs": [
                    {
                        "seed": r.seed,
                        "bits": x,
                        "params": r.total_params,
                        "wall_s": r.wall_s,
                        "commands": r.commands,
                        "halted": r.halted,
                    }
                    for r, x in zip(arms[arm], b, strict=True)
                ],
            }
            for arm, b in bits.items()
        },
        "paired": {name: d.as_dict() for name, d in paired.items()},
    }


def main() -> None:
    """Command line: run, print and optionally save the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write chars_frontier.json here")
    args = parser.parse_args()
    result = run(args.seeds, args.epochs, args.home)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "chars_frontier.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
