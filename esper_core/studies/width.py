"""The width study: width growth against the static frontier, the three initialisations side by side.

On a recipe's host (``mnist1d-cnn``: 8 channels), every arm trains with the recipe's optimizer
and schedule on the same seeds (paired: one data order and one test set per seed):

- ``static-x1`` and ``static-xF``: the host and the host at the target width, from scratch;
- ``grown-<init>``: the host trains at x1 until ``--grow-at``, then every widenable hidden layer
  gains ``(F - 1) x width`` units initialised by ``<init>`` (``random``, ``gradmax``, ``tiny``).
  The units train beside the host for ``--side-epochs`` (default 1) as side modules at alpha 1 (in their own Adam
  group: GradMax's zero fan-in learns only there, through the seed's ReLU with gradient 1 at 0),
  then merge (``merge_width_seed``: Adam's state carried over), and training goes on to the end
  at the target width. A grown arm starts from the x1 arm's weights, so it pairs tightly
  with ``static-x1``; against ``static-xF`` the pair shares only data, which spreads more.

TINY scales its units by a line search on the probe batches (its paper's step); the others keep
the function exactly (a zero factor). Training FLOPs per arm come from ``FlopCounterMode`` on
one forward at each width (x3 for forward and backward). The command is ``python -m bench.width``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from esper_core.contracts import SeedStage
from esper_core.kasmina.width import (
    WidthSeed,
    WidthSlot,
    graft_width_slot,
    init_width_seed_,
    merge_width_seed,
    trace_width_site,
    width_batches,
)
from esper_core.run.config import RunConfig
from esper_core.telemetry.paired import paired_difference
from esper_core.tolaria.flops import forward_flops

_LINE_SEARCH = (0.0, 0.0625, 0.125, 0.25, 0.5, 1.0)
"""Fan-out scales TINY's line search tries (fractions of its initial amplitude)."""


