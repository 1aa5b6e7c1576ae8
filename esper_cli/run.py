"""``esper run``: the morphogenesis flow."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from esper_cli.args import local_flow_settings, policy_choice, positive, prefect_for_command, share
from esper_cli.choices import DEVICES, RECIPES
from esper_cli.startup import StartupPhases, first_epoch_time

EXIT_DEGRADED = 3
"""``esper run``'s exit code for a run that finished degraded (``RunSummary.degraded``)."""


def _cmd_run(args: argparse.Namespace) -> int:
    # First: a temporary Prefect server starts in the background while the run is planned and checked.
    phases = StartupPhases()
    server = prefect_for_command()
    from esper_core.run.preflight import preflight
    from esper_core.run.reports import frontier_lines, yardstick_lines
    from esper_core.run.scores import bits
    from esper_core.run.spec import check_resume, plan_spec
    from esper_core.settings import EsperSettings

    phases.mark("imports")
    # A bad recipe (unknown name, bad import path, wrong return type, a slot the model cannot
    # take, a blueprint that fits no slot) or a batch the processes cannot share fails here,
    # before any flow run exists, with the message that says what was expected.
    # The flow plans again in its first task: its parameters are the request, not this plan (a
    # flow parameter is serialised, and a deployment is asked by the same parameters).
    planned = plan_spec(
        args.recipe,
        epochs=args.epochs,
        device=args.device,
        seed=args.seed,
        run_id=args.run_id,
        nproc=args.nproc,
        policy=args.policy,
        max_params=args.max_params,
        max_flops=args.max_flops,
        grow_until=args.grow_until,
    )
    phases.mark("plan")
    settings = EsperSettings()
    if args.run_id is not None:
        # A resume whose controller now resolves differently is refused here, not in a flow task.
        check_resume(settings.runs_dir / args.run_id, planned)
    # The home, the registry and one batch through the model and loss: each failure one line, exit 2.
    preflight(planned.config, planned.data, settings=settings)
    phases.mark("checks")
    from flows.morphogenesis import morphogenesis

    phases.mark("prefect import")
    with local_flow_settings(server):
        phases.mark("server ready" if server is not None else "server (running)")
        summary = morphogenesis(
            recipe=args.recipe,
            epochs=args.epochs,
            device=args.device,
            seed=args.seed,
            run_id=args.run_id,
            nproc=args.nproc,
            policy=args.policy,
            max_params=args.max_params,
            max_flops=args.max_flops,
            grow_until=args.grow_until,
        )
    if args.verbose:
        print(
            phases.describe(server, first_epoch_at=first_epoch_time(summary.run_dir, after=phases.started)),
            file=sys.stderr,
        )
    print()
    print(f"run        {summary.run_id} ({summary.recipe}, {summary.epochs} epochs, {summary.device})")
    if summary.token_targets:
        # A language model: its cross-entropy per token in bits (per character for a character model).
        print(f"bits/token test {bits(summary.test_loss):.4f}  val {bits(summary.val_loss):.4f}")
        print(f"loss       test {summary.test_loss:.4f}  val {summary.val_loss:.4f} (nats per token)")
    else:
        print(f"accuracy   test {summary.test_accuracy:.4f}  val {summary.val_accuracy:.4f}")
        print(f"loss       test {summary.test_loss:.4f} ({bits(summary.test_loss):.3f} bits per target)")
    print(f"params     host {summary.host_params}  total {summary.total_params}")
    shares = " + ".join(map(str, summary.batch_per_process))
    print(
        f"training   {summary.processes} process{'es' if summary.processes > 1 else ''}, global batch "
        f"{summary.batch_size} ({shares} per process), learning rate {summary.learning_rate:g}"
    )
    for slot, stage in summary.seeds.items():
        print(f"seed       {slot}: {stage}")
    if summary.yardstick is not None:
        for line in yardstick_lines(summary.yardstick):
            print(f"yardstick  {line.removeprefix('- ')}")
    if summary.frontier is not None:
        for line in frontier_lines(summary.frontier):
            print(f"frontier   {line.removeprefix('- ')}")
    print(f"commands   {summary.commands}")
    if summary.policy is not None:
        print(f"policy     {_decided_by(summary.policy)}")
    mib = summary.checkpoints["bytes"] / 2**20
    print(f"checkpoints {summary.checkpoints['files']} kept, {mib:.1f} MiB")
    print(
        f"tamiyo     worst decision {summary.tamiyo_decision_max_ms:.0f} ms, {summary.tamiyo_timeouts} deadline misses, "
        f"{summary.deadline_overruns} overruns observed only"
    )
    if summary.step_path:
        cost = f"; compile {summary.compile_trial_ms / 1e3:.1f} s ({summary.compile_trial_share:.1%} of training)"
        print(f"step       {summary.step_path}{cost if summary.compile_trial_ms else ''}")
    if not summary.reproducible:
        print(f"NOT REPRODUCIBLE: acted on the wall clock ({'; '.join(summary.load_dependence)})")
    print(f"outputs    {summary.run_dir}/ (summary.json, telemetry.jsonl, baseline.json, report.md)")
    for reason in summary.degraded:
        print(f"DEGRADED   {reason}", file=sys.stderr)
    # 3: finished, but did less than asked (the flow run's state is Degraded); scripts can tell.
    return EXIT_DEGRADED if summary.degraded else 0


