"""zoo_policy: Simic trains one policy over zoo members; times it and projects a full zoo training.

Runs ``esper_core.studies.zoo_train.train_zoo_policy`` (the heuristic's demonstrations on the
training seeds, imitation, PPO iterations on the GNN's rollouts, every version scored on the
selection seeds, evaluation seeds never run) in a fresh registry, on one torch thread (or
``--workers`` Dask workers of one thread each), and reports seconds per episode by family,
seconds per policy update, each version's selection score against the heuristic and no growth,
and what the default ``ZooTraining`` (the size a shipped policy would be trained at) would take
on 2 cores at the measured speeds.

    python -m bench.zoo_policy --families mlp,cnn1d --members 6 --demonstrations 1 --iterations 2 \\
        --rollouts 1 --selection-seeds 2000,2001 --json baselines/zoo/policy-small-cpu-1thread.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import torch

from bench._output import save_json
from esper_core._capabilities import one_thread
from esper_core.fanout import FanOut
from esper_core.settings import EsperSettings
from esper_core.studies.policy_files import save_policy_version
from esper_core.studies.zoo_train import ZooSeeds, ZooTraining, ZooTrainingResult, train_zoo_policy
from esper_core.zoo import FAMILIES, Family, ZooSpec
from esper_core.zoo.spec import SEED_KINDS, SeedKindName

_EPISODE_BASELINE = Path(__file__).resolve().parent.parent / "baselines" / "zoo" / "episodes-cpu-1thread.json"


def _seeds(text: str) -> tuple[int, ...]:
    """``1000-1009`` or ``2000,2001``."""
    if "-" in text:
        first, last = (int(x) for x in text.split("-"))
        return tuple(range(first, last + 1))
    return tuple(int(x) for x in text.split(","))


def _families(text: str) -> tuple[Family, ...]:
    names = tuple(x for x in text.split(",") if x)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; choose from {FAMILIES}")
    return cast(tuple[Family, ...], names)


def _kinds(text: str) -> tuple[SeedKindName, ...]:
    names = tuple(x for x in text.split(",") if x)
    unknown = [n for n in names if n not in SEED_KINDS]
    if unknown:
        raise SystemExit(f"unknown seed kinds {unknown}; choose from {SEED_KINDS}")
    return cast(tuple[SeedKindName, ...], names)


def _commit() -> str:
    """The checkout's commit, ``+dirty`` when files differ from it (the provenance of saved weights)."""
    here = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, check=True)
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _config(args: argparse.Namespace) -> ZooTraining:
    base = ZooTraining()
    plan = dataclasses.replace(
        base.plan, demonstrations=args.demonstrations, iterations=args.iterations, rollouts=args.rollouts
    )
    return ZooTraining(
        zoo=ZooSpec(seed=args.zoo_seed, families=_families(args.families), kinds=_kinds(args.kinds)),
        members=args.members,
        exclude_families=_families(args.exclude),
        seeds=ZooSeeds(
            train=_seeds(args.train_seeds), selection=_seeds(args.selection_seeds), evaluation=base.seeds.evaluation
        ),
        plan=plan,
    )


def projection(result: ZooTrainingResult, config: ZooTraining, *, cores: int = 2) -> dict[str, Any]:
    """Hours the default ``ZooTraining`` would take on ``cores`` workers at this run's speeds.

    Episodes: the default's count per member times its members, each at the mean seconds of
    an episode of its family (measured here; the other families at ``bench.zoo``'s heuristic
    medians, scaled by this run's GNN-to-heuristic cost), spread over ``cores`` workers. Updates
    run on one core between phases, scaled from this run's by the decisions they learn from
    (members x episodes).
    """
    target = ZooTraining()
    by_family = per_family_seconds(result)
    measured = {f: s["mean_s"] for f, s in by_family.items()}
    reference = _reference_seconds()
    scale = statistics.fmean(measured[f] / reference[f] for f in measured if f in reference) if reference else 1.0
    episode_s = {f: measured.get(f, reference.get(f, 0.0) * scale) for f in target.zoo.families}
    p, tp = config.plan, target.plan
    # Per member: demonstrations, rollouts, and on each selection seed no growth, the heuristic
    # and every version (imitation's and each iteration's).
    per_member = tp.demonstrations + tp.iterations * tp.rollouts + len(target.seeds.selection) * (tp.iterations + 3)
    episodes = per_member * target.members
    mean_episode_s = statistics.fmean(episode_s.values())
    imitation_s = result.update_s[0] * (tp.demonstrations * target.members) / (p.demonstrations * config.members)
    ppo_each = statistics.fmean(result.update_s[1:]) if len(result.update_s) > 1 else 0.0
    ppo_s = (
        ppo_each
        * ((tp.rollouts + tp.demonstrations) * target.members)
        / ((p.rollouts + p.demonstrations) * config.members)
        * tp.iterations
    )
    total_s = episodes * mean_episode_s / cores + imitation_s + ppo_s
    return {
        "target": {
            "members": target.members,
            "families": list(target.zoo.families),
            "demonstrations": tp.demonstrations,
            "iterations": tp.iterations,
            "rollouts": tp.rollouts,
            "selection_seeds": len(target.seeds.selection),
        },
        "cores": cores,
        "episodes": episodes,
        "episode_s_by_family": {f: round(s, 3) for f, s in episode_s.items()},
        "gnn_scale_vs_bench_zoo": round(scale, 3),
        "episodes_h": round(episodes * mean_episode_s / cores / 3600, 3),
        "updates_h": round((imitation_s + ppo_s) / 3600, 3),
        "total_h": round(total_s / 3600, 3),
        # What the issue's 2-hour budget buys at these speeds: episodes of the drawn families' mix.
        "episodes_in_2h": int(2 * 3600 * cores / mean_episode_s),
    }


