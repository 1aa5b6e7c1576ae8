"""Benchmark machinery that tasks, flows and the ``esper bench`` entry points share.

Plain library code (no Prefect): the training bench against bare PyTorch, the sweep registry and
its snapshots, and the growth benchmark with its report. The command-line scripts live in
``bench/``.
"""

from esper_core.benchmarks.progress import NO_PROGRESS, NoProgress, Progress

__all__ = ["NO_PROGRESS", "NoProgress", "Progress"]
