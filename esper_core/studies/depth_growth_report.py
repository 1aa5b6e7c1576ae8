"""The depth-growth benchmark's numbers, table and plot, from the runs ``esper_core.studies.depth_growth`` made.

Paired by seed (``summarise``): the training FLOPs each arm needed to reach the ``static-final``
network's final validation loss (linear between epochs; the saving is ``1 - flops / static-final's``),
and each arm's final loss against the ``static-final`` curve at the same FLOPs and against the static
frontier (``static_frontier``). Intervals are the paired bootstrap (BCa) of
``esper_core.telemetry.paired``; each arm counts its halted runs (``halted``). Results of other arms
on the same seeds, or of the same arms on more seeds, combine into one (``combine``: ``merge_results``,
``extend_seeds``); ``format_table`` and ``curves_png`` are the table and the plot.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from esper_core.studies.episodes import EpisodeResult
from esper_core.telemetry.baseline import save_result_with_plot
from esper_core.telemetry.paired import paired_difference
from esper_core.telemetry.plots import figure_png


def bits(nats: float) -> float:
    """A loss in nats per token, in bits."""
    return nats / math.log(2)


def flops_to_reach(curve: Sequence[tuple[int, float]], target_bits: float) -> float | None:
    """Training FLOPs at which ``curve`` (``(flops, loss in nats)`` per epoch) first reaches
    ``target_bits``, linear between epochs; None if it never does."""
    previous: tuple[int, float] | None = None
    for flops, loss in curve:
        b = bits(loss)
        if b <= target_bits:
            if previous is None:
                return float(flops)
            (f0, b0) = previous
            return f0 + (flops - f0) * (b0 - target_bits) / (b0 - b)
        previous = (flops, b)
    return None


def bits_at(curve: Sequence[tuple[int, float]], flops: float) -> float:
    """``curve``'s loss in bits at ``flops`` (linear between epochs, clamped at its ends)."""
    return float(np.interp(flops, [f for f, _ in curve], [bits(loss) for _, loss in curve]))


def summarise(runs: dict[str, list[EpisodeResult]]) -> dict[str, Any]:
    """Per-arm curves, FLOPs to the ``static-final`` network's final loss and loss at equal FLOPs,
    paired by seed."""
    static = runs["static-final"]
    seeds = [r.seed for r in static]
    for arm, arm_runs in runs.items():
        if [r.seed for r in arm_runs] != seeds:
            raise ValueError(f"arm {arm} ran seeds {[r.seed for r in arm_runs]}, expected {seeds}: runs are not paired")
    targets = [bits(r.curve[-1][1]) for r in static]
    arms: dict[str, Any] = {}
    for arm, arm_runs in runs.items():
        to_target = [flops_to_reach(r.curve, t) for r, t in zip(arm_runs, targets, strict=True)]
        savings = [None if f is None else 1.0 - f / s.train_flops for f, s in zip(to_target, static, strict=True)]
        # The static network's loss at the FLOPs this arm trained with: without its cooldown
        # there, which favours the arm (a static run sized to those FLOPs would cool down too).
        equal = [bits_at(s.curve, r.train_flops) for r, s in zip(arm_runs, static, strict=True)]
        arms[arm] = arm_summary(
            [
                {
                    "seed": r.seed,
                    "final_val_bits": bits(r.curve[-1][1]),
                    "test_bits": bits(r.test_loss),
                    "train_flops": r.train_flops,
                    "flops_to_target": t,
                    "flops_saving": sv,
                    "static_bits_at_equal_flops": e,
                    "params": r.total_params,
                    "commands": r.commands,
                    "wall_s": r.wall_s,
                    "halted": r.halted,
                    "curve": [{"train_flops": fl, "val_bits": bits(loss)} for fl, loss in r.curve],
                }
                for r, t, sv, e in zip(arm_runs, to_target, savings, equal, strict=True)
            ]
        )
    return {"targets_val_bits": targets, "arms": arms, "static_frontier": static_frontier(arms)}


