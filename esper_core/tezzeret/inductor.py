"""Tezzeret's Inductor paths: AOTInductor packages and persisted compiler caches.

Only Tezzeret imports this module to compile. Kasmina's loader uses ``load_aoti`` and
``load_cache_artifacts``, which deserialise, never compile.

Caches: ``inductor_cache(dir)`` points Inductor (and Triton) at a directory under ``ESPER_HOME``
for the duration of a compile, so a later compile of the same kernels, in any process, reuses
the generated C++/Triton code and the compiled libraries (measured on 2 CPU cores: an AOTInductor
build of a small block 25 s cold, 5-9 s with the cache kept; whole-directory reuse is what makes
the difference, ``save_cache_artifacts`` alone sped a second process only 1.2x).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram

_CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


@contextmanager
def inductor_cache(cache_dir: Path | None) -> Iterator[None]:
    """Point Inductor's and Triton's on-disk caches at ``cache_dir`` while compiling.

    The environment variables are process-global: callers hold Tezzeret's compile lock, and the
    previous values are restored afterwards. Inductor memoises some cache paths in-process, so
    those memos are cleared on entry and exit (``torch._inductor.utils.clear_caches``, the hook
    ``fresh_cache`` uses).

    Args:
        cache_dir: The directory (created if absent); None leaves Inductor's default.
    """
    if cache_dir is None:
        yield
        return
    # Private but stable hook: the same one torch._inductor.utils.fresh_cache calls.
    from torch._inductor.utils import clear_caches

    cache_dir.mkdir(parents=True, exist_ok=True)
    saved = {name: os.environ.get(name) for name in _CACHE_ENV}
    clear_caches()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        clear_caches()


def compile_aoti(program: ExportedProgram) -> bytes:
    """Compile an exported program ahead of time into an AOTInductor package (bytes).

    The package keeps the program's dynamic batch dimension and its weights as constants that
    ``load_constants`` can replace (Kasmina swaps in trained weights without recompiling).
    ``always_keep_tensor_constants`` stops Inductor from folding weights into the library: by
    default it inlined a CPU convolution's biases, which then could not be swapped.
    """
    buffer = io.BytesIO()
    torch._inductor.aoti_compile_and_package(
        program, package_path=buffer, inductor_configs={"always_keep_tensor_constants": True}
    )
    return buffer.getvalue()


def load_aoti(package: bytes) -> Any:
    """Load an AOTInductor package (no compilation: it dlopens the library inside).

    Returns:
        The callable ``AOTICompiledModel``: forward only, no autograd, and it does **not** check
        its inputs' shapes (check the guard schema before calling it).
    """
    return torch._inductor.aoti_load_package(io.BytesIO(package))


def swap_weights(kernel: Any, state: Mapping[str, torch.Tensor]) -> None:
    """Load ``state`` (a module's ``state_dict``) into an AOTInductor kernel's constants.

    Raises:
        ValueError: The kernel lacks a constant for one of the state's floating tensors (it was
            folded into the library), so these weights cannot be served by it.
    """
    names = set(kernel.get_constant_fqns())
    missing = sorted(n for n, v in state.items() if n not in names and v.is_floating_point())
    if missing:
        raise ValueError(
            f"the AOTInductor kernel baked {missing} into its library, so trained weights cannot be "
            "swapped in: recompile it with this Esper (Tezzeret keeps every weight a constant)"
        )
    kernel.load_constants({n: v.detach() for n, v in state.items() if n in names}, check_full_update=False)


def compile_with_caches(module: nn.Module, inputs: Sequence[torch.Tensor]) -> bytes | None:
    """Compile ``module`` with Inductor (forward and backward) and return the mega-cache bytes.

    The "otherwise" path when AOTInductor does not work on a device: the exported program stays
    the artifact, and the compiled kernels are kept in the Inductor cache directory and in the
    returned ``torch.compiler.save_cache_artifacts`` bundle, so a later compile of the same
    kernels (Tolaria's compiled step, a re-compile on another machine) is a cache hit.

    Args:
        module: A trainable copy of the seed (its gradients are discarded).
        inputs: Representative inputs; each is run forward and backward once.

    Returns:
        The serialised cache artifacts, or None when Inductor recorded none. They may include
        other kernels compiled in this process: the recorder is process-wide.
    """
    compiled = torch.compile(module, dynamic=True)
    for x in inputs:
        compiled(x.detach().requires_grad_(True)).sum().backward()
    module.zero_grad(set_to_none=True)
    saved = torch.compiler.save_cache_artifacts()
    return None if saved is None else saved[0]


def load_cache_artifacts(blob: bytes) -> None:
    """Pre-populate this process's compiler caches from a mega-cache bundle (no compilation)."""
    torch.compiler.load_cache_artifacts(blob)