def _accuracy(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    right = total = 0
    with torch.inference_mode():
        for x, y in loader:
            right += int((model(x).argmax(1) == y).sum())
            total += len(y)
    model.train()
    return 100.0 * right / total


def _germinate(model: nn.Module, layers: list[str], factor: float, init: str, probe, sample_shape, opt):  # noqa: ANN001, ANN202
    """Attach a width seed to every layer, initialised by ``init``; returns (slot, seed) pairs."""
    grown = []
    # Every site is traced before any seed is attached: the dry forward runs on the bare host.
    sites = [trace_width_site(model, name, sample_shape) for name in layers]
    for site in sites:
        seed = WidthSeed(site, model, units=round(site.width * (factor - 1)))
        init_width_seed_(seed, init, width_batches(model, seed.site, probe, F.cross_entropy))
        if init == "tiny":
            _line_search(model, seed, probe)
        slot = WidthSlot(site=site, batch_max=1 << 20)
        graft_width_slot(model, slot)
        slot.seed, slot.stage, slot.alpha = seed, SeedStage.BLENDING, 1.0  # the seed hooks in
        opt.add_param_group({"params": list(seed.parameters())})
        grown.append((slot, seed))
    return grown


def _merge(model: nn.Module, grown, opt) -> None:  # noqa: ANN001
    for slot, seed in grown:
        slot.seed = None  # unhooks
        merge_width_seed(model, seed, opt)
    opt.param_groups[:] = [g for g in opt.param_groups if g["params"]]


def _line_search(model: nn.Module, seed: WidthSeed, probe) -> None:  # noqa: ANN001
    """Scale the seed's fan-out to the probe loss's minimum over ``_LINE_SEARCH`` (TINY's step)."""
    slot = WidthSlot(site=seed.site, batch_max=1 << 20)
    graft_width_slot(model, slot)
    slot.seed, slot.stage = seed, SeedStage.BLENDING
    base = seed.fan_out.detach().clone()
    losses = []
    with torch.no_grad():
        for scale in _LINE_SEARCH:
            slot.alpha = scale
            losses.append(sum(float(F.cross_entropy(model(x), y)) for x, y in probe))
        seed.fan_out.copy_(base * _LINE_SEARCH[losses.index(min(losses))])
    slot.seed = None


def run_arm(  # noqa: ANN201
    recipe,  # noqa: ANN001
    arm: str,
    seed: int,
    *,
    factor: float,
    grow_at: int,
    epochs: int,
    layers: list[str],
    side_epochs: int = 1,
) -> dict:
    splits = recipe.data.load()
    sample_shape = tuple(splits.train[0][0].shape)
    test = DataLoader(splits.test, batch_size=1000)
    torch.manual_seed(seed)
    start = factor if arm == f"static-x{factor:g}" else 1.0
    model = recipe.host.build_scaled(start) if start != 1.0 else recipe.host.build()
    g = torch.Generator().manual_seed(seed)
    train = DataLoader(splits.train, batch_size=recipe.data.batch_size, shuffle=True, generator=g)
    cfg = recipe.trainer
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    flops_per_sample = []
    began = time.perf_counter()
    for epoch in range(epochs):
        lr = cfg.lr * cfg.lr_factor(epoch, epochs)
        if arm.startswith("grown-") and epoch == grow_at:
            probe_gen = torch.Generator().manual_seed(seed)
            probe = [next(iter(DataLoader(splits.train, batch_size=500, shuffle=True, generator=probe_gen)))]
            grown = _germinate(model, layers, factor, arm.removeprefix("grown-"), probe, sample_shape, opt)
        if arm.startswith("grown-") and epoch == grow_at + side_epochs:
            _merge(model, grown, opt)
        for group in opt.param_groups:
            group["lr"] = lr
        # The side modules' FLOPs are counted too: the forward runs through their hooks.
        flops_per_sample.append(3 * forward_flops(model, torch.zeros(1, *sample_shape)) * len(splits.train))
        for x, y in train:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return {
        "test_acc": _accuracy(model, test),
        "params": sum(p.numel() for p in model.parameters()),
        "train_flops": sum(flops_per_sample),
        "wall_s": time.perf_counter() - began,
    }


def widenable_layers(host: nn.Module, sample_shape: tuple[int, ...]) -> list[str]:
    """Every hidden weight layer of ``host`` that can take new units (the default layers)."""
    return [
        n
        for n, m in host.named_modules()
        if isinstance(m, nn.Linear | nn.Conv1d | nn.Conv2d) and _widenable(host, n, sample_shape)
    ]


def run_arms(
    recipe: RunConfig,
    arms: list[str],
    seeds: range,
    *,
    factor: float,
    grow_at: int,
    epochs: int,
    layers: list[str],
    side_epochs: int = 1,
) -> dict[str, list[dict]]:
    """Every arm on every seed (``run_arm``), one line printed per run; the runs of each arm."""
    results: dict[str, list[dict]] = {a: [] for a in arms}
    for s in seeds:
        for arm in arms:
            r = run_arm(
                recipe,
                arm,
                s,
                factor=factor,
                grow_at=grow_at,
                epochs=epochs,
                layers=layers,
                side_epochs=side_epochs,
            )
            results[arm].append(r)
            print(
                f"seed {s} {arm:14s} acc {r['test_acc']:.2f} params {r['params']} flops {r['train_flops']:.3g} {r['wall_s']:.1f}s",
                flush=True,
            )
    return results


def combine(paths: list[str], out: str | None) -> None:
    """Pool the runs of several ``--json`` outputs (disjoint seeds) into ``out``, and print their summary."""
    parts = []
    for path in paths:
        with open(path) as f:
            parts.append(json.load(f))
    seeds = [
        s
        for part in parts
        for s in range(part["config"]["first_seed"], part["config"]["first_seed"] + part["config"]["seeds"])
    ]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--combine needs disjoint seeds; these files share some: {paths}")
    arms = [a for a in parts[0]["runs"] if all(a in p["runs"] for p in parts)]
    runs = {a: [r for p in parts for r in p["runs"][a]] for a in arms}
    factor = parts[0]["config"]["factor"]
    summary = summarise(runs, arms, factor)
    print(json.dumps(summary, indent=2))
    if out:
        config = parts[0]["config"] | {"seeds": len(seeds), "seed_list": seeds, "combined_from": len(parts)}
        with open(out, "w") as f:
            json.dump({"config": config, "summary": summary, "runs": runs}, f, indent=2)


def _widenable(model: nn.Module, name: str, sample_shape: tuple[int, ...]) -> bool:
    try:
        trace_width_site(model, name, sample_shape)
    except ValueError:  # the output layer, or one whose output cannot take new units
        return False
    return True


def summarise(results: dict[str, list[dict]], arms: list[str], factor: float) -> dict:
    """Each arm's means, and every grown arm's paired difference with both static arms."""
    mean: Callable[[list[float]], float] = lambda v: sum(v) / len(v)  # noqa: E731
    out: dict = {"arms": {}, "paired": {}}
    for arm in arms:
        rows = results[arm]
        out["arms"][arm] = {
            "test_acc_mean": mean([r["test_acc"] for r in rows]),
            "params": rows[0]["params"],
            "train_flops_mean": mean([r["train_flops"] for r in rows]),
            "wall_s_mean": mean([r["wall_s"] for r in rows]),
        }
    wide = f"static-x{factor:g}"
    for arm in arms:
        if not arm.startswith("grown-"):
            continue
        for ref in (wide, "static-x1"):
            d = paired_difference([r["test_acc"] for r in results[arm]], [r["test_acc"] for r in results[ref]])
            out["paired"][f"{arm} - {ref}"] = {
                "mean": d.mean,
                "ci95_low": d.ci95_low,
                "ci95_high": d.ci95_high,
                "n": d.n,
            }
    return out