def arm_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """An arm's headlines from its runs (``summarise``'s per-run entries, one per paired seed)."""
    final = [r["final_val_bits"] for r in runs]
    reached = [r["flops_saving"] for r in runs if r["flops_saving"] is not None]
    return {
        "final_val_bits_mean": statistics.fmean(final),
        "train_flops_mean": statistics.fmean(r["train_flops"] for r in runs),
        "params_mean": statistics.fmean(r["params"] for r in runs),
        # .get: runs saved before halted runs were kept have no entry (none halted: it raised).
        "halted": sum(r.get("halted") is not None for r in runs),
        "reached_target": len(reached),
        "flops_saving": _interval(reached, [0.0] * len(reached), higher_is_better=True)
        if len(reached) == len(runs)
        else None,
        "minus_static_at_equal_flops": _interval(
            final, [r["static_bits_at_equal_flops"] for r in runs], higher_is_better=False
        ),
        "runs": runs,
    }


def static_frontier(arms: dict[str, Any]) -> dict[str, Any]:
    """Each arm's final validation loss minus the static network's trained on the same FLOPs.

    Per seed, the static frontier is the final ``(training FLOPs, validation bits)`` of every
    final-size static run (``static-final`` and its ``static-final-<E>ep`` budgets, each with its
    own cooldown), linear between them; an arm whose FLOPs fall outside the frontier's range on
    some seed gets no comparison (None). Empty when no budget arm ran.
    """
    static = [a for a in arms if a == "static-final" or (a.startswith("static-final-") and a.endswith("ep"))]
    if len(static) < 2:
        return {}
    out: dict[str, Any] = {}
    for arm, summary in arms.items():
        if arm in static:
            continue
        diffs: list[float] = []
        finals: list[float] = []
        for run in summary["runs"]:
            points = sorted(
                (r["train_flops"], r["final_val_bits"])
                for a in static
                for r in arms[a]["runs"]
                if r["seed"] == run["seed"]
            )
            if not points[0][0] <= run["train_flops"] <= points[-1][0]:
                break
            frontier = float(np.interp(run["train_flops"], [f for f, _ in points], [b for _, b in points]))
            finals.append(run["final_val_bits"])
            diffs.append(frontier)
        else:
            out[arm] = _interval(finals, diffs, higher_is_better=False)
            continue
        out[arm] = None
    return out


