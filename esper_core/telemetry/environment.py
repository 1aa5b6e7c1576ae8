"""Capture the environment a measurement was taken in, for baselines and reports.

A latency number means little without the device, the torch build and the numeric flags that
were active (TF32, matmul precision, cuDNN benchmark, thread count), so every baseline embeds
``capture_environment``'s dict.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from typing import Any

import torch


def _legacy_tf32_flags() -> dict[str, Any]:
    """The legacy ``allow_tf32`` flags.

    Since torch 2.9 reading a legacy flag raises ``RuntimeError`` once a process has mixed the
    legacy and the new (``fp32_precision``) API; the new-API values are captured separately, so
    record the conflict instead of failing the whole capture.
    """
    flags: dict[str, Any] = {}
    for key, backend in (
        ("cuda_matmul_allow_tf32", torch.backends.cuda.matmul),
        ("cudnn_allow_tf32", torch.backends.cudnn),
    ):
        try:
            flags[key] = bool(backend.allow_tf32)
        except RuntimeError:
            flags[key] = "unreadable: legacy and new TF32 APIs were mixed"
    return flags


def _fp32_precision() -> dict[str, str]:
    """The new-API (torch >= 2.9) per-backend fp32 precision settings."""
    # The ignores: torch's type stubs lag behind this runtime API.
    return {
        "global": torch.backends.fp32_precision,  # type: ignore[attr-defined]
        "cuda_matmul": torch.backends.cuda.matmul.fp32_precision,
        "cudnn": torch.backends.cudnn.fp32_precision,
        "cudnn_conv": torch.backends.cudnn.conv.fp32_precision,  # type: ignore[attr-defined]
        "cudnn_rnn": torch.backends.cudnn.rnn.fp32_precision,  # type: ignore[attr-defined]
        "mkldnn": torch.backends.mkldnn.fp32_precision,
    }


def _nvidia_driver_version() -> str | None:
    """The NVIDIA driver version from ``nvidia-smi``, or None where it is not installed.

    torch exposes the CUDA runtime version but not the driver's; ``nvidia-smi`` is the one
    portable source. It runs once per baseline, so its ~50 ms do not matter.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        result = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        # A hung or broken nvidia-smi must not stop a baseline from being written.
        return None
    lines = result.stdout.strip().splitlines()
    return lines[0].strip() if result.returncode == 0 and lines else None


def capture_environment(device: torch.device | str) -> dict[str, Any]:
    """Describe the software, hardware and numeric flags a measurement runs under.

    Args:
        device: The device the workload runs on (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...).

    Returns:
        A JSON-serialisable dict: ``python``, ``platform``, ``machine``, ``torch``, ``device``,
        ``device_kind``, ``device_name``, ``cuda_version``, ``cudnn_version``,
        ``driver_version``, ``gpu_capability``, ``gpu_memory_bytes``, ``cpu_count``,
        ``cpu_affinity``, ``num_threads``, ``num_interop_threads``,
        ``float32_matmul_precision``, ``fp32_precision`` (new-API settings),
        ``cuda_matmul_allow_tf32``, ``cudnn_allow_tf32``, ``cudnn`` (enabled, benchmark,
        deterministic) and ``deterministic_algorithms``. CUDA-only fields are None on CPU.

    Raises:
        ValueError: If ``device`` is a CUDA device but CUDA is not available.
    """
    dev = torch.device(device)
    is_cuda = dev.type == "cuda"
    if is_cuda and not torch.cuda.is_available():
        raise ValueError(
            f"device {dev} requested but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); pass device='cpu' or install a CUDA build of torch"
        )
    if is_cuda:
        props = torch.cuda.get_device_properties(dev)
        device_name: str = props.name
        capability: str | None = f"{props.major}.{props.minor}"
        memory: int | None = int(props.total_memory)
        driver = _nvidia_driver_version()
    else:
        device_name, capability, memory, driver = dev.type, None, None, None
    cudnn_version = torch.backends.cudnn.version() if is_cuda else None
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "device": str(dev),
        "device_kind": dev.type,
        "device_name": device_name,
        "cuda_version": torch.version.cuda,
        "cudnn_version": cudnn_version,
        "driver_version": driver,
        "gpu_capability": capability,
        "gpu_memory_bytes": memory,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(affinity) if affinity is not None else None,
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "fp32_precision": _fp32_precision(),
        **_legacy_tf32_flags(),
        "cudnn": {
            "enabled": bool(torch.backends.cudnn.enabled),
            "benchmark": bool(torch.backends.cudnn.benchmark),
            "deterministic": bool(torch.backends.cudnn.deterministic),
        },
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }
