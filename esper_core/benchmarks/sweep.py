"""Benchmark sweeps: time every case, keep a snapshot, compare it with the previous sweep.

A sweep named ``nightly`` run at 03:00 UTC writes ``<root>/nightly-20261121-030000/`` with one
baseline JSON per case (``seed-reference-cpu-s0.json``, written by ``write_baseline``) and a
``sweep.json`` index. The previous sweep is the newest earlier directory of the same named
sweep under ``<root>``; the comparison covers p50 / p95 / max per series and the ratios to bare
PyTorch, and the gated figures decide whether the sweep regressed.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from esper_core.benchmarks.registry import BASELINE_SERIES, SERIES_ORDER, BenchCase, SweepConfig, Workload, get_workload
from esper_core.telemetry import latency_stats, load_baseline, write_baseline
from esper_core.telemetry.atomic import atomic_write_text

INDEX = "sweep.json"
FIGURES = ("p50_ms", "p95_ms", "max_ms", "ratio_p50", "ratio_p95")


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseResult:
    """The timings of one case (small: a few hundred floats)."""

    case: BenchCase
    samples_ms: dict[str, list[float]]
    headline: dict[str, Any] = field(default_factory=dict)

    def figures(self) -> dict[str, dict[str, float]]:
        """Series -> {p50_ms, p95_ms, max_ms, ratio_p50, ratio_p95}; ratios are to ``bare``."""
        stats = {name: latency_stats(samples) for name, samples in self.samples_ms.items()}
        bare = stats.get(BASELINE_SERIES)
        out: dict[str, dict[str, float]] = {}
        for name, s in stats.items():
            row = {"p50_ms": s.p50_ms, "p95_ms": s.p95_ms, "max_ms": s.max_ms}
            if bare is not None and name != BASELINE_SERIES:
                row["ratio_p50"] = s.p50_ms / bare.p50_ms if bare.p50_ms > 0 else math.inf
                row["ratio_p95"] = s.p95_ms / bare.p95_ms if bare.p95_ms > 0 else math.inf
            out[name] = row
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ComparisonRow:
    """One figure of one series of one case, now and in the previous sweep."""

    case: str
    series: str
    figure: str
    current: float
    previous: float | None
    gated: bool

    @property
    def change(self) -> float | None:
        """Relative change (``0.3`` = 30 % higher), ``None`` without a previous value."""
        if self.previous is None or self.previous <= 0:
            return None
        return self.current / self.previous - 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepReport:
    """What a sweep measured and how it compares; what the flow publishes and checks."""

    name: str
    sweep: str
    directory: str
    previous: str | None
    max_regression: float
    rows: list[ComparisonRow]
    distributions: dict[str, list[float]]
    """``"<case> <series>"`` -> samples, for the latency plot."""

    def regressions(self) -> list[str]:
        """One message per gated figure that grew by more than ``max_regression``."""
        messages = []
        for row in self.rows:
            change = row.change
            if row.gated and change is not None and change > self.max_regression:
                unit = " ms" if row.figure.endswith("_ms") else "x"
                messages.append(
                    f"{row.case} {row.series} {row.figure} {row.current:.3f}{unit} vs {row.previous:.3f}{unit} in "
                    f"{self.previous} (+{change:.0%}, limit +{self.max_regression:.0%})"
                )
        return messages

    def table(self) -> list[dict[str, Any]]:
        """Rows for a Prefect table artifact."""
        return [
            {
                "case": r.case,
                "series": r.series,
                "figure": r.figure,
                "current": round(r.current, 4),
                "previous": None if r.previous is None else round(r.previous, 4),
                "change": "" if r.change is None else f"{r.change:+.1%}",
                "gated": r.gated,
            }
            for r in self.rows
        ]


def run_case(case: BenchCase, workload: Workload | None = None) -> CaseResult:
    """Time ``case`` with ``workload`` (default: the one registered under ``case.workload``).

    A child process gets the workload from its parent, where it may have been registered at run
    time (``esper_core.benchmarks.registry.register``).
    """
    result = (workload or get_workload(case.workload)).run(case)
    samples = {name: [float(v) for v in values] for name, values in result["samples_ms"].items()}
    headline = {k: v for k, v in result.items() if k != "samples_ms" and isinstance(v, int | float | str)}
    return CaseResult(case=case, samples_ms=samples, headline=headline)


def sweep_directory(root: Path, config: SweepConfig, *, now: datetime | None = None) -> Path:
    """``<root>/<sweep>-<UTC timestamp>`` (``-2``, ``-3``, ... for a second sweep within the second)."""
    base = root / f"{config.name}-{(now or datetime.now(UTC)).strftime('%Y%m%d-%H%M%S')}"
    directory, n = base, 1
    while directory.exists():
        n += 1
        directory = base.with_name(f"{base.name}-{n}")
    return directory


def write_snapshot(directory: Path, config: SweepConfig, results: list[CaseResult]) -> Path:
    """Write one baseline per case and the ``sweep.json`` index; returns ``directory``.

    Raises:
        ValueError: If ``directory`` already holds a sweep (each sweep gets its own).
    """
    if (directory / INDEX).exists():
        raise ValueError(f"{directory} already holds a sweep; give this sweep another name")
    directory.mkdir(parents=True, exist_ok=True)
    for result in results:
        case = result.case
        write_baseline(
            directory / f"{case.key}.json",
            name=case.workload,
            workload={**asdict(case), "sweep": config.name},
            latency_ms=result.samples_ms,
            device=case.device,
            # Raw samples too: the plot shows distributions, and later tools may re-summarise them.
            extra={"figures": result.figures(), "headline": result.headline, "samples_ms": result.samples_ms},
        )
    index = {
        "sweep": config.name,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": asdict(config),
        "cases": [r.case.key for r in results],
    }
    atomic_write_text(directory / INDEX, json.dumps(index, indent=2) + "\n")
    return directory


def previous_sweep(root: Path, config: SweepConfig, *, before: Path) -> Path | None:
    """The newest sweep of the same name under ``root`` older than ``before``, if any."""
    candidates = []
    for index in root.glob(f"{config.name}-*/{INDEX}"):
        directory = index.parent
        if directory.name < before.name and json.loads(index.read_text()).get("sweep") == config.name:
            candidates.append(directory)
    return max(candidates, default=None, key=lambda d: d.name)


def _figures(directory: Path, key: str) -> dict[str, dict[str, float]] | None:
    path = directory / f"{key}.json"
    if not path.exists():
        return None
    return load_baseline(path)["extra"]["figures"]


def compare(directory: Path, config: SweepConfig, previous: Path | None) -> SweepReport:
    """Compare the sweep in ``directory`` with ``previous`` (``None``: first sweep of its name)."""
    index = json.loads((directory / INDEX).read_text())
    rows: list[ComparisonRow] = []
    distributions: dict[str, list[float]] = {}
    for key in index["cases"]:
        baseline = load_baseline(directory / f"{key}.json")
        current = baseline["extra"]["figures"]
        before = _figures(previous, key) if previous is not None else None
        series_names = sorted(current, key=lambda s: (SERIES_ORDER.index(s) if s in SERIES_ORDER else 99, s))
        for series in series_names:
            distributions[f"{key} {series}"] = baseline["extra"]["samples_ms"][series]
            for figure in FIGURES:
                if figure not in current[series]:
                    continue
                prev = None if before is None else before.get(series, {}).get(figure)
                rows.append(
                    ComparisonRow(
                        case=key,
                        series=series,
                        figure=figure,
                        current=float(current[series][figure]),
                        previous=None if prev is None else float(prev),
                        # Bare PyTorch getting slower is the machine, not Esper: never gated.
                        gated=figure in config.gated and series != BASELINE_SERIES,
                    )
                )
    return SweepReport(
        name=directory.name,
        sweep=config.name,
        directory=str(directory),
        previous=None if previous is None else previous.name,
        max_regression=config.max_regression,
        rows=rows,
        distributions=distributions,
    )


def render_markdown(report: SweepReport, *, plot_uri: str | None = None) -> str:
    """The sweep as a markdown report: verdict, per-case table, and the plot when given."""
    regressions = report.regressions()
    against = f"against `{report.previous}`" if report.previous else "(first sweep of its name: nothing to compare)"
    verdict = (
        "**Regressions:**\n\n" + "\n".join(f"- {m}" for m in regressions)
        if regressions
        else f"No gated figure grew by more than {report.max_regression:.0%}."
    )
    lines = [
        f"# Benchmark sweep `{report.name}`",
        "",
        f"Sweep `{report.sweep}` {against}; snapshots in `{report.directory}`.",
        "",
        verdict,
        "",
        "| case | series | figure | current | previous | change |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in report.rows:
        previous = "-" if r.previous is None else f"{r.previous:.3f}"
        change = "-" if r.change is None else f"{r.change:+.1%}"
        mark = " **!**" if r.gated and r.change is not None and r.change > report.max_regression else ""
        lines.append(f"| {r.case} | {r.series} | {r.figure} | {r.current:.3f} | {previous} | {change}{mark} |")
    if plot_uri:
        lines += ["", "## Latency distributions", "", f"![latency distributions]({plot_uri})"]
    return "\n".join(lines) + "\n"
