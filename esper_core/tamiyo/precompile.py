"""Tamiyo's compiled policy as a file: compiled once by a policy server, loaded by the next in ~1.5 s.

``torch.compile`` against a hot cache still traces the GNN again with Dynamo and rebuilds its
guards before Inductor's cache answers: 3.8-4.0 s of mostly GIL-held Python on the
``policy-graph`` workload (2-core machine, one thread), while eager decisions wait for the
interpreter. PyTorch's AOT precompile (``torch.compile(...).aot_compile``) captures the traced
graph, its guards and Inductor's output in one artifact; loading it skips tracing. Measured
by ``esper bench policy`` on the same machine, a cached warm-up (the load, the first imports of
Inductor's runtime and one call) went from 3.77 s to 1.13-1.63 s over seven runs (2026-11-25), with
Inductor's vector-ISA probe skipped (``recorded_vec_isa``; it took 1.2-1.6 s of child processes
the first time a process loaded CPU kernels).

The API is marked experimental in PyTorch 2.13, so everything that touches it is here: a change
of PyTorch is a change of this module. The artifact holds no weights: the policy network is
passed in at every call (``fn(model, x_dict, edge_index_dict)``), so weights swapped in place
are served at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
import torch._inductor.config as inductor_config
from torch import Tensor
from torch._inductor import cpu_vec_isa

from esper_core.tamiyo.config import PolicyCompileConfig
from esper_core.tamiyo.model import PolicyOutput, TamiyoGNN

Inputs = tuple[dict[Any, Tensor], dict[Any, Tensor]]


class CompiledPolicy(Protocol):
    """A policy forward compiled for one family of input shapes (an AOT-compiled function)."""

    def guard_check(self, model: TamiyoGNN, x_dict: dict[Any, Tensor], edges: dict[Any, Tensor]) -> bool:
        """True when these inputs satisfy the guards the compile recorded (shapes, dtypes, ...)."""
        ...

    def __call__(self, model: TamiyoGNN, x_dict: dict[Any, Tensor], edges: dict[Any, Tensor]) -> PolicyOutput:
        """The compiled forward of ``model``."""
        ...


def artifact_path(
    model: TamiyoGNN,
    inputs: Inputs,
    *,
    config: PolicyCompileConfig,
    device: torch.device,
    dtype: torch.dtype | None,
    process: dict[str, Any],
) -> Path | None:
    """Where the compiled policy for this network, these settings and these shapes is stored.

    It lives inside the compiler cache directory (``build.use_compiler_cache``): removing the cache
    removes it too. The key holds ``process``, the compiling process's settings that the compiled
    policy's guards check (``process_state``): a process with other settings compiles its own.

    Returns:
        The file's path; None when no cache directory is set.
    """
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache is None:
        return None
    x_dict, edge_index_dict = inputs
    shapes = sorted((str(k), tuple(v.shape)) for k, v in (*x_dict.items(), *edge_index_dict.items()))
    key = json.dumps(
        {
            "gnn": dataclasses.asdict(model.config),
            "compile": [config.mode, config.dynamic, config.backend],
            "device": str(device),
            "dtype": str(dtype),
            "shapes": shapes,
            "process": process,
            "torch": torch.__version__,
        },
        sort_keys=True,
        default=str,
    )
    return Path(cache) / "tamiyo-aot" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.bin"


def process_state() -> dict[str, Any]:
    """The settings that change the policy's numerics or its guards, as the calling thread sees them.

    Dynamo's global-state guard compares them at every call (grad and autocast mode are set by
    the calling context), and the policy server takes the serving thread's (``apply_process_state``)
    so that its compiled decisions compute what an eager one would. Read it on the serving thread:
    the intra-op thread count is per thread.
    """
    return {
        "threads": torch.get_num_threads(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "default_dtype": str(torch.get_default_dtype()).removeprefix("torch."),
        "fp16_reduce": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "bf16_reduce": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }


def apply_process_state(state: dict[str, Any]) -> None:
    """Give this process the settings ``process_state`` read in another."""
    torch.set_num_threads(state["threads"])
    torch.set_float32_matmul_precision(state["matmul_precision"])
    torch.use_deterministic_algorithms(state["deterministic"], warn_only=state["deterministic_warn_only"])
    torch.set_default_dtype(getattr(torch, state["default_dtype"]))
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = state["fp16_reduce"]
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = state["bf16_reduce"]


@contextlib.contextmanager
def compiled_context(device: torch.device, dtype: torch.dtype | None) -> Iterator[None]:
    """What the compiled policy runs under, and is compiled under: its guards record it.

    ``no_grad`` rather than ``inference_mode``, even inside a caller's ``inference_mode``: a
    precompiled function's tensor guards expect the autograd dispatch keys that ``inference_mode``
    strips (measured: every call failed its guards).
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.no_grad())
        if dtype is not None:
            stack.enter_context(torch.autocast(device.type, dtype=dtype))
        yield


