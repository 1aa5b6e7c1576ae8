"""A grown network leaves Esper as standard PyTorch artifacts (``esper export RUN_ID``).

From the run's last commit, the user's model as it stands (every merged width included, every
fossilised branch seed as a plain residual block after the module it grew on, Esper's slot hooks
left out: ``GrowableModel.plain_copy`` and ``SeedManager.copy_fossils_into``) is written three ways:

- ``model.pt2``: a ``torch.export`` program with a dynamic batch dimension, and for a causal
  language model (``ModelSpec(causal=True)``) a dynamic sequence length from 1 up to the length it
  trained on, loadable with torch alone (``torch.export.load(path).module()``);
- ``state_dict.pt``: ``{"widths": {layer: units}, "state_dict": ...}``, for loading into the
  user's own class built at those widths;
- ``export.json``: what was exported (run, commit, widths, parameters, the check below).

The exported program is checked against the live model on validation samples (for a language
model at lengths 1, half the context and the context) before anything is written, so a program
that computes something else never reaches disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from esper_core.kasmina.graft import GrowableModel
from esper_core.run.config import ModelSpec
from esper_core.run.session import Run
from esper_core.settings import EsperSettings

EXPORT_FILES = ("model.pt2", "state_dict.pt", "export.json")
_CHECK_SAMPLES = 8


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportedModel:
    """Where an export went and what it holds.

    Attributes:
        directory: The folder holding ``EXPORT_FILES``.
        widths: Each weight layer's output width in the exported network.
        parameters: Parameters of the exported network.
        max_abs_diff: Largest difference between the program's and the live model's outputs on
            the check samples.
    """

    directory: Path
    widths: dict[str, int]
    parameters: int
    max_abs_diff: float


def export_run(*, settings: EsperSettings, run_id: str, out: Path | None = None) -> ExportedModel:
    """Export run ``run_id``'s network at its last commit to ``out`` (default: the run's
    ``export/`` folder).

    Raises:
        ValueError: no such run; a built-in host (only a ``ModelSpec`` model is exported); a
            seed on trial (blending or probationary) that changes the output without being part
            of the network yet; a program whose outputs differ from the live model's.
    """
    session = Run.resume(settings=settings, run_id=run_id)
    try:
        host = session.trainer.model
        if not isinstance(host, GrowableModel):
            raise ValueError(
                f"run {run_id} trains the built-in host of recipe {session.config.recipe}; esper export writes "
                "a user's model (ModelSpec): grow your own nn.Module to take it out of Esper"
            )
        model = host.plain_copy()
        session.manager.copy_fossils_into(model)
        model = model.cpu().eval()
        x, _ = session.trainer.data.val.head(_CHECK_SAMPLES)
        x = x.cpu()
        dims: dict[int, Any] = {0: torch.export.Dim("batch", min=1)}
        # A causal model's output at t reads positions <= t only, so any prefix of its context is
        # a valid input: the program takes lengths 1..context, as generation needs.
        sequence = isinstance(session.config.host, ModelSpec) and session.config.host.causal and x.dim() >= 2
        if sequence:
            dims[1] = torch.export.Dim("length", min=1, max=int(x.shape[1]))
        program = torch.export.export(model, (x,), dynamic_shapes=(dims,))
        lengths = sorted({1, max(1, x.shape[1] // 2), x.shape[1]}) if sequence else []
        diff = 0.0
        for part in [x[:, :n] for n in lengths] if sequence else [x]:
            with torch.inference_mode():
                want = model(part)
                got = program.module()(part)
            diff = max(diff, float((want - got).abs().max()))
            # The program may run other kernels (decomposed ops, another reduction order): float32
            # rounding, not a different function.
            if not torch.allclose(want, got, rtol=1e-4, atol=1e-5):
                raise ValueError(
                    f"the exported program of run {run_id} differs from the live model by {diff:.3g} on "
                    f"{_CHECK_SAMPLES} validation samples{f' of length {part.shape[1]}' if sequence else ''}; nothing "
                    "was written. Report it with the recipe"
                )
        widths = dict(zip(host.layer_names, host.layer_widths, strict=True))
        parameters = sum(p.numel() for p in model.parameters())
        directory = out or session.run_dir / "export"
        directory.mkdir(parents=True, exist_ok=True)
        torch.export.save(program, directory / "model.pt2")
        torch.save({"widths": widths, "state_dict": model.state_dict()}, directory / "state_dict.pt")
        manifest = {
            "run_id": run_id,
            "recipe": session.config.recipe,
            "commit": session.committed_tag,
            "epochs_trained": session.epoch,
            "widths": widths,
            "parameters": parameters,
            "input_shape": list(x.shape[1:]),
            "dynamic": {"batch": "1..", **({"length": f"1..{x.shape[1]}"} if sequence else {})},
            "input_dtype": str(x.dtype).removeprefix("torch."),
            "check": {"samples": int(x.shape[0]), **({"lengths": lengths} if sequence else {}), "max_abs_diff": diff},
            "load": "torch.export.load('model.pt2').module()(x)",
        }
        (directory / "export.json").write_text(json.dumps(manifest, indent=2) + "\n")
        return ExportedModel(directory=directory, widths=widths, parameters=parameters, max_abs_diff=diff)
    finally:
        session.close()