def per_family_seconds(result: ZooTrainingResult) -> dict[str, dict[str, float]]:
    """Seconds per episode by family (every phase, every policy) and by policy within it."""
    family = result.members
    times: dict[str, list[float]] = {}
    by_policy: dict[tuple[str, str], list[float]] = {}
    for episodes in result.episodes.values():
        for r in episodes:
            times.setdefault(family[r.recipe], []).append(r.wall_s)
            by_policy.setdefault((family[r.recipe], r.policy), []).append(r.wall_s)
    return {
        f: {
            "episodes": len(t),
            "mean_s": round(statistics.fmean(t), 3),
            "median_s": round(statistics.median(t), 3),
            "max_s": round(max(t), 3),
        }
        | {f"mean_s_{policy}": round(statistics.fmean(v), 3) for (g, policy), v in sorted(by_policy.items()) if g == f}
        for f, t in sorted(times.items())
    }


def _reference_seconds() -> dict[str, float]:
    """``bench.zoo``'s median heuristic episode seconds per family (empty without its baseline)."""
    if not _EPISODE_BASELINE.exists():
        return {}
    data = json.loads(_EPISODE_BASELINE.read_text())
    return {f: float(s["median_episode_s"]) for f, s in data["per_family"].items()}


def _plan(config: ZooTraining) -> dict[str, int]:
    return {
        "demonstrations": config.plan.demonstrations,
        "iterations": config.plan.iterations,
        "rollouts": config.plan.rollouts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo-seed", type=int, default=0)
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated families to draw from")
    parser.add_argument("--exclude", default="", help="comma-separated families to leave out")
    parser.add_argument("--members", type=int, default=ZooTraining().members)
    parser.add_argument("--demonstrations", type=int, default=1, help="heuristic episodes per member")
    parser.add_argument("--iterations", type=int, default=1, help="PPO iterations")
    parser.add_argument("--rollouts", type=int, default=1, help="GNN episodes per member per iteration")
    parser.add_argument("--train-seeds", default="1000-1009")
    parser.add_argument("--selection-seeds", default="2000,2001")
    parser.add_argument("--workers", type=int, default=0, help="Dask workers (0: here, one thread)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    parser.add_argument(
        "--save", type=Path, default=None, help="write the chosen version here (weights.pt and policy.json)"
    )
    parser.add_argument(
        "--kinds",
        default="width",
        help="comma-separated seed kinds the members offer (width, branch, depth, stream; stream with depth at most)",
    )
    args = parser.parse_args()
    config = _config(args)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="esper-zoo-policy-") as home, one_thread():
        os.environ["ESPER_HOME"] = home  # the data caches read it: build each member's data afresh
        settings = EsperSettings(home=Path(home))
        start = time.perf_counter()
        with FanOut(workers=args.workers).open() as pool:
            result = train_zoo_policy(settings, config, pool=pool)
        wall_s = time.perf_counter() - start
        scores = [dataclasses.asdict(s) for s in result.scores]
        if args.save is not None:
            # The chosen version was chosen on the selection seeds only; its scores there (and the
            # yardsticks') travel with it, never an evaluation result.
            save_policy_version(
                settings,
                result.chosen,
                args.save,
                extra={
                    "command": "python -m bench.zoo_policy " + " ".join(sys.argv[1:]),
                    "commit": _commit(),
                    "chosen_label": f"v{result.chosen}",
                    "selection": scores,
                    "members": result.members,
                    "zoo": dataclasses.asdict(config.zoo),
                    "plan": _plan(config),
                    "seeds": dataclasses.asdict(config.seeds),
                    "flops_penalty": config.plan.simic.flops_penalty,
                    "wall_s": round(wall_s, 2),
                },
            )
    out = {
        "bench": "zoo_policy",
        "command": "python -m bench.zoo_policy " + " ".join(sys.argv[1:]),
        "torch_threads": 1,
        "workers": args.workers,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_1m": {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2)},
        "flops_penalty": config.plan.simic.flops_penalty,
        "seeds": dataclasses.asdict(config.seeds) | {"evaluation": "reserved, never run"},
        "zoo": dataclasses.asdict(config.zoo),
        "exclude_families": list(config.exclude_families),
        "plan": _plan(config),
        "members": result.members,
        "versions": result.versions,
        "chosen": result.chosen,
        "selection": scores,
        "episode_s_by_family": per_family_seconds(result),
        "update_s": [round(s, 3) for s in result.update_s],
        "phase_s": {k: round(v, 2) for k, v in result.phase_s.items()},
        "wall_s": round(wall_s, 2),
        # A PPO iteration: its rollouts, its update, and the scoring of the version it publishes.
        "s_per_iteration": round(
            (
                result.phase_s.get("rollouts", 0.0)
                + sum(result.update_s[1:])
                + result.phase_s.get("scoring", 0.0) * config.plan.iterations / (config.plan.iterations + 1)
            )
            / max(config.plan.iterations, 1),
            2,
        ),
        "projection_default_zoo_training": projection(result, config),
    }
    for s in scores:
        print(
            f"{s['label']:<10} score {s['score']:.4f}  val acc {s['val_accuracy']:.4f}  FLOPs x{s['flops_ratio']:.3f}"
            + (f"  halted {s['halted']}" if s["halted"] else "")
        )
    text = save_json(out, args.json)
    print(text if args.json is None else f"written to {args.json}")


if __name__ == "__main__":
    main()
