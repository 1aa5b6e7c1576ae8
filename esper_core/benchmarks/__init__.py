"""Benchmark machinery that tasks, flows and the ``esper bench`` entry points share.

Plain library code (no Prefect): the training bench against bare PyTorch, the sweep registry and
its snapshots. The growth benchmark, which runs many runs, lives in ``esper_core.studies``; the
command-line scripts live in ``bench/``.
"""

from esper_core.benchmarks.progress import NO_PROGRESS, NoProgress, Progress

__all__ = ["NO_PROGRESS", "NoProgress", "Progress"]
