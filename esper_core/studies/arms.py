"""The arms of the growth benchmark: who decides in each run of a seed.

Kept apart from the report so that the command line can offer them without importing plotting."""

GROWING_ARMS = ("heuristic", "gnn", "random", "periodic")
"""Policies that grow the host: Tamiyo's rules, the learned GNN, budget-matched random, periodic."""
ARMS = ("none", *GROWING_ARMS)
"""Every arm of a seed, in run order: ``none`` (the static host) first, ``gnn`` before ``random``
(whose parameter budget is the learned arm's)."""
