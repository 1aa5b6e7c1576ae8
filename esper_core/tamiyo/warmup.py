"""The child process that compiles a Tamiyo policy and stores it (``build.warm_in_subprocess``).

A compile on a thread of the serving process shares its GIL: dynamo traces and Inductor
generates code in Python, and every eager decision made meanwhile waits for the interpreter
at each op (measured: decisions of 2.8 s, and of tens of seconds on a loaded 2-core machine).
So the compile runs in a child process (``nice`` +10, one compile worker, the serving process's
settings that the compiled policy's guards check) that stores the compiled policy where the serving process loads it from
(``esper_core.tamiyo.precompile``) and fills the shared on-disk compiler cache on the way. The
child is started and waited for on the policy's background thread; it never holds the serving
process's GIL.

Run as ``python -m esper_core.tamiyo.warmup JOB`` where JOB is a ``torch.save`` file written by
``warm_in_subprocess``; the cache directory comes from the inherited ``TORCHINDUCTOR_CACHE_DIR``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch._inductor.config as inductor_config

from esper_core.tamiyo.build import compiled_context, guard_state_under
from esper_core.tamiyo.config import PolicyCompileConfig
from esper_core.tamiyo.model import TamiyoGNN, TamiyoGNNConfig
from esper_core.tamiyo.precompile import apply_process_state, compile_policy, record_vec_isa, save_policy

NICE = 10
"""Niceness added in the child: the serving process (and training) keep the CPU first."""


def main(job_path: str) -> int:
    """The child: compile the job's policy for its inputs, store it, then exit."""
    os.nice(NICE)
    inductor_config.compile_threads = 1  # one compile worker: the serving process keeps a core
    job = torch.load(job_path, weights_only=True)
    apply_process_state(job["process"])
    device = torch.device(job["device"])
    model = TamiyoGNN(TamiyoGNNConfig(**job["gnn"]))
    model.load_state_dict(job["state"])
    model = model.to(device).eval()
    dtype = None if job["dtype"] is None else getattr(torch, job["dtype"])
    config = PolicyCompileConfig(mode=job["mode"], dynamic=job["dynamic"], backend=job["backend"], background=False)
    inputs = ({k: v.to(device) for k, v in job["x"].items()}, {k: v.to(device) for k, v in job["edges"].items()})
    seen = guard_state_under(device, dtype)
    if seen != job["guard_state"]:
        print(
            f"this process's global state differs from the serving process's, so the compiled policy would "
            f"never pass its guards there: {seen} here, {job['guard_state']} there "
            "(add the setting to esper_core.tamiyo.precompile.process_state)",
            file=sys.stderr,
        )
        return 1
    try:
        with compiled_context(device, dtype):
            fn = compile_policy(model, inputs, config=config)
        save_policy(fn, Path(job["out"]), model=model)
        record_vec_isa()
    # Whatever the compiler raises, the parent needs its text on stderr and a failing exit code.
    except Exception as e:  # noqa: BLE001
        print(f"compile failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
