"""morphogenesis: the main job. Compile kernels, then train, decide and apply every epoch."""

from __future__ import annotations

from prefect import flow

from esper_core.reports import RunSummary
from flows.compile_catalog import compile_catalog
from tasks.artifacts import publish_run_artifacts
from tasks.train import (
    apply_command,
    evaluate_epoch,
    finish,
    kernels_ready,
    run_history,
    start_run,
    train_epoch,
)


@flow(name="morphogenesis", log_prints=True)
def morphogenesis(
    recipe: str = "digits-mlp",
    epochs: int | None = None,
    device: str = "auto",
    seed: int | None = None,
    run_id: str | None = None,
) -> RunSummary:
    """Grow a network: compile its seed kernels (unless published), then train / decide / apply per epoch.

    Args:
        recipe: Named recipe (``digits-mlp``, ``seed-reference``).
        epochs: Override the recipe's epoch count.
        device: ``auto``, ``cpu`` or ``cuda``.
        seed: Override the recipe's random seed.
        run_id: Resume this run from its last committed epoch instead of starting a new one;
            default: named after the flow run, so a re-executed flow run resumes its own run.
    """
    if not kernels_ready(recipe, device):
        compile_catalog(recipe=recipe, device=device)
    start = start_run(recipe, epochs, device, seed, run_id)
    for epoch in range(start.next_epoch, start.epochs):
        train_epoch(start.handle, epoch)
        command = evaluate_epoch(start.handle, epoch)
        apply_command(start.handle, epoch, command)
    history = run_history(start.handle)
    summary = finish(start.handle)
    publish_run_artifacts(summary, history)
    print(
        f"run {summary.run_id}: test accuracy {summary.test_accuracy:.4f}; "
        f"seeds {summary.seeds}; outputs in {summary.run_dir}"
    )
    return summary
