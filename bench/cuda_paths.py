"""cuda_paths: every CUDA path of the training step against bare PyTorch, one call on a GPU machine.

GPUs are lent to this project now and then, for minutes; this runs what such a lease should
measure, in one process: the training bench (``esper bench training``) of each recipe on the
eager step and on CUDA graph replays, and for the MNIST-1D CNN also the compiled step and full
precision. Each case is saved as a baseline (``DIR/<recipe>-<path>.json``, comparable with
``esper bench compare``) and summarised in ``DIR/summary.json`` and a table: the ratio to the bare
loop at the same precision, and the chosen path's test accuracy beside the eager one's (a graphed
or compiled step that computes something else shows there). A case that fails is reported and
the others still run. Refused at once on a machine without CUDA.

    python -m bench.cuda_paths --out DIR [--recipes R ...] [--epochs N]
"""

from __future__ import annotations

import argparse
import dataclasses
import traceback
from pathlib import Path
from typing import Any

import torch

from bench._output import save_json
from esper_core.benchmarks.common import BenchConfig
from esper_core.benchmarks.training import headline, run, save_baseline, score_line

# The growing recipes first: a lease's time limit may stop the run part-way.
RECIPES = (
    "mnist1d-cnn-width",
    "mnist1d-mlp-width",
    "mnist1d-cnn",
    "chars-gpt-growth",
    "seed-reference",
    "digits-mlp",
    "mnist1d-mlp",
)
PATHS: dict[str, dict[str, Any]] = {
    "eager": {"compile": "off"},
    "graphs": {"compile": "off", "cuda_graphs": True},
    "compiled": {"compile": "on"},
    "fp32": {"compile": "off", "amp": "off"},
}
# The slower paths on the recipe whose epochs are long enough to time them (a compile takes ~15 s).
EXTRA_PATHS = {"mnist1d-cnn": ("compiled", "fp32")}


def cases(recipes: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(recipe, path)`` pairs in run order: eager and graphs for every recipe, then the extras."""
    return [(r, p) for r in recipes for p in ("eager", "graphs", *EXTRA_PATHS.get(r, ()))]


def measure(recipe: str, path: str, *, epochs: int, out: Path) -> dict[str, Any]:
    """One case: the training bench on CUDA, saved as a baseline; returns its headline numbers."""
    config = BenchConfig(epochs=epochs, min_timed_s=0.5, device="cuda", **PATHS[path])
    result = run(recipe, config)
    save_baseline(
        result, out / f"{recipe}-{path}.json", name=f"{recipe}-{path}", extra={"config": dataclasses.asdict(config)}
    )
    return headline(result)


def print_row(row: dict[str, Any]) -> None:
    """One case's line of the table (and its fallbacks), as soon as it is measured."""
    if "error" in row:
        print(f"{row['recipe']:<18} {row['path']:<8} FAILED: {row['error'][:200]}", flush=True)
        return
    print(
        f"{row['recipe']:<18} {row['path']:<8} {row['chosen_path']:<20} train x{row['ratio_p50']:.2f} "
        f"epoch x{row['epoch_ratio_p50']:.2f}  {score_line(row)}",
        flush=True,
    )
    for fallback in row["fallbacks"]:
        print(f"{'':<27} fell back: {fallback[:300]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the baselines and summary.json")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), help="default: %(default)s")
    parser.add_argument("--epochs", type=int, default=15, help="timed epochs per path (default: %(default)s)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error(f"torch {torch.__version__} sees no CUDA device: run this on a GPU machine")
    rows: list[dict[str, Any]] = []
    for recipe, path in cases(tuple(args.recipes)):
        try:
            row = {"recipe": recipe, "path": path, **measure(recipe, path, epochs=args.epochs, out=args.out)}
        except Exception as e:  # noqa: BLE001 - one failing case must not cost the lease's other numbers
            row = {"recipe": recipe, "path": path, "error": "".join(traceback.format_exception_only(e)).strip()}
            traceback.print_exc()
        rows.append(row)
        # Saved and printed after every case: a lease's time limit stops the run part-way.
        save_json(
            {"bench": "cuda_paths", "device": torch.cuda.get_device_name(), "rows": rows}, args.out / "summary.json"
        )
        print_row(row)
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
