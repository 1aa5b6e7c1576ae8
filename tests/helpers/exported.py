"""An exported program run where a user runs it: a fresh interpreter with torch and nothing of Esper's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch


def run_with_torch_alone(program: Path, inputs: list[torch.Tensor], workdir: Path) -> list[torch.Tensor]:
    """``torch.export.load(program).module()`` on each of ``inputs``, in a child interpreter that
    imports torch only (it fails if any ``esper`` module was loaded). Returns the outputs."""
    torch.save(inputs, workdir / "inputs.pt")
    load = (
        "import sys, torch\n"
        f"program = torch.export.load({str(program)!r}).module()\n"
        f"inputs = torch.load({str(workdir / 'inputs.pt')!r})\n"
        f"torch.save([program(x) for x in inputs], {str(workdir / 'outputs.pt')!r})\n"
        "assert not any(m.startswith('esper') for m in sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", load], check=True, cwd=workdir)
    outputs: list[torch.Tensor] = torch.load(workdir / "outputs.pt")
    return outputs
