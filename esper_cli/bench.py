"""``esper bench``: benchmarks against bare PyTorch in the same process."""

from __future__ import annotations

import argparse
import json

from esper_cli.args import positive
from esper_core._capabilities import DEVICE_CHOICES


def _cmd_bench_seed_reference(args: argparse.Namespace) -> int:
    from bench.seed_reference import BenchConfig, run

    result = run(BenchConfig(epochs=args.epochs, warmup_batches=args.warmup_batches, device=args.device))
    if args.save_baseline:
        from esper_core.telemetry import write_baseline

        write_baseline(
            args.save_baseline,
            name="seed-reference",
            workload={k: result[k] for k in ("workload", "epochs", "steps_per_epoch")},
            latency_ms=result["samples_ms"],
            device=result["device"],
        )
    headline = {k: v for k, v in result.items() if k != "samples_ms"}
    if args.json:
        print(json.dumps(headline, indent=2))
        return 0
    print(f"seed-reference on {result['device']} ({result['epochs']} epochs of {result['steps_per_epoch']} steps)")
    print(
        f"  esper  p50 {result['esper_p50_ms']:.3f} ms  p95 {result['esper_p95_ms']:.3f} ms  (budget {result['budget_ms']} ms)"
    )
    print(f"  bare   p50 {result['bare_p50_ms']:.3f} ms  p95 {result['bare_p95_ms']:.3f} ms")
    print(f"  ratio  p50 {result['ratio_p50']:.2f}  p95 {result['ratio_p95']:.2f}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``bench <workload>``."""
    bench = sub.add_parser("bench", help="benchmarks against bare PyTorch").add_subparsers(
        dest="bench_command", required=True, metavar="WORKLOAD"
    )
    b_ref = bench.add_parser("seed-reference", help="Linear 16->4, 16 samples, batch 4: Tolaria vs a bare loop")
    b_ref.add_argument("--epochs", type=positive, default=200, help="timed epochs per path (default: %(default)s)")
    b_ref.add_argument("--warmup-batches", type=int, default=20, help="untimed steps first (default: %(default)s)")
    b_ref.add_argument("--device", default="cpu", choices=DEVICE_CHOICES, help="device (default: %(default)s)")
    b_ref.add_argument("--json", action="store_true", help="print one JSON object")
    b_ref.add_argument("--save-baseline", metavar="PATH", default=None, help="also write a baseline JSON file here")
    b_ref.set_defaults(func=_cmd_bench_seed_reference)
