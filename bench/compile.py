"""``esper bench compile``: Tezzeret's compile cost against Kasmina's load and first use, and Urza.

What is measured, and how (each compile and load runs in a fresh process, so nothing is warm
that would not be warm in production):

- ``compile_cold_s``: compiling one blueprint for one profile in a new process with an empty
  Inductor cache directory (for the default ``aot_inductor`` backend: export, AOTInductor build,
  numeric checks, pre-warm and timing; for ``export``: export and checks).
- ``compile_warm_s``: the same in another new process, with the cache directory kept.
- ``kasmina_load_ms``: Kasmina's ``load_for_slot`` (lookup, SHA-256-verified fetch, guard check,
  deserialisation) as every germination after a process's first pays it;
  ``kasmina_first_load_in_process_ms`` is the first one in a new process, which also pays
  torch.export's one-off lazy imports (in ``make run`` the compile step already paid them).
- ``kasmina_first_use_ms``: the first call of the module Kasmina trains, right after the first
  load in a new process (the worst case; ``kasmina_warm_first_use_ms`` after later loads).
  ``kasmina_inference_first_use_ms`` is the first call of the AOTInductor inference kernel, when
  the artifact has one. All are medians over ``load_repeats`` new processes.
- ``first_use_over_compile``: ``kasmina_first_use_ms / (compile_cold_s * 1000)``; goal <= 0.02.
- ``registry_lookup_p95_ms``: 1,000 ``find_active`` lookups of random keys in a registry of
  ``publishes`` artifacts; goal <= 2 ms on SQLite. ``publish_per_s``: full publishes (blob
  written atomically and fsynced, then the row with history, tags and lineage in one transaction).
- With ``--registry-url`` (e.g. a scratch PostgreSQL database), the registry part runs there too
  and is reported under the URL's dialect. It writes synthetic artifacts, so the database must
  hold none: the benchmark refuses a registry that does.

Run as ``esper bench compile --json``; ``python -m bench.compile --worker ...`` is its child.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esper_core.benchmarks import NO_PROGRESS, Progress
from esper_core.karn.profiles import ShapeProfile

GOALS = {"first_use_over_compile": 0.02, "registry_lookup_p95_ms": 2.0}
_LOADS_PER_PROCESS = 5
_ROOT = Path(__file__).resolve().parents[1]


@dataclass(kw_only=True, slots=True)
class CompileBenchConfig:
    """Options of the compile benchmark.

    Attributes:
        blueprint: Blueprint to compile (default: the main job's first).
        profile: Shape profile (default: digits-mlp's slots).
        backend: Tezzeret backend (``aot_inductor`` compiles ahead of time; ``export`` only exports).
        device: ``cpu`` or ``cuda``.
        lookups: Timed registry lookups.
        publishes: Artifacts published (and timed) to fill the registry before the lookups.
        load_repeats: Fresh processes timing Kasmina's load and first use (median reported).
        registry_url: Also run the registry part against this (empty, scratch) database.
    """

    blueprint: str = "residual_mlp"
    profile: str = "f64-b512"
    backend: str = "aot_inductor"
    device: str = "cpu"
    lookups: int = 1000
    publishes: int = 200
    load_repeats: int = 3
    registry_url: str | None = None

    def __post_init__(self) -> None:
        ShapeProfile.parse(self.profile)
        if self.backend not in ("export", "aot_inductor"):
            raise ValueError(f"backend must be 'export' or 'aot_inductor', got {self.backend!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.lookups < 20 or self.publishes < 10 or self.load_repeats < 1:
            raise ValueError(
                "need lookups >= 20, publishes >= 10 and load_repeats >= 1 for percentiles to mean anything"
            )


def run(config: CompileBenchConfig, progress: Progress = NO_PROGRESS) -> dict[str, Any]:
    """Run the benchmark; returns the JSON-ready result.

    ``progress`` hears of each step before it starts; it may tick while a child process works,
    not while this process times the registry.
    """
    from esper_core.tezzeret.config import environment_key

    steps = [("cold compile (new process, empty cache)", "compile"), ("warm compile (cache kept)", "compile")]
    steps += [(f"Kasmina load {i + 1}/{config.load_repeats} (new process)", "load") for i in range(config.load_repeats)]
    total = len(steps) + 1 + bool(config.registry_url)
    with tempfile.TemporaryDirectory(prefix="esper-bench-compile-") as scratch:
        home = Path(scratch) / "home"
        cache = Path(scratch) / "inductor-cache"
        common = ["--home", str(home), "--cache", str(cache), *_job_args(config)]
        children = []
        for done, (description, worker) in enumerate(steps):
            progress(description, done, total)
            with progress.ticking():
                children.append(_child(worker, *common))
        cold, warm, loads = children[0], children[1], children[2:]
        progress(f"registry: {config.publishes} publishes, {config.lookups} lookups (sqlite)", len(steps), total)
        sqlite = registry_numbers(f"sqlite:///{home / 'bench-registry.db'}", home, config)
        other = None
        if config.registry_url:
            progress(
                f"registry: {config.publishes} publishes, {config.lookups} lookups (--registry-url)", total - 1, total
            )
            other = registry_numbers(config.registry_url, Path(scratch) / "other-blobs", config)
        progress("done", total, total)
    load_ms = _median([run["load_ms"] for run in loads])
    first_load_ms = _median([run["first_load_ms"] for run in loads])
    first_use_ms = _median([run["first_use_ms"] for run in loads])
    inference = [run["inference_first_use_ms"] for run in loads if run["inference_first_use_ms"] is not None]
    result: dict[str, Any] = {
        "blueprint": config.blueprint,
        "profile": config.profile,
        "backend": config.backend,
        "device": config.device,
        "environment": environment_key(config.device, config.backend).model_dump(),
        "artifact_status": cold["status"],
        "aoti_package": cold["aoti_package"],
        "compile_cold_s": cold["compile_s"],
        "compile_warm_s": warm["compile_s"],
        "kasmina_load_ms": load_ms,
        "kasmina_first_load_in_process_ms": first_load_ms,
        "kasmina_first_use_ms": first_use_ms,
        "kasmina_warm_first_use_ms": _median([run["warm_first_use_ms"] for run in loads]),
        "kasmina_inference_first_use_ms": _median(inference) if inference else None,
        "first_use_over_compile": first_use_ms / (cold["compile_s"] * 1e3),
        **sqlite,
        "goals": GOALS,
    }
    if other is not None:
        result[other.pop("dialect")] = other
    return result


def format_table(result: dict[str, Any]) -> str:
    """The human-readable table of ``run``'s result (``--json`` prints the result itself)."""

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f} ms"

    def goal(key: str, value: float) -> str:
        return f"<= {GOALS[key]:g} {'met' if value <= GOALS[key] else 'MISSED'}"

    ratio = result["first_use_over_compile"]
    rows = [
        ("compile, cold (new process, empty cache)", f"{result['compile_cold_s']:.2f} s", ""),
        ("compile, warm (new process, cache kept)", f"{result['compile_warm_s']:.2f} s", ""),
        ("Kasmina load (a later germination)", ms(result["kasmina_load_ms"]), ""),
        ("Kasmina first load in a process", ms(result["kasmina_first_load_in_process_ms"]), ""),
        ("first use after the first load", ms(result["kasmina_first_use_ms"]), ""),
        ("first use after a later load", ms(result["kasmina_warm_first_use_ms"]), ""),
        ("first use of the inference kernel", ms(result["kasmina_inference_first_use_ms"]), ""),
        ("first use / cold compile", f"{ratio:.4f}", goal("first_use_over_compile", ratio)),
    ]
    registries = [("sqlite", result)]
    registries += [(k, v) for k, v in result.items() if isinstance(v, dict) and "publish_per_s" in v]
    for name, numbers in registries:
        p95 = numbers["registry_lookup_p95_ms"]
        where = f"{name}, {numbers['registry_artifacts']} artifacts"
        rows.append((f"registry lookup p50 ({where})", f"{numbers['registry_lookup_p50_ms']:.3f} ms", ""))
        rows.append((f"registry lookup p95 ({where})", f"{p95:.3f} ms", goal("registry_lookup_p95_ms", p95)))
        rows.append((f"publishes per second ({name})", f"{numbers['publish_per_s']:.0f}", ""))
    width = max(len(label) for label, _, _ in rows)
    value_width = max(len(value) for _, value, _ in rows)
    aoti = "with" if result["aoti_package"] else "without"
    lines = [
        f"compile {result['blueprint']} {result['profile']} with {result['backend']} on {result['device']}: "
        f"artifact {result['artifact_status']}, {aoti} an AOTInductor package",
        "",
        f"{'figure':<{width}}  {'value':>{value_width}}  goal",
    ]
    lines += [f"{label:<{width}}  {value:>{value_width}}  {target}".rstrip() for label, value, target in rows]
    return "\n".join(lines)


def registry_numbers(url: str, blob_root: Path, config: CompileBenchConfig) -> dict[str, Any]:
    """Publish ``config.publishes`` synthetic artifacts, then time ``config.lookups`` lookups."""
    from esper_core.karn.entries import default_catalog
    from esper_core.tezzeret.timing import percentile
    from esper_core.urza.service import Urza

    urza = Urza.open(blob_root, url)
    try:
        if urza.store.list_artifacts():
            raise ValueError(
                f"registry {url} already holds artifacts: the benchmark writes synthetic ones, so point "
                "--registry-url at an empty scratch database"
            )
        urza.register_blueprints(default_catalog().list())
        kernels = _synthetic_kernels(config.publishes, config.device)
        start = time.perf_counter()
        for kernel in kernels:
            urza.publish(kernel, tags=["bench"])
        publish_s = time.perf_counter() - start
        keys = [(k.artifact.blueprint_id, k.artifact.shape_profile, k.artifact.environment) for k in kernels]
        rng = random.Random(0)
        for key in rng.choices(keys, k=50):  # warm the connection pool and statement caches
            urza.store.find_active(*key)
        samples = []
        for key in rng.choices(keys, k=config.lookups):
            t0 = time.perf_counter()
            found = urza.store.find_active(*key)
            samples.append((time.perf_counter() - t0) * 1e3)
            assert found is not None
        samples.sort()
        dialect = url.split(":", 1)[0].split("+", 1)[0]
    finally:
        urza.close()
    return {
        "dialect": dialect,
        "registry_lookup_p50_ms": percentile(samples, 0.5),
        "registry_lookup_p95_ms": percentile(samples, 0.95),
        "registry_artifacts": len(kernels),
        "publish_per_s": len(kernels) / publish_s,
    }


def _synthetic_kernels(count: int, device: str) -> list[Any]:
    """Distinct small artifacts spread over the catalogue's safe blueprints and many profiles."""
    from types import SimpleNamespace

    from esper_core.contracts import GuardSchema, KernelArtifact
    from esper_core.karn.entries import default_catalog
    from esper_core.tezzeret.config import environment_key
    from esper_core.urza.blobs import sha256_hex

    mlp = [d.blueprint_id for d in default_catalog().list(host_kind="mlp") if d.tier.value == "safe"]
    env = environment_key(device)
    kernels = []
    for i in range(count):
        width = 8 + i // len(mlp)
        blob = f"synthetic kernel {i} ".encode() * 64
        artifact = KernelArtifact(
            blueprint_id=mlp[i % len(mlp)],
            shape_profile=f"f{width}-b64",
            environment=env,
            kind="exported",
            sha256=sha256_hex(blob),
            size_bytes=len(blob),
            guard=GuardSchema(feature_shape=(width,), output_feature_shape=(width,), batch_max=64),
        )
        kernels.append(SimpleNamespace(artifact=artifact, blob=blob))
    return kernels


def _job_args(config: CompileBenchConfig) -> list[str]:
    return [
        "--blueprint",
        config.blueprint,
        "--profile",
        config.profile,
        "--backend",
        config.backend,
        "--device",
        config.device,
    ]


def _child(worker: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "bench.compile", "--worker", worker, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench worker {worker!r} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _worker_compile(args: argparse.Namespace) -> dict[str, Any]:
    from esper_core.karn.entries import default_catalog
    from esper_core.pipeline import PublishPlan, compile_job, job_for, new_compile_run, publish_kernel
    from esper_core.tezzeret.config import Backend, TezzeretConfig
    from esper_core.tezzeret.formats import decode_bundle
    from esper_core.urza.service import Urza

    catalog = default_catalog()
    job = job_for(catalog, args.blueprint, args.profile, backend=args.backend, approved=[args.blueprint])
    config = TezzeretConfig(backend=Backend(args.backend), cache_dir=Path(args.cache))
    start = time.perf_counter()
    kernel = compile_job(catalog, job, args.device, config=config)
    compile_s = time.perf_counter() - start
    urza = Urza.open(Path(args.home))
    try:
        run = urza.store.start_compile_run(new_compile_run(args.device, args.backend, detail={"bench": "compile"}))
        stored = publish_kernel(urza, catalog, kernel, plan=PublishPlan(compile_run_id=run.run_id, actor="bench"))
    finally:
        urza.close()
    aoti = args.backend == "aot_inductor" and not stored.fallback and decode_bundle(kernel.blob).aoti is not None
    return {"compile_s": compile_s, "status": stored.status.value, "aoti_package": aoti}


def _worker_load(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from esper_core.karn.entries import default_catalog
    from esper_core.kasmina.loader import load_for_slot
    from esper_core.urza.service import Urza

    profile = ShapeProfile.parse(args.profile)
    catalog = default_catalog()
    urza = Urza.open(Path(args.home))
    load = {
        "catalog": catalog,
        "device": args.device,
        "backend": args.backend,
        "approved": [args.blueprint],
    }
    try:
        # The first load in a process also pays torch.export's lazy imports (~1,300 modules,
        # seconds); every later germination in that process does not. Both are reported.
        first = load_for_slot(urza, args.blueprint, profile, **load)
        again = [load_for_slot(urza, args.blueprint, profile, **load) for _ in range(_LOADS_PER_PROCESS)]
    finally:
        urza.close()
    inference_ms = None
    if first.inference is not None:
        x = torch.zeros((2, *profile.feature_shape), device=args.device)
        start = time.perf_counter()
        first.inference(x)
        inference_ms = (time.perf_counter() - start) * 1e3
    return {
        "first_load_ms": first.load_ms,
        "first_use_ms": first.first_use_ms,
        "load_ms": _median([k.load_ms for k in again]),
        "warm_first_use_ms": _median([k.first_use_ms or 0.0 for k in again]),
        "inference_first_use_ms": inference_ms,
    }


def main() -> int:
    """Child-process entry point (``python -m bench.compile --worker compile|load ...``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.compile")
    parser.add_argument("--worker", choices=("compile", "load"), required=True)
    for name in ("--home", "--cache", "--blueprint", "--profile", "--backend", "--device"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    result = _worker_compile(args) if args.worker == "compile" else _worker_load(args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
