"""policy-graph: Tamiyo's policy forward on a ~50-node graph, eager vs compiled vs bare PyG.

- ``eager`` and ``compiled``: ``PreparedPolicy`` as Tamiyo serves it (eager under inference
  mode; the compiled call after its guard check), so the numbers include the serving overhead.
- ``bare``: the textbook torch-geometric model, ``HeteroConv({r: SAGEConv}, aggr="sum")`` with the
  same weights (``TamiyoGNN`` computes the same function in fused form), called eagerly.
- ``warmup_cold_s`` / ``warmup_cached_s``: time to the first compiled result in a fresh process,
  with an empty compiler cache directory and then with the directory the first one filled (what
  a second Tamiyo process of the same installation pays), the policy server's start included;
  ``*_compile_s`` is the server's compile (0 when it loaded a stored one), ``*_load_s`` its load
  of the stored policy. ``in_process_warmup_s``: this process's compiled path, whose server loads
  what the probes stored. ``eager_during_*_warmup_*_ms``: calls made every 100 ms while the
  server starts and compiles; eager serves them without waiting for it, but they share the CPU
  with it, which is what their tail shows. ``worst_decision_during_warmup_ms`` is the worst of
  them, next to Tamiyo's deadline (``SafetyConfig.tamiyo_deadline_ms``) and how many calls went
  over it. The compiled path's figures include the round trip to the server.

Calls are interleaved (eager, compiled, bare, eager, ...) so all three see the same machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch_geometric.nn import HeteroConv, SAGEConv

from esper_core.benchmarks import NO_PROGRESS, Progress
from esper_core.tamiyo.build import PreparedPolicy, autocast_dtype, policy_graph, use_compiler_cache
from esper_core.tamiyo.config import PolicyCompileConfig
from esper_core.tamiyo.graph import EDGE_TYPES
from esper_core.tamiyo.model import HeteroSAGELayer, TamiyoGNN, TamiyoGNNConfig
from esper_core.telemetry import latency_stats
from esper_core.tolaria.safety import SafetyConfig


@dataclass(kw_only=True, slots=True)
class PolicyBenchConfig:
    """Options of the policy benchmark."""

    iters: int = 300
    """Timed calls per path."""
    device: str = "cpu"
    compile_mode: str | None = "reduce-overhead"
    warmup_probes: bool = True
    """Measure cold and cached compile warm-up in fresh processes (costs ~1 minute on 2 cores)."""

    def __post_init__(self) -> None:
        if self.iters < 20:
            raise ValueError(f"iters must be >= 20 for a p95 to mean anything, got {self.iters}")


def pyg_layer(layer: HeteroSAGELayer, hidden: int) -> HeteroConv:
    """``layer``'s function written with torch-geometric: one ``SAGEConv`` per relation, summed.

    The fused layer's weight for a node type stacks [root | relation 1 | relation 2 | ...]; each
    ``SAGEConv`` takes its relation's block, and an equal share of the root weight and the bias.
    """
    convs = {}
    for nt, rels in layer.relations.items():
        weight, bias = layer.lin[nt].weight.detach(), layer.lin[nt].bias.detach()
        for i, et in enumerate(rels):
            conv = SAGEConv((hidden, hidden), hidden)
            with torch.no_grad():
                conv.lin_l.weight.copy_(weight[:, (i + 1) * hidden : (i + 2) * hidden])
                conv.lin_l.bias.copy_(bias / len(rels))
                conv.lin_r.weight.copy_(weight[:, :hidden] / len(rels))
            convs[et] = conv
    with warnings.catch_warnings():
        # The last layer leaves ``layer`` nodes un-updated on purpose (no head reads them).
        warnings.filterwarnings("ignore", message=".*do not get updated.*")
        return HeteroConv(convs, aggr="sum")


class BarePyG(nn.Module):
    """``TamiyoGNN``'s function written with torch-geometric's ``HeteroConv`` + ``SAGEConv``."""

    def __init__(self, fused: TamiyoGNN) -> None:
        super().__init__()
        self.fused = fused
        self.convs = nn.ModuleList(pyg_layer(layer, fused.config.hidden_dim) for layer in fused.convs)

    def forward(
        self, x_dict: dict[str, torch.Tensor], edge_index_dict: dict[tuple[str, str, str], torch.Tensor]
    ) -> torch.Tensor:
        f = self.fused
        h = {nt: f.input_proj[nt](x) for nt, x in x_dict.items()}
        for conv in self.convs:
            edges = {et: ei for et, ei in edge_index_dict.items() if et in EDGE_TYPES}
            msg = conv(h, edges)
            h = {nt: v + torch.relu(msg[nt]) if nt in msg else v for nt, v in h.items()}
        return f.action_head(h["global"])


def run(config: PolicyBenchConfig, progress: Progress = NO_PROGRESS) -> dict[str, Any]:
    """Run the benchmark and return its numbers.

    ``progress`` hears of each stage before it starts; it ticks only while a probe process
    compiles, and is still while this process compiles (timed) or times calls.
    """
    device = torch.device(config.device)
    warmup: dict[str, float] = {}
    total = 4 if config.warmup_probes else 2
    with tempfile.TemporaryDirectory(prefix="esper-policy-cache-") as cache:
        if config.warmup_probes:
            progress("cold compile in a new process (empty compiler cache)", 0, total)
            with progress.ticking():
                cold = _probe(Path(cache), config)
            progress("cached compile in a new process", 1, total)
            with progress.ticking():
                cached = _probe(Path(cache), config)
            deadline_ms = SafetyConfig().tamiyo_deadline_ms
            worst = max(cold["during_max_ms"], cached["during_max_ms"])
            warmup = {
                "warmup_cold_s": cold["warmup_s"],
                "warmup_cached_s": cached["warmup_s"],
                "warmup_speedup": cold["warmup_s"] / cached["warmup_s"],
                "warmup_cold_compile_s": cold["compile_s"],
                "warmup_cached_compile_s": cached["compile_s"],
                "warmup_cached_load_s": cached["load_s"],
                "eager_during_cold_warmup_p50_ms": cold["during_p50_ms"],
                "eager_during_cold_warmup_max_ms": cold["during_max_ms"],
                "eager_during_cached_warmup_max_ms": cached["during_max_ms"],
                "worst_decision_during_warmup_ms": worst,
                "tamiyo_deadline_ms": deadline_ms,
                "deadline_misses_during_warmup": cold["over_deadline"] + cached["over_deadline"],
            }
        use_compiler_cache(Path(cache))
        torch.manual_seed(0)
        model = TamiyoGNN(TamiyoGNNConfig()).to(device).eval()
        dtype = autocast_dtype(device)
        eager = PreparedPolicy(model, device=device, compile_config=None, dtype=dtype)
        compiled = PreparedPolicy(
            model,
            device=device,
            compile_config=PolicyCompileConfig(mode=config.compile_mode, background=False),
            dtype=dtype,
        )
        bare = BarePyG(model).to(device).eval()
        inputs = eager.inputs(policy_graph())
        progress("compiling in this process (timed: the display pauses)", total - 2, total)
        start = time.perf_counter()
        compiled.warm(*inputs)
        in_process_warmup_s = time.perf_counter() - start
        progress(f"timing {config.iters} calls of eager, compiled and bare PyG", total - 1, total)
        samples = _interleave({"eager": eager, "compiled": compiled, "bare": bare}, inputs, config.iters, device)
        progress("done", total, total)
    served = compiled.compile_enabled and not compiled.eager_calls
    compiled.close()
    if not served:
        raise RuntimeError(f"the compiled path did not serve every call: {compiled.fallback_reason or 'recompiles'}")
    stats = {name: latency_stats(values) for name, values in samples.items()}
    nodes = sum(x.shape[0] for x in inputs[0].values())
    edges = sum(e.shape[1] for e in inputs[1].values())
    return {
        "workload": "policy-graph",
        "device": str(device),
        "nodes": nodes,
        "edges": edges,
        "iters": config.iters,
        "compile_mode": config.compile_mode,
        "eager_p50_ms": stats["eager"].p50_ms,
        "eager_p95_ms": stats["eager"].p95_ms,
        "compiled_p50_ms": stats["compiled"].p50_ms,
        "compiled_p95_ms": stats["compiled"].p95_ms,
        "bare_pyg_p50_ms": stats["bare"].p50_ms,
        "bare_pyg_p95_ms": stats["bare"].p95_ms,
        "ratio_compiled_vs_eager_p95": stats["compiled"].p95_ms / stats["eager"].p95_ms,
        "ratio_eager_vs_bare_p95": stats["eager"].p95_ms / stats["bare"].p95_ms,
        "budget_ms": max(45.0, stats["eager"].p95_ms * 1.10),
        **warmup,
        "in_process_warmup_s": in_process_warmup_s,
        "samples_ms": samples,
    }


def _interleave(
    paths: dict[str, Any], inputs: tuple[Any, Any], iters: int, device: torch.device
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in paths}
    with torch.inference_mode():
        for _ in range(20):  # untimed: caches, allocator, CUDA graphs
            for fn in paths.values():
                fn(*inputs)
        for _ in range(iters):
            for name, fn in paths.items():
                start = time.perf_counter()
                out = fn(*inputs)
                # Reading a result back is what a decision does; it also waits for the device.
                (out[0] if isinstance(out, tuple) else out).sum().item()
                samples[name].append((time.perf_counter() - start) * 1e3)
    del device
    return samples


def _probe(cache_dir: Path, config: PolicyBenchConfig) -> dict[str, float]:
    """Compile in a fresh process with ``cache_dir``; returns its warm-up and first eager call."""
    code = (
        "import json, sys; from bench.policy import warmup_probe; "
        f"print(json.dumps(warmup_probe({str(cache_dir)!r}, {config.device!r}, {config.compile_mode!r})))"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"warm-up probe failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def warmup_probe(cache_dir: str, device: str, mode: str | None) -> dict[str, float]:
    """In this (fresh) process: start a background compile, time one call made meanwhile, then
    the time until the compiled path is ready."""
    use_compiler_cache(Path(cache_dir))
    torch.manual_seed(0)
    dev = torch.device(device)
    model = TamiyoGNN(TamiyoGNNConfig()).to(dev).eval()
    policy = PreparedPolicy(model, device=dev, compile_config=PolicyCompileConfig(mode=mode), dtype=autocast_dtype(dev))
    inputs = policy.inputs(policy_graph())
    policy(*inputs)  # eager is warm before the compile starts, as in a running service
    start = time.perf_counter()
    policy.warm(*inputs)
    during_ms: list[float] = []
    # Decisions every 100 ms while the server starts and compiles: all eager, none waits for it,
    # but they share the CPU with it.
    while not policy.wait_until_idle(0.1):
        call = time.perf_counter()
        policy(*inputs)[0].sum().item()
        during_ms.append((time.perf_counter() - call) * 1e3)
    warmup_s = time.perf_counter() - start
    if not policy.compile_enabled:
        raise RuntimeError(f"compile fell back: {policy.fallback_reason}")
    policy.close()
    during = latency_stats(during_ms or [0.0])
    return {
        "warmup_s": warmup_s,
        "compile_s": policy.compile_s,
        "load_s": policy.load_s,
        "during_p50_ms": during.p50_ms,
        "during_max_ms": during.max_ms,
        "during_calls": len(during_ms),
        "over_deadline": sum(ms > SafetyConfig().tamiyo_deadline_ms for ms in during_ms),
    }


def report(args: Any, progress: Progress = NO_PROGRESS) -> str:  # noqa: ANN401  (argparse.Namespace from esper_cli.bench)
    """``esper bench policy``: run it and return the headline numbers (``--json``: one JSON object).

    The text is returned, not printed, so the CLI prints it after its progress display is gone.
    """
    result = run(
        PolicyBenchConfig(
            iters=args.iters,
            device=args.device,
            compile_mode=None if args.compile_mode == "default" else args.compile_mode,
            warmup_probes=not args.no_warmup_probes,
        ),
        progress,
    )
    headline = {k: v for k, v in result.items() if k != "samples_ms"}
    if args.json:
        return json.dumps(headline, indent=2)
    lines = [
        f"policy-graph on {result['device']}: {result['nodes']} nodes, {result['edges']} edges, {result['iters']} calls"
    ]
    for name in ("eager", "compiled", "bare_pyg"):
        lines.append(f"  {name:<9} p50 {result[name + '_p50_ms']:.3f} ms  p95 {result[name + '_p95_ms']:.3f} ms")
    if "warmup_cold_s" in result:
        lines.append(
            f"  warm-up  cold {result['warmup_cold_s']:.1f} s, cached {result['warmup_cached_s']:.1f} s "
            f"({result['warmup_speedup']:.1f}x); eager decisions during the cold warm-up: p50 "
            f"{result['eager_during_cold_warmup_p50_ms']:.1f} ms, max {result['eager_during_cold_warmup_max_ms']:.0f} ms"
        )
        lines.append(
            f"  worst decision during warm-up {result['worst_decision_during_warmup_ms']:.0f} ms "
            f"(deadline {result['tamiyo_deadline_ms']:.0f} ms, {result['deadline_misses_during_warmup']} over it); "
            f"cold: {result['warmup_cold_compile_s']:.1f} s compiling in the policy server; cached: "
            f"{result['warmup_cached_load_s']:.1f} s loading there"
        )
    return "\n".join(lines)
