"""Studies: code that runs many runs to learn or measure something, above the one-run layer.

A study runs whole runs (most through ``esper_core.run``, a ``Run`` per run) and compares
or learns from them: ``episodes`` (whole runs in-process, the unit every study counts in),
``variation`` (a varied task per Simic training episode), ``counterfactual`` (fork a run at a
decision, play both branches out), ``schedule_search`` (fixed growth schedules and a budgeted
search over them), ``simic_train`` and ``simic_jobs`` (Simic's training procedure), ``growth``
with ``growth_report`` and ``arms`` (the growth benchmark), ``adapt``, ``width`` and
``width_control`` (growth studies behind ``bench/``), ``golden`` (a refactor's before and after,
epoch by epoch) and ``drills`` (fault drills on real runs). The run layer never imports this
package (``tests/test_layering.py`` checks it).
"""
