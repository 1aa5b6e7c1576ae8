"""Prefect tasks: thin wrappers that give library calls retries, cache policies and tags."""
