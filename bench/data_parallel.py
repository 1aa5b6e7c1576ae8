"""data_parallel: one run's training throughput on N processes against one, and against bare DDP.

For each process count, the recipe's run is trained whole by ``esper_core.run.ranks.launch`` (a
fresh ESPER_HOME, the recipe's own growth policy) and its per-epoch training time is read from
the run's packets (``epoch_latency_ms``: the training steps and the gradient sums, not the
validation and gates, which every rank runs whole). The yardstick, in the same invocation: a bare
PyTorch loop on the recipe's model, data, optimizer and global batch, wrapped in
``DistributedDataParallel`` on the same number of gloo processes, each reading the same shard of
every batch. Both sides share the machine's cores among their processes the same way.

    OMP_NUM_THREADS=1 python -m bench.data_parallel --recipe mnist1d-cnn-width --epochs 8 --nproc 1 2 \\
        [--json baselines/parallel/mnist1d-cnn-width.json]

Reported per process count: p50 training epoch (ms), samples per second, the scaling against one
process, the ratio to bare DDP on as many processes, and the run's growth decisions and final
accuracies (whether N processes decided as the first count did).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from bench._output import save_json
from esper_core.data import DatasetSplit, Split, epoch_order
from esper_core.models.mnist1d import MNIST1DCNN
from esper_core.run.build import load_run_data
from esper_core.run.config import ModelSpec, RunConfig
from esper_core.run.ranks import launch
from esper_core.run.recipes import get_recipe
from esper_core.run.reports import finish_run
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings
from esper_core.telemetry import read_jsonl


def mnist1d_cnn_wide() -> RunConfig:
    """``mnist1d-cnn-width`` at 64 channels (8x the recipe's): ~64x the convolutions' work a step
    for the same gradient-sum latency, where data parallelism can start to pay on a CPU
    (``--recipe bench.data_parallel:mnist1d_cnn_wide``)."""
    config = get_recipe("mnist1d-cnn-width")
    config.host = dataclasses.replace(config.host, build=functools.partial(MNIST1DCNN, channels=64))
    return config


def esper(recipe: str, nproc: int, *, epochs: int, home: Path) -> dict[str, Any]:
    """The recipe's run on ``nproc`` processes: every epoch's training time (ms), the growth
    decisions (epoch, action, slot, blueprint) and the final accuracies."""
    settings = EsperSettings(home=home)
    run_id = f"bench-{nproc}"
    launch(RunSpec(run_id=run_id, recipe=recipe, nproc=nproc, epochs=epochs, device="cpu"), settings)
    session = Run.resume(settings=settings, run_id=run_id)
    try:
        summary = finish_run(session)
        return {
            "train_ms": [p.epoch_latency_ms for p in session.history],
            "decisions": [
                [c.epoch, c.action, c.slot_id, c.blueprint_id] for c in session.commands if c.action != "wait"
            ],
            "val_accuracy": summary.val_accuracy,
            "test_accuracy": summary.test_accuracy,
            "total_params": summary.total_params,
            "exchange_ms": [
                m.value
                for p in read_jsonl(session.run_dir / "telemetry.jsonl")
                for m in p.metrics
                if m.name == "tolaria.parallel.exchange_ms"
            ],
        }
    finally:
        session.close()


def bare(recipe: str, nproc: int, *, epochs: int) -> list[float]:
    """Training time of every epoch (ms) of a bare DDP loop on ``nproc`` gloo processes."""
    with tempfile.TemporaryDirectory(prefix="esper-bare-ddp-") as tmp:
        mp.start_processes(_bare_rank, args=(recipe, nproc, epochs, tmp), nprocs=nproc, join=True, start_method="spawn")
        return json.loads(Path(tmp, "times.json").read_text())


def _bare_rank(rank: int, recipe: str, nproc: int, epochs: int, tmp: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=nproc, timeout=timedelta(seconds=300)
    )
    try:
        config = get_recipe(recipe, epochs=epochs, device="cpu")
        if not isinstance(config.host, ModelSpec):
            raise ValueError(f"bare DDP needs a recipe with its own model (ModelSpec); {recipe} has a built-in host")
        train = load_run_data(config).train
        if isinstance(train, DatasetSplit) and isinstance(train.dataset, TensorDataset):
            train = Split(x=train.dataset.tensors[0], y=train.dataset.tensors[1])
        if not isinstance(train, Split):
            raise ValueError(f"bare DDP reads tensors; {recipe}'s training data is a Dataset of another kind")
        torch.manual_seed(config.seed)
        model = DistributedDataParallel(config.host.build())
        trainer = config.trainer
        if trainer.optimizer == "adam":
            opt = torch.optim.Adam(model.parameters(), lr=trainer.lr, weight_decay=trainer.weight_decay, fused=True)
        else:
            opt = torch.optim.SGD(
                model.parameters(), lr=trainer.lr, momentum=trainer.momentum, weight_decay=trainer.weight_decay
            )
        x, y, batch = train.x, train.y, config.data.batch_size
        times = []
        for epoch in range(epochs):
            order = epoch_order(len(y), seed=config.data.seed, epoch=epoch)
            start = time.perf_counter()
            for i in range(0, len(y), batch):
                index = order[i : i + batch][rank::nproc]
                opt.zero_grad(set_to_none=True)
                config.loss(model(x[index]), y[index]).backward()
                opt.step()
            times.append((time.perf_counter() - start) * 1e3)
        if rank == 0:
            Path(tmp, "times.json").write_text(json.dumps(times))
        # Drop DDP's reducer while the group still works: freed at the frame's end instead, its
        # process group's destructor joined gloo's worker thread while holding the GIL the worker
        # needed to free its last allreduce, and the rank hung at exit (seen here once in three).
        dist.barrier()
        del model, opt
        gc.collect()
    finally:
        dist.destroy_process_group()


def run(recipe: str, nprocs: list[int], *, epochs: int, warmup: int = 2) -> dict[str, object]:
    """Both sides at every process count; the first ``warmup`` epochs are left out of the medians."""
    config = get_recipe(recipe, epochs=epochs, device="cpu")
    samples = len(load_run_data(config).train)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="esper-bench-dp-") as home:
        for n in nprocs:
            run_n = esper(recipe, n, epochs=epochs, home=Path(home))
            mine = statistics.median(run_n["train_ms"][warmup:])
            theirs = statistics.median(bare(recipe, n, epochs=epochs)[warmup:])
            rows.append(
                {
                    "nproc": n,
                    "esper_epoch_ms_p50": round(mine, 2),
                    "esper_epoch_ms": [round(t, 1) for t in run_n["train_ms"]],
                    "bare_ddp_epoch_ms_p50": round(theirs, 2),
                    "ratio_to_bare_ddp": round(mine / theirs, 3),
                    "esper_samples_per_s": round(samples / mine * 1e3),
                    "exchange_ms_p50": round(statistics.median(run_n["exchange_ms"][warmup:]), 2),
                    "decisions": run_n["decisions"],
                    "same_decisions_as_first": run_n["decisions"]
                    == (rows[0]["decisions"] if rows else run_n["decisions"]),
                    "val_accuracy": run_n["val_accuracy"],
                    "test_accuracy": run_n["test_accuracy"],
                    "total_params": run_n["total_params"],
                }
            )
    one = rows[0]["esper_epoch_ms_p50"] if rows[0]["nproc"] == 1 else None
    for row in rows:
        row["speedup_vs_1"] = None if one is None else round(one / row["esper_epoch_ms_p50"], 3)
    return {
        "recipe": recipe,
        "epochs": epochs,
        "warmup_epochs": warmup,
        "train_samples": samples,
        "global_batch": config.data.batch_size,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="mnist1d-cnn-width")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--warmup", type=int, default=2, help="first epochs left out of the medians")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    result = run(args.recipe, args.nproc, epochs=args.epochs, warmup=args.warmup)
    print(save_json(result, args.json))


if __name__ == "__main__":
    main()
