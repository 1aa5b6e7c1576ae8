"""morphogenesis: the main job. Compile kernels, then train, decide and apply every epoch."""

from __future__ import annotations

from prefect import flow

from esper_core.reports import RunSummary
from flows.compile_catalog import compile_catalog
from tasks.artifacts import publish_run_artifacts
from tasks.train import apply_command, evaluate_epoch, finish, start_run, train_epoch


@flow(name="morphogenesis", log_prints=True)
def morphogenesis(
    recipe: str = "digits-mlp",
    epochs: int | None = None,
    device: str = "auto",
    seed: int | None = None,
    run_id: str | None = None,
) -> RunSummary:
    """Grow a network: compile its seed kernels, then train / decide / apply per epoch.

    Args:
        recipe: Named recipe (``digits-mlp``, ``seed-reference``).
        epochs: Override the recipe's epoch count.
        device: ``auto``, ``cpu`` or ``cuda``.
        seed: Override the recipe's random seed.
        run_id: Resume this run from its last committed epoch instead of starting a new one.
    """
    compile_catalog(recipe=recipe, device=device)
    start = start_run(recipe, epochs, device, seed, run_id)
    rows = []
    for epoch in range(start.next_epoch, start.epochs):
        report = train_epoch(start.handle, epoch)
        command = evaluate_epoch(start.handle, epoch)
        outcome = apply_command(start.handle, epoch, command)
        rows.append(
            {
                "epoch": epoch,
                "val_loss": round(report.val_loss, 4),
                "val_accuracy": round(report.val_accuracy, 4),
                "action": command.action,
                "slot": command.slot_id or "",
                "outcome": outcome,
            }
        )
    summary = finish(start.handle)
    publish_run_artifacts(summary, rows)
    print(
        f"run {summary.run_id}: test accuracy {summary.test_accuracy:.4f}; "
        f"seeds {summary.seeds}; outputs in {summary.run_dir}"
    )
    return summary
