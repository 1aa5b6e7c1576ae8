"""Benchmarks: each times Esper and the bare PyTorch equivalent in the same process."""
