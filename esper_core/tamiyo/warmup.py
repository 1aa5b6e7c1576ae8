"""The child process that warms the compiler cache for a Tamiyo policy (``build.warm_in_subprocess``).

A compile on a thread of the serving process shares its GIL: dynamo traces and Inductor
generates code in Python, and every eager decision made meanwhile waits for the interpreter
at each op (measured: decisions of 2.8 s, and of tens of seconds on a loaded 2-core machine).
So the cold compile runs in a child process (``nice`` +10, one compile worker) that fills the
on-disk Inductor/FX caches with the very same module and input shapes; the serving process then
compiles against a hot cache, which is mostly loading. The child is started and waited for on
the policy's background thread; it never holds the serving process's GIL.

Run as ``python -m esper_core.tamiyo.warmup JOB`` where JOB is a ``torch.save`` file written by
``warm_in_subprocess``; the cache directory comes from the inherited ``TORCHINDUCTOR_CACHE_DIR``.
"""

from __future__ import annotations

import os
import sys

import torch
import torch._inductor.config as inductor_config

from esper_core.tamiyo.build import PreparedPolicy
from esper_core.tamiyo.config import PolicyCompileConfig
from esper_core.tamiyo.model import TamiyoGNN, TamiyoGNNConfig

NICE = 10
"""Niceness added in the child: the serving process (and training) keep the CPU first."""


def main(job_path: str) -> int:
    """The child: compile the job's policy for its inputs, in this process, then exit."""
    os.nice(NICE)
    inductor_config.compile_threads = 1  # one compile worker: the serving process keeps a core
    job = torch.load(job_path, weights_only=True)
    device = torch.device(job["device"])
    model = TamiyoGNN(TamiyoGNNConfig(**job["gnn"]))
    model.load_state_dict(job["state"])
    model = model.to(device).eval()
    dtype = None if job["dtype"] is None else getattr(torch, job["dtype"])
    compile_config = PolicyCompileConfig(
        mode=job["mode"], dynamic=job["dynamic"], backend=job["backend"], background=False
    )
    policy = PreparedPolicy(model, device=device, compile_config=compile_config, dtype=dtype)
    x_dict = {k: v.to(device) for k, v in job["x"].items()}
    edges = {k: v.to(device) for k, v in job["edges"].items()}
    policy.warm(x_dict, edges)
    if not policy.compile_enabled:
        print(f"compile failed: {policy.fallback_reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
