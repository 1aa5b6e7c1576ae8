"""A data-parallel run: one run trained by N processes (``torch.distributed``), growing as one.

``launch`` checks the run against the number of processes before anything starts, then starts
N ranks with ``torch.multiprocessing`` (spawned: no inherited threads or CUDA state) that meet
through a file store in a fresh temporary folder, with gloo on CPU and NCCL on CUDA (one GPU a
rank). Every rank builds or reopens the same run and steps through its epochs in lockstep
(``Run`` with a ``ProcessGroup`` collective):

- each rank trains on its shard of every global batch (the recipe's ``batch_size`` is the global
  batch, so the effective batch and learning rate are the single-process run's), gradients are
  summed over the ranks after every backward (``tolaria.collective``);
- validation, probes and gates run whole on every rank, on identical weights, so every rank
  reaches the single-process verdicts; rank 0 decides and broadcasts Tamiyo's command, every rank
  applies it, and a command one rank cannot apply is undone on all;
- rank 0 writes the checkpoints, telemetry and Simic's records; every commit checks that all ranks
  hold the same model bit for bit.

A rank that dies (killed, out of memory, an error) fails the run: the others stop at their next
collective (the store notices the lost peer, or ``timeout_s`` passes) and ``launch`` raises
``ParallelRunFailed`` naming the rank and the last commit. A resume by run id continues from that
commit on any number of ranks (or in one process).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from esper_core._capabilities import resolve_device
from esper_core.run.build import load_run_data
from esper_core.run.commits import CHECKPOINTS_DIR, epoch_tag
from esper_core.run.config import RunConfig
from esper_core.run.outage import open_registry
from esper_core.run.plan import check_recipe
from esper_core.run.session import Run, RunHandle
from esper_core.run.spec import PlannedRun, RunSpec, check_parallel, check_same_controller
from esper_core.run.spec_file import SPEC_FILE
from esper_core.run.steps import decide_and_apply
from esper_core.settings import EsperSettings
from esper_core.telemetry import TelemetrySink
from esper_core.tolaria.checkpoint import CheckpointStore
from esper_core.tolaria.collective import Collective, ProcessGroup, Solo
from esper_core.tolaria.safety import TrainingHalted

LAUNCHES_FILE = "launches.json"
"""Every launch of a run, oldest first: processes, backend, batch per rank, process ids."""
STOP_GRACE_S = 5.0
"""How long a rank gets to exit after SIGTERM when the launch stops (then SIGKILL)."""

SinkFactory = Callable[[str, str], TelemetrySink]
"""``(run_id, recipe) -> sink``: rank 0's extra telemetry sink, built in its own process (a sink
holds sockets and threads, so it cannot be sent; a module-level function can)."""


class ParallelRunFailed(RuntimeError):
    """A rank of a data-parallel run failed; the run stands at its last commit."""


def launch(
    spec: RunSpec,
    settings: EsperSettings,
    *,
    sink_factory: SinkFactory | None = None,
    planned: PlannedRun | None = None,
    timeout_s: float = 300.0,
) -> RunHandle:
    """Train ``spec``'s run to its last epoch on ``spec.nproc`` processes (a new run, or a resume).

    ``spec.run_id`` names the run: an existing one resumes from its last commit (any ``nproc``);
    ``epochs``, ``device`` and ``seed`` apply to a new run only, as with ``esper run``. On CUDA
    each process needs its own GPU. ``timeout_s``: how long a rank waits in a collective for the
    others before it gives up, long enough for the slowest step between two collectives (a
    germination's initialisation, a checkpoint), short enough that a hung peer fails the run.

    ``planned``: the run as ``esper_core.run.spec.plan_spec`` resolved, planned and checked it for
    these processes in this one (the morphogenesis flow's), used for a new run instead of resolving
    it again here; each rank still resolves it in its own process.

    Raises:
        ValueError: the run cannot be shared by ``spec.nproc`` ranks (``check_parallel``), or the
            recipe is bad; nothing has started.
        TrainingHalted: the run halted itself after repeated failed epochs.
        ParallelRunFailed: a rank failed or died; the run stands at its last commit.
    """
    if not spec.run_id:
        raise ValueError("a data-parallel run needs a run_id (its ranks meet on it)")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    run_dir = settings.runs_dir / spec.run_id
    new = not (run_dir / SPEC_FILE).exists()
    if new and planned is not None:
        config, train_samples = planned.config, len(planned.data.train)  # plan_spec checked the recipe
    else:
        config = spec.config() if new else RunSpec.load(run_dir).config()
        if not new:
            check_same_controller(run_dir, config)
        check_recipe(config)
        train_samples = len(load_run_data(config).train)
    check_parallel(config, spec.nproc, train_samples=train_samples)
    if new:
        spec.save(run_dir, config=config)
    # The registry's schema exists before N processes open it at once.
    open_registry(settings).close()
    meeting = Path(tempfile.mkdtemp(prefix="esper-ranks-"))
    context = mp.start_processes(
        _rank_main,
        args=(spec, settings, new, str(meeting / "store"), sink_factory, timeout_s),
        nprocs=spec.nproc,
        join=False,
        start_method="spawn",
    )
    try:
        # join() returns True when every rank is done, raises when one failed (and stops the rest).
        while not context.join():
            pass
    except mp.ProcessRaisedException as e:
        if "TrainingHalted" in str(e):
            raise TrainingHalted(_last_line(str(e))) from None
        raise ParallelRunFailed(_failure(spec, settings, f"rank {e.error_index} failed: {_last_line(str(e))}")) from e
    except mp.ProcessExitedException as e:
        how = f"was killed by {e.signal_name}" if e.signal_name else f"exited with code {e.exit_code}"
        raise ParallelRunFailed(_failure(spec, settings, f"rank {e.error_index} {how}")) from e
    finally:
        # Also when this process is interrupted while it waits (a task's time limit, Ctrl-C): no
        # rank outlives the launch.
        _stop(context.processes)
        shutil.rmtree(meeting, ignore_errors=True)
    return RunHandle(run_id=spec.run_id, run_dir=str(run_dir))


def _stop(processes: list[mp.Process]) -> None:
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(STOP_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join()


def _failure(spec: RunSpec, settings: EsperSettings, what: str) -> str:
    assert spec.run_id, "launch refuses a spec without a run id"
    latest = CheckpointStore(settings.runs_dir / spec.run_id / CHECKPOINTS_DIR).latest()
    return (
        f"data-parallel run {spec.run_id} stopped: {what}. The run stands at its last commit "
        f"({latest or 'none'}); resume it with `esper run --run-id {spec.run_id} --nproc N` (any N, 1 included)."
    )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text


def _rank_main(
    rank: int,
    spec: RunSpec,
    settings: EsperSettings,
    new: bool,
    store: str,
    sink_factory: SinkFactory | None,
    timeout_s: float,
) -> None:
    """One rank started by ``launch``: join the group, then ``train_rank``."""
    # The machine's cores are shared among the ranks (what torchrun does with OMP_NUM_THREADS).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.nproc))
    assert spec.run_id, "launch refuses a spec without a run id"
    config = RunSpec.load(settings.runs_dir / spec.run_id).config()
    backend = _backend(config)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    if spec.nproc > 1:
        dist.init_process_group(
            backend,
            init_method=f"file://{store}",
            rank=rank,
            world_size=spec.nproc,
            timeout=timedelta(seconds=timeout_s),
        )
    try:
        # One rank exchanges nothing: the single-process path, in a process of its own.
        group: Collective = ProcessGroup() if spec.nproc > 1 else Solo()
        train_rank(
            group,
            config,
            settings=settings,
            run_id=spec.run_id,
            new=new,
            backend=backend if spec.nproc > 1 else "none",
            sink_factory=sink_factory,
        )
    finally:
        if spec.nproc > 1:
            dist.destroy_process_group()


def join_torchrun(
    *,
    run_id: str,
    recipe: str,
    settings: EsperSettings,
    epochs: int | None = None,
    device: str | None = None,
    seed: int | None = None,
    timeout_s: float = 300.0,
    sink_factory: SinkFactory | None = None,
) -> RunHandle:
    """Train ``run_id`` as one rank of a group that ``torchrun`` started (one node or several).

    The rank, the world and the rendezvous come from torchrun's environment (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); every node needs the same
    Esper environment and an ``ESPER_HOME`` they all see (a shared path), since rank 0 writes the
    run there and the others read it. Rank 0 creates the run (or finds it, and every rank resumes
    it) and checks it against the world size; a refusal stops every rank with the same message.

    Raises:
        ValueError: not under torchrun, or the run cannot be shared by the world (every rank).
    """
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ValueError(
            f"{', '.join(missing)} not set: start `esper rank` with torchrun, e.g. "
            "`torchrun --standalone --nproc-per-node 2 -m esper_cli rank --run-id R --recipe mnist1d-cnn-width`; "
            "on one machine `esper run --nproc 2` does it for you"
        )
    requested = resolve_device(device or "auto")
    backend = "nccl" if requested.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout_s))
    try:
        group = ProcessGroup()
        run_dir = settings.runs_dir / run_id
        problem, new = None, False
        if group.leader:
            new = not (run_dir / SPEC_FILE).exists()
            asked = RunSpec(recipe=recipe, epochs=epochs, device=device, seed=seed, run_id=run_id, nproc=group.world)
            try:
                config = asked.config() if new else RunSpec.load(run_dir).config()
                if not new:
                    check_same_controller(run_dir, config)
                check_recipe(config)
                check_parallel(config, group.world, train_samples=len(load_run_data(config).train))
                if new:
                    asked.save(run_dir, config=config)
                open_registry(settings).close()
            except ValueError as e:
                problem = str(e)
        problem, new = group.broadcast((problem, new))
        if problem is not None:
            raise ValueError(problem)
        config = RunSpec.load(run_dir).config()
        train_rank(group, config, settings=settings, run_id=run_id, new=new, backend=backend, sink_factory=sink_factory)
    finally:
        dist.destroy_process_group()
    return RunHandle(run_id=run_id, run_dir=str(settings.runs_dir / run_id))


def train_rank(
    group: Collective,
    config: RunConfig,
    *,
    settings: EsperSettings,
    run_id: str,
    new: bool,
    backend: str,
    sink_factory: SinkFactory | None,
) -> None:
    """Build (``new``) or reopen the run on this rank and train it to its last epoch in lockstep."""
    extra = sink_factory(run_id, config.recipe) if sink_factory is not None and group.leader else None
    if new:
        session = Run.start(config, settings=settings, run_id=run_id, extra_sink=extra, collective=group)
    else:
        session = Run.resume(settings=settings, run_id=run_id, extra_sink=extra, collective=group)
        session.rewind_partial_epoch()
    try:
        pids = group.gather(os.getpid())
        if group.leader:
            record_launch(session, nproc=group.world, backend=backend, pids=pids)
        while session.epoch < session.config.epochs:
            epoch = session.epoch
            packet = session.train_epoch()
            session.commit(epoch_tag(epoch, "trained"))
            decide_and_apply(session, packet)
    finally:
        session.close()


def _backend(config: RunConfig) -> str:
    return "nccl" if resolve_device(config.trainer.device).type == "cuda" else "gloo"


def record_launch(session: Run, *, nproc: int, backend: str, pids: list[int]) -> None:
    """Append how this launch trains ``session``'s run to ``launches.json`` (the summary states
    the last one: a run resumed on another number of processes says so)."""
    batch = session.config.data.batch_size
    entry = {
        "nproc": nproc,
        "backend": backend,
        "global_batch": batch,
        "rank_batch": [len(range(r, batch, nproc)) for r in range(nproc)],
        "learning_rate": session.config.trainer.lr,
        "pids": pids,
        "from_epoch": session.epoch,
    }
    path = session.run_dir / LAUNCHES_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([*launches(session.run_dir), entry], indent=2))
    tmp.replace(path)


def launches(run_dir: Path) -> list[dict[str, Any]]:
    """The launches ``record_launch`` recorded for the run in ``run_dir``, oldest first."""
    path = run_dir / LAUNCHES_FILE
    return json.loads(path.read_text()) if path.exists() else []
