"""morphogenesis: the main job. Compile kernels, then grow the network epoch by epoch."""

from __future__ import annotations

from prefect import flow
from prefect.states import Completed, State

from esper_core._capabilities import Device
from esper_core.run.recipes import RecipeRef
from esper_core.run.reports import RunSummary
from esper_core.run.scores import describe
from esper_core.run.spec import Epochs, GrowUntil, MaxFlops, MaxParams, Processes, Seed
from flows.compile_catalog import compile_planned
from tasks._runtime import settings
from tasks.artifacts import publish_run_artifacts
from tasks.plan import plan_run_spec
from tasks.train import finish, flow_run_id_default, grow, grow_parallel, kernels_ready, start_run, stop_recorded


@flow(name="morphogenesis", log_prints=True)
def morphogenesis(
    recipe: RecipeRef = "digits-mlp",
    epochs: Epochs | None = None,
    device: Device = "auto",
    seed: Seed | None = None,
    run_id: str | None = None,
    nproc: Processes = 1,
    policy: str | None = None,
    max_params: MaxParams | None = None,
    max_flops: MaxFlops | None = None,
    grow_until: GrowUntil | None = None,
) -> RunSummary | State:
    """Grow a network: compile its seed kernels (unless published), then train / decide / apply per epoch.

    Args:
        recipe: A built-in recipe (``esper recipes list``) or your own as
            ``package.module:function``, imported from the working directory.
        epochs: Override the recipe's epoch count.
        device: ``auto``, ``cpu`` or ``cuda``.
        seed: Override the recipe's random seed.
        run_id: Resume this run from its last committed epoch instead of starting a new one;
            default: named after the flow run, so a re-executed flow run resumes its own run.
        nproc: Data-parallel processes training the run together (``torch.distributed``: gloo
            on CPU, NCCL with one GPU a process). The recipe's batch is the global batch, shared
            among them; a resume may use another number.
        policy: Pin who decides: ``shipped`` (the default shipped policy), a shipped policy's
            name (``esper policy list``), ``heuristic``, ``gnn`` (the newest Simic version),
            ``gnn:<N>`` (version N) or ``none``; default: the
            recipe's own (the heuristic unless the recipe names another).
        max_params: Cap growth: the network may hold at most this many parameters
            (``KasminaConfig.max_params``); a germination past it is rejected.
        max_flops: Cap growth in compute: one sample's forward pass may cost at most this many
            FLOPs, every seed at full weight (``KasminaConfig.max_flops``).
        grow_until: Stop growth: the share of the run's epochs, in (0, 1], after which no seed
            germinates (``RiskConfig.grow_until``); default: the recipe's own.

    Epochs run in ``grow`` tasks of about ``ESPER_GROW_TASK_SECONDS`` each (default 10 s): long
    enough that Prefect's ~5 ms a task run is lost in the work, short enough that a long run shows
    its progress task by task.
    """
    # Planned once, first: a bad recipe (unknown name, bad import path, wrong return type, a
    # blueprint that fits no slot) fails the run here, before any work, with the message that says
    # what was expected. Every later task receives the plan (in memory) or its spec.
    planned = plan_run_spec(recipe, epochs, device, seed, run_id, nproc, policy, max_params, max_flops, grow_until)
    spec = planned.spec
    task_seconds = settings().grow_task_seconds
    # A signal (Cancel in the UI, a server shutdown) stops the run at once and leaves it resumable
    # from its last commit; the run folder then says so and how to go on.
    with stop_recorded(spec.run_id or flow_run_id_default()):
        if not kernels_ready(spec):
            compile_planned(recipe=spec.recipe, jobs=list(spec.jobs), device=device)
        if spec.nproc > 1:
            handle = grow_parallel(planned)
        else:
            start = start_run(planned)
            handle = start.handle
            epoch = start.next_epoch
            while epoch < start.epochs:
                epoch = grow(handle, epoch, start.epochs, task_seconds).next_epoch
        result = finish(handle)
    publish_run_artifacts(result.summary, result.history)
    summary = result.summary
    score = describe("test", loss=summary.test_loss, accuracy=summary.test_accuracy, tokens=summary.token_targets)
    print(f"run {summary.run_id}: {score}; seeds {summary.seeds}; outputs in {summary.run_dir}")
    if summary.degraded:
        # Completed, for the run did finish (and a retry would not help), but named Degraded in
        # the UI and the API, with the reasons, so a run that could not grow does not pass as a
        # healthy one. Called directly, the flow still returns the summary.
        return Completed(name="Degraded", message="; ".join(summary.degraded), data=summary)
    return summary
