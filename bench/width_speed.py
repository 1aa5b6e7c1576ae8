"""width_speed: does a merged network train as fast as the static network of the same width?

A grown network leaves its width seeds merged into plain layers, but Esper's width slots stay
on the host (ready to widen again). This bench trains, in one process and on one thread, the
recipe's static model at the grown width and the ``GrowableModel`` whose layers were widened to
that width by Kasmina's own ``resize_width`` (the shapes a merge leaves), with the same Adam, data
and batch size as the MNIST-1D recipes. Epochs alternate between the two (static, grown, static,
...) so that a load change on the machine hits both alike; the report is the median epoch of each
and their ratio (goal: grown <= 1.05 x static).

    OMP_NUM_THREADS=1 python -m bench.width_speed [--model cnn|mlp] [--epochs N] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from bench._output import save_json
from esper_core.kasmina.graft import GrowableModel
from esper_core.models.mnist1d import MNIST1DCNN, MNIST1DMLP

MODELS = {
    # (static at the grown width, start model, layers to widen, start width, grown width)
    "cnn": (lambda: MNIST1DCNN(channels=12), lambda: MNIST1DCNN(channels=8), ("conv1", "conv2", "conv3"), 8, 12),
    "mlp": (lambda: MNIST1DMLP(width=48), lambda: MNIST1DMLP(width=32), ("fc1", "fc2"), 32, 48),
}
SAMPLES, BATCH = 4000, 100  # MNIST-1D's training split and the recipes' batch


def grown(model: str) -> GrowableModel:
    """The start model with width slots on every hidden layer, widened to the grown width."""
    _, start, layers, _, width = MODELS[model]
    host = GrowableModel(start(), slots=(), widen=layers, sample_shape=(40,), batch_max=512)
    for slot in host.slots().values():
        slot.kind.restore_architecture(slot, width)  # each width slot's layer at the grown width
    return host


def _epoch(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    start = time.perf_counter()
    for i in range(0, SAMPLES, BATCH):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i : i + BATCH]), y[i : i + BATCH]).backward()
        opt.step()
    return (time.perf_counter() - start) * 1e3


def run(model: str, *, epochs: int, warmup: int = 2) -> dict[str, object]:
    """Median epoch (ms) of the static and the grown network, epochs interleaved."""
    torch.manual_seed(0)
    x, y = torch.randn(SAMPLES, 40), torch.randint(0, 10, (SAMPLES,))
    nets = {"static": MODELS[model][0](), "grown": grown(model)}
    widths = {name: [int(m.weight.shape[0]) for m in net.modules() if isinstance(m, nn.Linear | nn.Conv1d)]
              for name, net in nets.items()}  # fmt: skip
    if widths["static"] != widths["grown"]:
        raise ValueError(f"the grown network's widths {widths['grown']} differ from the static {widths['static']}")
    opts = {name: torch.optim.Adam(net.parameters(), lr=1e-2, fused=True) for name, net in nets.items()}
    times: dict[str, list[float]] = {name: [] for name in nets}
    for e in range(warmup + epochs):
        for name in nets:
            ms = _epoch(nets[name], opts[name], x, y)
            if e >= warmup:
                times[name].append(ms)
    static, grown_ms = statistics.median(times["static"]), statistics.median(times["grown"])
    return {
        "model": model,
        "widths": widths["static"],
        "epochs": epochs,
        "threads": torch.get_num_threads(),
        "static_epoch_ms_p50": static,
        "grown_epoch_ms_p50": grown_ms,
        "ratio": grown_ms / static,
        "goal_ratio": 1.05,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), nargs="+", default=sorted(MODELS))
    parser.add_argument("--epochs", type=int, default=15, help="timed epochs of each network (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    results = [run(m, epochs=args.epochs) for m in args.model]
    for r in results:
        print(
            f"{r['model']}: static {r['static_epoch_ms_p50']:.1f} ms, grown {r['grown_epoch_ms_p50']:.1f} ms per epoch, "
            f"ratio {r['ratio']:.3f} (goal <= {r['goal_ratio']})"
        )
    save_json({"bench": "width_speed", "results": results}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