def _decided_by(record: dict[str, Any]) -> str:
    """``RunSummary.policy`` in a line: who decided and which weights."""
    if record["policy"] == "shipped":
        served = f"served as {record['served']}" if record["served"] else "NOT served: the heuristic decided"
        return f"shipped {record['name']} (sha256 {record['sha256'][:12]}, {served})"
    return f"{record['policy']}" + (f" (served {record['served']})" if record.get("served") else "")


def _cmd_rank(args: argparse.Namespace) -> int:
    from esper_core.run.ranks import join_torchrun
    from tasks._runtime import run_sink, settings

    handle = join_torchrun(
        run_id=args.run_id,
        recipe=args.recipe,
        settings=settings(),
        epochs=args.epochs,
        device=args.device,
        seed=args.seed,
        timeout_s=args.timeout_s,
        sink_factory=run_sink,
    )
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"run {handle.run_id}: trained on {os.environ.get('WORLD_SIZE')} processes; outputs in {handle.run_dir}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run`` to the top-level subcommands."""
    run = sub.add_parser("run", help="run the morphogenesis flow (compile, train, grow)")
    # Not argparse choices: a recipe may also be named by its import path (package.module:function).
    run.add_argument(
        "--recipe",
        default="digits-mlp",
        metavar="RECIPE",
        help=f"a built-in recipe ({', '.join(RECIPES)}; `esper recipes list`) or your own as "
        "package.module:function, imported from the working directory (default: %(default)s)",
    )
    run.add_argument("--epochs", type=positive, default=None, help="override the recipe's epoch count")
    run.add_argument("--device", default="auto", choices=DEVICES, help="where to train (default: %(default)s)")
    run.add_argument("--seed", type=int, default=None, help="override the recipe's random seed")
    run.add_argument("--run-id", default=None, help="resume this run from its last committed epoch")
    run.add_argument(
        "--nproc",
        type=positive,
        default=1,
        help="data-parallel processes training the run together (torch.distributed: gloo on CPU, NCCL "
        "with one GPU each); the recipe's batch is shared among them (default: %(default)s)",
    )
    run.add_argument(
        "--policy",
        default=None,
        type=policy_choice,
        metavar="POLICY",
        help="who decides: shipped (the GNN policy shipped with Esper), a "
        "shipped policy's name (`esper policy list`), heuristic, gnn (the registry's newest Simic version), "
        "gnn:N (version N, e.g. what `esper policy tune` published) or none (no growth); default: the recipe's own",
    )
    run.add_argument(
        "--max-params",
        type=positive,
        default=None,
        help="cap growth: the network may hold at most this many parameters; a germination past it is rejected",
    )
    run.add_argument(
        "--max-flops",
        type=positive,
        default=None,
        help="cap growth in compute: one sample's forward pass may cost at most this many FLOPs (every seed at "
        "full weight); a germination past it is rejected",
    )
    run.add_argument(
        "--grow-until",
        type=share,
        default=None,
        metavar="SHARE",
        help="stop growth: the share of the run's epochs after which no seed germinates, in (0, 1] (e.g. 0.25: "
        "the first quarter; seeds already growing finish); fewer FLOPs, often a less accurate network; "
        "default: the recipe's own",
    )
    run.set_defaults(func=_cmd_run)

    rank = sub.add_parser(
        "rank",
        help="train a run as one rank of a torchrun group (several machines; one machine: esper run --nproc)",
        description="Run under torchrun on every node, e.g. `torchrun --nnodes 2 --nproc-per-node 4 "
        "--rdzv-endpoint HOST:29400 -m esper_cli rank --run-id R --recipe mnist1d-cnn-width`, with the same "
        "Esper environment and an ESPER_HOME every node sees. Rank 0 creates or resumes the run and writes it.",
    )
    rank.add_argument("--run-id", required=True, help="the run; an existing one resumes from its last commit")
    rank.add_argument(
        "--recipe", default="digits-mlp", metavar="RECIPE", help="a built-in recipe or package.module:function"
    )
    rank.add_argument("--epochs", type=positive, default=None, help="override the recipe's epoch count (a new run)")
    rank.add_argument("--device", default="auto", choices=DEVICES, help="cuda: one GPU per local rank")
    rank.add_argument("--seed", type=int, default=None, help="override the recipe's random seed (a new run)")
    rank.add_argument(
        "--timeout-s", type=float, default=300.0, help="how long a rank waits for the others (default: %(default)s)"
    )
    rank.set_defaults(func=_cmd_rank)
