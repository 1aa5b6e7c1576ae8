"""PNG plots a person looks at instead of reading numbers: training curves and latency spreads.

Rendered with matplotlib's object API on the Agg canvas (no ``pyplot``): no global figure
state, no display needed, safe to call from worker threads and processes.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_DPI = 100


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochPoint:
    """One epoch of a run's curves."""

    epoch: int
    train_loss: float
    val_loss: float
    val_accuracy: float


@dataclass(frozen=True, kw_only=True, slots=True)
class SeedMark:
    """A seed event to mark on the curves (germinate, advance, fossilise, cull, ...)."""

    epoch: int
    label: str


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=_DPI, bbox_inches="tight")
    return buffer.getvalue()


def figure_png(fig: Figure) -> bytes:
    """A figure built with matplotlib's object API, rendered on the Agg canvas as PNG bytes."""
    return _png(fig)


def data_uri(png: bytes) -> str:
    """``data:image/png;base64,...``: embeds a PNG in markdown or an image artifact without a file server."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def run_curves_png(
    points: Sequence[EpochPoint], marks: Sequence[SeedMark] = (), *, title: str = "", accuracy: bool = True
) -> bytes:
    """Loss (left axis) and validation accuracy (right axis) over epochs, seed events as lines.

    Args:
        points: The run's epochs in order.
        marks: Seed events; each becomes a dashed vertical line labelled at the top.
        title: Plot title (e.g. the run id and recipe).
        accuracy: Draw the accuracy axis; False for a run without class targets (a language
            model's accuracy is not measured and would be a flat line at 0).

    Returns:
        The PNG bytes.

    Raises:
        ValueError: If ``points`` is empty.
    """
    if not points:
        raise ValueError("a run plot needs at least one epoch")
    epochs = [p.epoch for p in points]
    fig = Figure(figsize=(8, 4.2))
    ax = fig.add_subplot()
    curves = ax.plot(epochs, [p.train_loss for p in points], marker="o", ms=3, label="train loss", color="tab:blue")
    curves += ax.plot(epochs, [p.val_loss for p in points], marker="o", ms=3, label="val loss", color="tab:orange")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    if accuracy:
        acc = ax.twinx()
        curves += acc.plot(
            epochs, [p.val_accuracy for p in points], marker="s", ms=3, label="val accuracy", color="tab:green"
        )
        acc.set_ylabel("validation accuracy")
        acc.set_ylim(0.0, 1.02)
    for i, mark in enumerate(marks):
        line = ax.axvline(mark.epoch, color="tab:red", linestyle="--", linewidth=1, alpha=0.7, label="seed event")
        if i == 0:
            curves.append(line)
        # Blended transform: x in data units, y in axes units, so labels sit at the top.
        ax.text(
            mark.epoch,
            0.98,
            mark.label,
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color="tab:red",
            transform=ax.get_xaxis_transform(),
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 1},
        )
    ax.legend(curves, [str(line.get_label()) for line in curves], loc="center right", fontsize=8)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    return _png(fig)


def latency_png(distributions: Mapping[str, Sequence[float]], *, title: str = "") -> bytes:
    """Box plots of latency samples, one per labelled series, on a log axis when they span 10x.

    Args:
        distributions: Label (e.g. ``seed-reference/cpu/s0 chosen``) -> samples in ms.
        title: Plot title.

    Returns:
        The PNG bytes.

    Raises:
        ValueError: If there is no series or a series has no sample.
    """
    if not distributions:
        raise ValueError("a latency plot needs at least one series")
    empty = [label for label, samples in distributions.items() if not samples]
    if empty:
        raise ValueError(f"latency series without samples: {empty}")
    labels = list(distributions)
    fig = Figure(figsize=(max(6.0, 0.9 * len(labels) + 2.0), 4.5))
    ax = fig.add_subplot()
    ax.boxplot([list(distributions[k]) for k in labels], showfliers=True, whis=(5, 95))
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("ms per epoch (whiskers p5-p95)")
    low = min(min(s) for s in distributions.values())
    high = max(max(s) for s in distributions.values())
    if low > 0 and high / low > 10:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    return _png(fig)
