"""A grown network leaves Esper as standard PyTorch artifacts (``esper export RUN_ID``).

From the run's last commit, the user's model as it stands (every merged width and depth included,
every fossilised branch seed as a plain residual block after the module it grew on, Esper's slot
hooks left out: ``GrowableModel.plain_copy`` and ``SeedManager.copy_fossils_into``) is written
three ways:

- ``model.pt2``: a ``torch.export`` program with a dynamic batch dimension, and for a causal
  language model (``ModelSpec(causal=True)``) a dynamic sequence length from 1 up to the length it
  trained on, loadable with torch alone (``torch.export.load(path).module()``);
- ``state_dict.pt``: ``{"widths": {layer: units}, "state_dict": ...}``, for loading into the
  user's own class built at those widths;
- ``export.json``: what was exported (run, commit, widths, parameters, the check below).

The exported program is checked against the live model on validation samples (for a language
model at lengths 1, half the context and the context) before anything is written, so a program
that computes something else never reaches disk.

An export reads the run and changes nothing of it: it builds the trainer and loads the last
commit into it, without a ``Run`` session. A session would also build Tamiyo's service (and import
torch-geometric for its graphs), open the Simic records, send the commit's unsent telemetry and
clear a stopped run's stop record, none of which an export wants (issue 38: ``esper export`` went
over its 5 s).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from esper_core.contracts import KernelArtifact
from esper_core.karn.entries import default_catalog
from esper_core.kasmina.graft import GrowableModel
from esper_core.kasmina.loader import LoadedKernel, load_kernel
from esper_core.run.build import build_trainer, load_run_data
from esper_core.run.commits import CHECKPOINTS_DIR
from esper_core.run.config import ModelSpec
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings
from esper_core.tolaria.checkpoint import CheckpointCorruptError, CheckpointStore
from esper_core.urza.service import Urza

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
        ValueError: no such run, one without a commit, or one whose last commit is damaged; a
            built-in host (only a ``ModelSpec`` model is exported); a seed on trial (blending or
            probationary) that changes the output without being part of the network yet; a program
            whose outputs differ from the live model's.
    """
    run_dir = settings.runs_dir / run_id
    config = RunSpec.load(run_dir).config()
    checkpoints = CheckpointStore(run_dir / CHECKPOINTS_DIR, retention=config.checkpoints)
    tag = checkpoints.latest()
    if tag is None:
        raise ValueError(f"run {run_id} has no commit under {checkpoints.root} yet: there is no network to export")
    catalog = default_catalog()
    trainer = build_trainer(config, catalog=catalog, run_id=run_id, home=settings.home, data=load_run_data(config))
    registry: list[Urza] = []  # opened by the first seed kernel the commit holds, if any

    def fetch(artifact: KernelArtifact) -> LoadedKernel:
        if not registry:
            registry.append(Urza.open(settings.home, settings.registry_db_url))
        return load_kernel(artifact, registry[0].fetch_blob(artifact), catalog=catalog, device=trainer.device)

    try:
        try:
            state = checkpoints.load(tag)
        except CheckpointCorruptError as e:
            # Read-only: resuming the run sets a damaged commit aside and goes back to the last
            # intact one; an export does not move the run's files.
            raise ValueError(
                f"run {run_id}'s last commit {tag} is damaged ({e.problem}); `esper runs show {run_id}` "
                f"checks its checkpoints, and resuming it with `esper run --run-id {run_id}` goes back to "
                "the last intact one"
            ) from e
        trainer.load_state_dict(state["trainer"], load_kernel=fetch)
    finally:
        for urza in registry:
            urza.close()
    host = trainer.model
    if not isinstance(host, GrowableModel):
        raise ValueError(
            f"run {run_id} trains the built-in host of recipe {config.recipe}; esper export writes "
            "a user's model (ModelSpec): grow your own nn.Module to take it out of Esper"
        )
    model = host.plain_copy()
    trainer.manager.copy_fossils_into(model)
    model = model.cpu().eval()
    x, _ = trainer.data.val.head(_CHECK_SAMPLES)
    x = x.cpu()
    dims: dict[int, Any] = {0: torch.export.Dim("batch", min=1)}
    # A causal model's output at t reads positions <= t only, so any prefix of its context is
    # a valid input: the program takes lengths 1..context, as generation needs.
    sequence = isinstance(config.host, ModelSpec) and config.host.causal and x.dim() >= 2
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
    directory = out or run_dir / "export"
    directory.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, directory / "model.pt2")
    torch.save({"widths": widths, "state_dict": model.state_dict()}, directory / "state_dict.pt")
    manifest = {
        "run_id": run_id,
        "recipe": config.recipe,
        "commit": tag,
        "epochs_trained": trainer.epoch,
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
