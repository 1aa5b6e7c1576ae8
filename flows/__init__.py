"""Prefect flows: each chains tasks and nothing else."""