def combine(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """``earlier`` and ``later`` as one result: other arms on the same seeds (``merge_results``),
    or the same arms on further seeds (``extend_seeds``)."""
    if earlier["seeds"] == later["seeds"]:
        return merge_results(earlier, later)
    return extend_seeds(earlier, later)


def extend_seeds(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """The same arms on ``first``'s seeds and then ``second``'s, summarised over all of them.

    Raises:
        ValueError: they differ in recipe, epochs, schedule or arms, or share a seed.
    """
    for key in ("recipe", "start_recipe", "epochs", "lr", "lr_schedule", "train_windows", "split_seed", "plan"):
        if first.get(key) != second.get(key):
            raise ValueError(f"results differ in {key}: {first.get(key)!r} vs {second.get(key)!r}; extend one plan's")
    if bool(first.get("selection")) != bool(second.get("selection")):
        raise ValueError("one result is on selection seeds and the other on evaluation seeds: never combine them")
    # Results from before the version was recorded ran on 3.11, the only Python they were run on.
    if first.get("python", "3.11") != second.get("python", "3.11"):
        raise ValueError(
            f"results ran on Python {first.get('python', '3.11')} and {second.get('python', '3.11')}, whose "
            "standard libraries (the corpus) differ: extend with seeds run on the same Python"
        )
    if list(first["arms"]) != list(second["arms"]):
        raise ValueError(f"results have arms {list(first['arms'])} and {list(second['arms'])}: extend the same arms")
    if set(first["seeds"]) & set(second["seeds"]):
        raise ValueError(f"results share seeds ({first['seeds']} and {second['seeds']}): extend with new seeds only")
    arms = {arm: arm_summary([*first["arms"][arm]["runs"], *second["arms"][arm]["runs"]]) for arm in first["arms"]}
    return {
        **first,
        "seeds": [*first["seeds"], *second["seeds"]],
        "targets_val_bits": [*first["targets_val_bits"], *second["targets_val_bits"]],
        "arms": arms,
        "static_frontier": static_frontier(arms),
        "wall_s": first["wall_s"] + second["wall_s"],
    }


def merge_results(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two results of one benchmark (say the default plan and the ``budgets`` plan) as one.

    Raises:
        ValueError: they differ in recipe, seeds, epochs or schedule, or their ``static-final``
            runs differ (the runs are deterministic: the same seed must give the same numbers).
    """
    for key in ("recipe", "start_recipe", "seeds", "epochs", "lr", "lr_schedule", "train_windows", "split_seed"):
        if first.get(key) != second.get(key):
            raise ValueError(
                f"results differ in {key}: {first.get(key)!r} vs {second.get(key)!r}; merge one benchmark's"
            )
    a, b = first["arms"]["static-final"]["runs"], second["arms"]["static-final"]["runs"]
    if [r["final_val_bits"] for r in a] != [r["final_val_bits"] for r in b]:
        raise ValueError(
            "the two results' static-final runs differ: they were not trained by the same code on the same seeds"
        )
    arms = {**first["arms"], **{k: v for k, v in second["arms"].items() if k not in first["arms"]}}
    merged = {**first, "arms": arms, "static_frontier": static_frontier(arms)}
    # Each arm's own warm-up is in its name (-wK); the result lists every one it holds.
    warmups = {first.get("blend_lr_warmup_epochs", 0), second.get("blend_lr_warmup_epochs", 0)}
    merged["blend_lr_warmup_epochs"] = warmups.pop() if len(warmups) == 1 else sorted(warmups)
    merged["static_budgets"] = sorted({*first.get("static_budgets", []), *second.get("static_budgets", [])})
    # What the widened arms were run with, from whichever result ran them.
    widen_points = sorted({*first.get("widen_points", []), *second.get("widen_points", [])})
    if widen_points:
        merged["widen_points"] = widen_points
    plateaus = {**second.get("widen_plateau", {}), **first.get("widen_plateau", {})}
    if plateaus:
        merged["widen_plateau"] = plateaus
    narrow = first.get("narrow_recipe", second.get("narrow_recipe"))
    if narrow is not None:
        merged["narrow_recipe"] = narrow
    merged["wall_s"] = first["wall_s"] + second["wall_s"]
    return merged


def _interval(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool) -> dict[str, Any]:
    """The mean of ``a - b`` with its paired-bootstrap 95 % interval (None below two seeds)."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    if len(diffs) < 2:
        return {"mean": statistics.fmean(diffs), "ci95_low": None, "ci95_high": None, "n": len(diffs)}
    return paired_difference(a, b, higher_is_better=higher_is_better).as_dict()


def format_table(result: dict[str, Any]) -> str:
    """The human-readable report of ``run``'s result."""
    targets = result["targets_val_bits"]
    lines = [
        f"depth growth on {result['recipe']} (start {result['start_recipe']}), plan {result['plan']}: "
        f"{len(result['seeds'])} paired {'SELECTION ' if result.get('selection') else ''}seeds "
        f"{_seed_span(result['seeds'])}, {result['epochs']} epochs, lr {result['lr']:g} "
        f"{result['lr_schedule']}; target (static-final's final validation loss) "
        f"{statistics.fmean(targets):.4f} bits; wall {result['wall_s']:.0f} s",
        "",
        "| arm | final val bits | params | training FLOPs | reached target | FLOPs saving to target "
        "(95 % CI) | minus static-final's curve at equal FLOPs (95 % CI) | minus the static frontier at "
        "equal FLOPs (95 % CI) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    frontier = result.get("static_frontier", {})
    for arm, s in result["arms"].items():
        versus = "static run" if arm not in frontier else _fmt(frontier[arm], "bits", missing="outside its FLOPs")
        lines.append(
            f"| {arm} | {s['final_val_bits_mean']:.4f} | {s['params_mean']:.0f} | {s['train_flops_mean']:.3g} | "
            f"{s['reached_target']}/{len(result['seeds'])} | {_fmt(s['flops_saving'], '%')} | "
            f"{_fmt(s['minus_static_at_equal_flops'], 'bits')} | {versus if frontier else 'no budget arms'} |"
        )
    if halted := [f"{arm} {s['halted']}" for arm, s in result["arms"].items() if s.get("halted")]:
        lines += ["", f"halted runs (kept in their pairs, scored at their last commit): {', '.join(halted)}"]
    return "\n".join(lines)


def _seed_span(seeds: list[int]) -> str:
    """``0..7`` for consecutive seeds, else the list."""
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}..{seeds[-1]}"
    return ", ".join(map(str, seeds))


def _fmt(d: dict[str, Any] | None, unit: str, *, missing: str = "not every seed") -> str:
    if d is None:
        return missing
    scale, form = (100.0, "{:+.1f}") if unit == "%" else (1.0, "{:+.4f}")
    mean = form.format(scale * d["mean"])
    if d["ci95_low"] is None:
        return f"{mean} (n={d['n']})"
    return f"{mean} [{form.format(scale * d['ci95_low'])}, {form.format(scale * d['ci95_high'])}]"


_STYLE = {
    "static-final": "black",
    "static-start": "tab:gray",
    "static-narrow": "tab:olive",
    "controller": "tab:green",
    "widen-controller": "tab:cyan",
    "widen-plateau": "tab:pink",
}


def curves_png(result: dict[str, Any]) -> bytes:
    """Validation bits per token against cumulative training FLOPs: every arm's run on every seed,
    and the target (static-final's final loss, its seeds' mean) as a dashed line."""
    fig = Figure(figsize=(8.0, 5.5))
    ax = fig.subplots()
    # As many growing arms as a plan names: colours cycle rather than run out.
    growing = itertools.cycle(["tab:blue", "tab:orange", "tab:red", "tab:purple", "tab:brown"])
    for arm, s in result["arms"].items():
        budget = arm.startswith("static-final-")  # the static network at a smaller budget: grey, dashed
        color = _STYLE.get(arm) or ("tab:gray" if budget else next(growing))
        for i, r in enumerate(s["runs"]):
            xs = [p["train_flops"] for p in r["curve"]]
            ys = [p["val_bits"] for p in r["curve"]]
            ax.plot(xs, ys, color=color, linestyle="--" if budget else "-", marker=".", alpha=0.8,
                    label=arm if i == 0 else None)  # fmt: skip
    ax.axhline(statistics.fmean(result["targets_val_bits"]), color="black", linestyle="--", linewidth=0.8,
               label="target: static-final's final loss")  # fmt: skip
    ax.set_xlabel("cumulative training FLOPs")
    ax.set_ylabel("validation bits per character")
    ax.set_title(f"{result['recipe']}: {len(result['seeds'])} seeds, {result['epochs']} epochs")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return figure_png(fig)


def save_baseline(result: dict[str, Any], directory: Path) -> tuple[Path, Path]:
    """Write ``depth_growth.json`` and ``depth_growth.png`` into ``directory``; returns both paths."""
    return save_result_with_plot(
        result, directory, json_name="depth_growth.json", png_name="depth_growth.png", png=curves_png(result)
    )


__all__ = [
    "bits_at",
    "flops_to_reach",
    "format_table",
    "merge_results",
    "save_baseline",
    "static_frontier",
    "summarise",
]
