"""Simic: trains Tamiyo's GNN policy from recorded decisions and field reports.

Imitation of the heuristic first, then PPO with the value head as critic, on rewards that trade
validation accuracy gained against parameters added. Records and policy versions live in the
registry database (``records``); ``serving.refresh_policy`` hot-swaps versions into Tamiyo.
"""
