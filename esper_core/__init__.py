"""Esper core library: grow neural networks while they train.

Subsystems: Karn (blueprints), Tezzeret (compiler), Urza (registry), Kasmina (seed manager),
Tolaria (trainer), Tamiyo (controller), Simic (policy learning), Nissa (telemetry) and the
Leyline contracts. This package never imports Prefect; ``tasks/`` and ``flows/`` wrap it.
"""

__version__ = "0.1.0"