def compile_policy(model: TamiyoGNN, inputs: Inputs, *, config: PolicyCompileConfig) -> CompiledPolicy:
    """Compile ``model``'s forward for ``inputs``'s shapes, ahead of time, in this process.

    Call it under the context the compiled policy will be called in (``no_grad``, autocast): the
    guards record it. The whole forward is one graph (``fullgraph``); a graph break is an error.
    Inductor's caches do not serve an ahead-of-time compile: each one is a full compile.
    """
    compiled = torch.compile(
        model.forward, fullgraph=True, dynamic=config.dynamic, mode=config.mode, backend=config.backend
    )
    # torch.compile's stub returns the compiled callable's own type, which lacks the wrapper's aot_compile.
    fn = compiled.aot_compile((inputs, {}))  # type: ignore[attr-defined]
    fn.disable_guard_check()  # as in ``load_policy``
    return fn


def save_policy(fn: CompiledPolicy, path: Path, *, model: TamiyoGNN) -> None:
    """Write ``fn`` to ``path`` (atomically: a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fn.save_compiled_function(str(path), external_data={"model": model})  # type: ignore[attr-defined]


def load_policy(path: Path, *, model: TamiyoGNN) -> CompiledPolicy:
    """Read a policy written by ``save_policy``; ``model`` is the network it will be called with.

    Its own guard check is turned off: ``PreparedPolicy`` checks the guards itself before each
    call (to pick among the loaded functions), so a second check would only cost time.
    """
    with path.open("rb") as file:
        fn = torch.compiler.load_compiled_function(file, external_data={"model": model})
    fn.disable_guard_check()  # type: ignore[attr-defined]
    return fn  # type: ignore[return-value]


def vec_isa_record() -> Path | None:
    """Where a compiling process records the vector ISAs Inductor's probe found usable here."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return None if cache is None else Path(cache) / "tamiyo-aot" / "vec-isa.json"


def record_vec_isa() -> None:
    """Record the ISAs this process's probe found usable, if a compile made it probe (it caches
    the answer); a compile that generated no CPU code records nothing."""
    path = vec_isa_record()
    if path is not None and cpu_vec_isa.valid_vec_isa_list.cache_info().currsize > 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]))


@contextlib.contextmanager
def recorded_vec_isa() -> Iterator[None]:
    """Run the block without Inductor's vector-ISA probe when a recorded probe vouches for it.

    Loading a CPU kernel makes Inductor pick the vector ISA its flags were built for, and the
    first pick in a process probes every ISA the CPU lists by building and loading a test library
    in child processes: 1.2-1.6 s of the 2.5 s a cached load took on a 2-core machine. The
    warm-up child ran that probe on this machine and recorded what it found; when every ISA the
    CPU lists passed it, Inductor's own switch (``cpp.vec_isa_ok``) skips the probe with the same
    result. Otherwise (another CPU, an ISA that failed to build) the probe runs as usual.
    """
    path = vec_isa_record()
    probed = cpu_vec_isa.valid_vec_isa_list.cache_info().currsize > 0
    if probed or path is None or not path.exists():
        yield
        return
    with inductor_config.patch({"cpp.vec_isa_ok": True}):
        # The uncached function: what the switch would give, without fixing the process's answer.
        listed = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list.__wrapped__()]
    if json.loads(path.read_text()) != listed:
        yield
        return
    with inductor_config.patch({"cpp.vec_isa_ok": True}):
        yield
