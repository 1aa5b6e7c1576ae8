"""Benchmark entry points: the scripts behind ``esper bench ...``.

The benchmark machinery that flows and tasks reuse (the training bench, the sweep registry and
snapshots, the growth benchmark and its report) is library code in ``esper_core.benchmarks``;
this package is the top layer and may import ``esper_core``, ``tasks`` and ``flows``.
"""
