"""Prepare a Tamiyo policy for inference: the one place performance features are applied.

``prepare_policy`` applies, in this order (seed 002): float32 matmul precision / TF32 once per
process; device and eval mode; the autocast dtype (bf16 on CUDA, fp16 where bf16 is missing,
off on CPU); then an ahead-of-time ``torch.compile(dynamic=True, mode="reduce-overhead",
fullgraph=True)`` with the compiler caches under ``<ESPER_HOME>/cache/inductor``. ``TamiyoGNN``
itself stays plain PyTorch.

Never blocking a decision on the compiler: a cold compile costs 30-45 s on 2 busy CPU cores. So
eager serves until a compiled policy is ready, and the compile happens off the decision path in
two stages: a low-priority child process (``esper_core.tamiyo.warmup``) compiles the same module
and shapes and stores the compiled policy (``esper_core.tamiyo.precompile``), then a background
thread loads it into this process (1-2 s; no tracing), pausing while a decision runs
(``esper_core.tamiyo.yielding``). A compile on a thread of this process would hold its GIL for
the whole compile, and eager decisions made meanwhile took seconds (2.8 s measured). A stored
policy is loaded without a child at all.

Each compiled policy carries the guards of its compile (shapes, dtypes, grad mode); a decision
whose inputs no loaded policy accepts (e.g. a first graph with one slot after compiling on six)
is served eagerly while a background job compiles for those inputs too. Any other compiler or
runtime error disables the compiled path for good: one WARNING, ``fallback_total`` (exported as
``tamiyo.gnn.compile_fallback_total``), eager from then on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from esper_core._capabilities import cuda_available, initialise_pytorch_defaults, one_thread
from esper_core.tamiyo.config import PolicyCompileConfig, TamiyoConfig
from esper_core.tamiyo.graph import EdgeType, NodeType, TamiyoGraph, build_graph
from esper_core.tamiyo.model import PolicyOutput, TamiyoGNN
from esper_core.tamiyo.precompile import (
    CompiledPolicy,
    artifact_path,
    compile_policy,
    guard_state,
    load_policy,
    process_state,
    recorded_vec_isa,
    save_policy,
)
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history
from esper_core.tamiyo.yielding import deciding, loading
from esper_core.threads import start_daemon

log = logging.getLogger(__name__)

XDict = dict[NodeType, Tensor]
EdgeDict = dict[EdgeType, Tensor]


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype for policy inference on ``device`` (None: autocast off).

    bf16 on CUDA devices that support it, else fp16; off on CPU, where CPU autocast makes these
    64-wide matmuls slower, not faster.
    """
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def host_to_device(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` on ``device``: pinned and copied ``non_blocking`` when going to CUDA."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def use_compiler_cache(cache_dir: Path) -> Path:
    """Point Inductor's and Triton's on-disk caches at ``cache_dir`` for this process.

    Reusing the whole directory across processes is what makes a second compile cheap
    (measured 10.7x; ``torch.compiler.save_cache_artifacts`` alone gave 1.22x). Tezzeret uses the
    same ``<ESPER_HOME>/cache/inductor``, so its scoped switches land on the same directory.

    Args:
        cache_dir: The directory (created if absent).

    Returns:
        The directory, resolved.
    """
    # Private but stable hook (what torch._inductor.utils.fresh_cache calls): Inductor memoises
    # cache paths in-process, so they must be forgotten when the directory changes.
    from torch._inductor.utils import clear_caches

    cache_dir = cache_dir.expanduser().resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") != str(cache_dir):
        clear_caches()
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
        os.environ["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    return cache_dir


@contextlib.contextmanager
def compiled_context(device: torch.device, dtype: torch.dtype | None) -> Iterator[None]:
    """What the compiled policy runs under, and is compiled under: its guards record it.

    ``no_grad`` rather than ``inference_mode``, even inside a caller's ``inference_mode``: a
    precompiled function's tensor guards expect the autograd dispatch keys that ``inference_mode``
    strips (measured: every call failed its guards).
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.no_grad())
        if dtype is not None:
            stack.enter_context(torch.autocast(device.type, dtype=dtype))
        yield


def guard_state_under(device: torch.device, dtype: torch.dtype | None) -> str:
    """``precompile.guard_state`` as a compiled policy of this process sees it when called."""
    with compiled_context(device, dtype):
        return guard_state()


class _Job(NamedTuple):
    """A background compile: the inputs, and the calling thread's settings (see ``warm``)."""

    x_dict: XDict
    edge_index_dict: EdgeDict
    process: dict[str, Any]
    guard_state: str


class PreparedPolicy:
    """The policy as Tamiyo calls it: compiled when ready, eager otherwise, never blocking.

    Args:
        model: The policy network, already on ``device`` and in eval mode.
        device: Where it runs.
        compile_config: How to compile; None serves eagerly.
        dtype: Autocast dtype, or None for float32.
    """

    def __init__(
        self,
        model: TamiyoGNN,
        *,
        device: torch.device,
        compile_config: PolicyCompileConfig | None,
        dtype: torch.dtype | None,
    ) -> None:
        self.model = model
        self.device = device
        self.dtype = dtype
        self.config = compile_config
        self.fallback_total = 0
        self.fallback_reason: str | None = None
        self.compiled_calls = 0
        self.eager_calls = 0
        self.last_call_compiled = False
        self.cache_warm_s = 0.0
        """Seconds the last background job spent in the warm-up child process."""
        self.load_s = 0.0
        """Seconds the last background job then spent loading the compiled policy here."""
        self.stage = "idle"
        """What the background compile is doing: ``idle``, ``warming`` (the child process
        compiles) or ``loading`` (this process loads what it compiled)."""
        self.ready_after_s: float | None = None
        """Seconds from the first ``warm`` call until a compiled policy was ready."""
        self._enabled = compile_config is not None
        self._started: float | None = None
        # One compiled function per shape family, tried in order; replaced, never mutated, so a
        # decision can read it without the lock.
        self._compiled: tuple[CompiledPolicy, ...] = ()
        self._lock = threading.Lock()  # held while compiled code runs or this process compiles
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._shapes: set[tuple[tuple[int, ...], ...]] = set()
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0
        self._state_lock = threading.Lock()
        # Set once the background compiler has stopped; None until it starts.
        self._worker: threading.Event | None = None

    @property
    def compile_enabled(self) -> bool:
        """True once a compiled policy is ready and compiling has not fallen back."""
        return self._enabled and bool(self._compiled)

    def inputs(self, graph: TamiyoGraph) -> tuple[XDict, EdgeDict]:
        """The graph's ``(x_dict, edge_index_dict)`` on the policy's device (pinned copies on CUDA)."""
        x_dict = {nt: host_to_device(x, self.device) for nt, x in graph.data.x_dict.items()}
        edge_index_dict = {et: host_to_device(ei, self.device) for et, ei in graph.data.edge_index_dict.items()}
        return x_dict, edge_index_dict

    def __call__(self, x_dict: XDict, edge_index_dict: EdgeDict) -> PolicyOutput:
        """One inference; never waits on a compile.

        Compiled when a ready compiled policy's guards accept these inputs; otherwise eager under
        ``inference_mode`` (and autocast on CUDA), and inputs no compiled policy accepts are
        queued for a background compile of their own. A compiled policy loading meanwhile on
        another thread pauses at its next Python call until this one returns (``yielding.deciding``).
        """
        with deciding():
            return self._decide(x_dict, edge_index_dict)

    def _decide(self, x_dict: XDict, edge_index_dict: EdgeDict) -> PolicyOutput:
        if self.compile_enabled and self._lock.acquire(blocking=False):
            unseen = False
            try:
                with compiled_context(self.device, self.dtype):
                    fn = next((f for f in self._compiled if f.guard_check(self.model, x_dict, edge_index_dict)), None)
                    if fn is not None:
                        out = fn(self.model, x_dict, edge_index_dict)
                        self.compiled_calls += 1
                        self.last_call_compiled = True
                        return out
                unseen = True
            # Compiled code fails in many exception types (Inductor, CUDA graph, guard errors):
            # any of them retires the compiled path.
            except Exception as e:  # noqa: BLE001
                self._fall_back(e)
            finally:
                self._lock.release()
            if unseen:  # after releasing the lock: the compile job takes it
                self.warm(x_dict, edge_index_dict)
        out = self._eager(x_dict, edge_index_dict)
        self.eager_calls += 1
        self.last_call_compiled = False
        return out

    def _eager(self, x_dict: XDict, edge_index_dict: EdgeDict) -> PolicyOutput:
        # On the CPU an eager decision runs on one intra-op thread: a graph of Tamiyo's size gains
        # nothing from a thread team, and while the warm-up child compiles on the other core each
        # op's team waits for it. Measured on a 2-core machine (`esper bench policy`), decisions
        # made while the child compiled took 75 ms at the median and 411 ms at worst with two
        # threads, 4.1 and 13 ms on one. Torch's thread count is shared state (a thread started
        # meanwhile takes the last value set) and Inductor keys its cache on it while it
        # compiles, so it changes only under the lock an in-process compile holds; while one
        # runs, the decision keeps the process's threads rather than wait.
        if self.device.type == "cpu" and self._lock.acquire(blocking=False):
            try:
                with one_thread(), self._eager_context():
                    return self.model(x_dict, edge_index_dict)
            finally:
                self._lock.release()
        with self._eager_context():
            return self.model(x_dict, edge_index_dict)

    def warm(self, x_dict: XDict, edge_index_dict: EdgeDict) -> bool:
        """Compile for these inputs' shapes: in the background, or now when not ``background``.

        Returns:
            True when a compile was started or queued; False when compiling is off, has fallen
            back, the shapes were seen before, or ``max_shapes`` is reached.
        """
        if not self._enabled or self.config is None:
            return False
        shapes = tuple(tuple(t.shape) for t in (*x_dict.values(), *edge_index_dict.values()))
        with self._state_lock:
            if shapes in self._shapes or len(self._shapes) >= self.config.max_shapes:
                return False
            self._shapes.add(shapes)
            if self._started is None:
                self._started = time.perf_counter()
            if not self.config.background:
                self._compile(x_dict, edge_index_dict)
                return True
            self._pending += 1
            self._idle.clear()
            if self._worker is None:
                # Started without waiting for it to run: see ``esper_core.threads``.
                self._worker = start_daemon(self._work, name="tamiyo-policy-compile")
        # The settings the compiled policy's guards will check, read on the thread that calls it.
        self._jobs.put(_Job(x_dict, edge_index_dict, process_state(), guard_state_under(self.device, self.dtype)))
        return True

    def wait_until_idle(self, timeout: float | None = None) -> bool:
        """Block until no compile is queued or running (tests, benchmarks, shutdown).

        Returns:
            False if ``timeout`` seconds passed first.
        """
        return self._idle.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Stop the background compiler after its current job (waits up to ``timeout`` s)."""
        worker = self._worker
        if worker is not None:
            self._jobs.put(None)
            worker.wait(timeout)
            self._worker = None

    # ------------------------------------------------------------------ internals

    def _eager_context(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode())
        if self.dtype is not None:
            stack.enter_context(torch.autocast(self.device.type, dtype=self.dtype))
        return stack

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._compile_isolated(job)
            finally:
                with self._state_lock:
                    self._pending -= 1
                    if self._pending == 0:
                        self._idle.set()

    def _compile_isolated(self, job: _Job) -> None:
        """The background job: the compile in a child process (skipped when the compiled policy
        is already stored, see ``artifact_path``), then loading it here, yielding the GIL often."""
        assert self.config is not None
        start = time.perf_counter()
        x_dict, edge_index_dict = inputs = (job.x_dict, job.edge_index_dict)
        stored = artifact_path(
            self.model, inputs, config=self.config, device=self.device, dtype=self.dtype, process=job.process
        )
        with tempfile.TemporaryDirectory(prefix="esper-tamiyo-policy-") as tmp:
            path = stored or Path(tmp) / "policy.bin"
            loaded = time.perf_counter()
            self.cache_warm_s = 0.0
            self.stage = "loading"
            with loading(), recorded_vec_isa():
                fn = self._load_stored(path)
            try:
                if fn is None:
                    self.stage = "warming"
                    warm_in_subprocess(
                        self.model,
                        inputs,
                        out=path,
                        process=job.process,
                        guard_state=job.guard_state,
                        config=self.config,
                        device=self.device,
                        dtype=self.dtype,
                        timeout_s=self.config.warmup_timeout_s,
                    )
                    loaded = time.perf_counter()
                    self.cache_warm_s = loaded - start
                    self.stage = "loading"
                    with loading(), recorded_vec_isa():
                        fn = load_policy(path, model=self.model)
                with loading(), recorded_vec_isa():
                    self._install(fn, x_dict, edge_index_dict)
                self.load_s = time.perf_counter() - loaded
            # A child that failed to compile, or a policy it compiled that does not load or run
            # here, would fail again: serve eagerly for good.
            except Exception as e:  # noqa: BLE001
                self._fall_back(e)
        self.stage = "idle"

    def _compile(self, x_dict: XDict, edge_index_dict: EdgeDict) -> None:
        """Compile in this process (``background=False``; benchmarks, tests): the stored policy when
        there is one (an ahead-of-time compile does not use Inductor's caches: 10-20 s each time
        on 2 cores), else a compile here, stored for the next process."""
        assert self.config is not None
        inputs = (x_dict, edge_index_dict)
        stored = artifact_path(
            self.model, inputs, config=self.config, device=self.device, dtype=self.dtype, process=process_state()
        )
        try:
            with self._lock:
                if not self._enabled:
                    return
                with recorded_vec_isa():
                    fn = self._load_stored(stored)
                if fn is None:
                    with compiled_context(self.device, self.dtype):
                        fn = compile_policy(self.model, inputs, config=self.config)
                    if stored is not None:
                        save_policy(fn, stored, model=self.model)
            self._install(fn, x_dict, edge_index_dict)
        # Compiler failures surface as many exception types (BackendCompilerFailed, Unsupported,
        # InductorError, ...): each means "serve eagerly", not "crash".
        except Exception as e:  # noqa: BLE001
            self._fall_back(e)

    def _load_stored(self, path: Path | None) -> CompiledPolicy | None:
        """The policy stored at ``path``; None when there is none or it does not load (another
        PyTorch or machine wrote it, or the file is damaged: it is removed, to be compiled again)."""
        if path is None or not path.exists():
            return None
        try:
            return load_policy(path, model=self.model)
        except Exception as e:  # noqa: BLE001 - unpickling and PyTorch's compatibility checks raise many types
            log.info("Tamiyo: the stored compiled policy %s did not load (%s); compiling it again", path, e)
            path.unlink(missing_ok=True)
            return None

    def _install(self, fn: CompiledPolicy, x_dict: XDict, edge_index_dict: EdgeDict) -> None:
        """Make ``fn`` servable after one call on its own inputs (lazy initialisation and, on
        CUDA, graph capture happen here rather than in a decision).

        Raises:
            RuntimeError: ``fn``'s guards reject the very inputs it was compiled for: it would
                never serve a decision (a process setting the child did not share, say).
        """
        with self._lock:
            if not self._enabled:
                return
            with compiled_context(self.device, self.dtype):
                if not fn.guard_check(self.model, x_dict, edge_index_dict):
                    raise RuntimeError(
                        "the compiled policy's guards reject the inputs it was compiled for, so it would never "
                        "serve: this process's global state differs from the compiling one's (compare "
                        "esper_core.tamiyo.precompile.process_state in both)"
                    )
                fn(self.model, x_dict, edge_index_dict)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self._compiled = (*self._compiled, fn)
            if self.ready_after_s is None and self._started is not None:
                self.ready_after_s = time.perf_counter() - self._started

    def _fall_back(self, error: BaseException) -> None:
        self.fallback_total += 1
        self._enabled = False
        self._compiled = ()
        if self.fallback_reason is None:
            self.fallback_reason = f"{type(error).__name__}: {error}".splitlines()[0][:500]
            log.warning("Tamiyo policy compile disabled, serving eager from now on: %s", self.fallback_reason)

    def load_state_dict(self, state_dict: dict[str, Tensor]) -> None:
        """Copy new weights into the served network in place (the compiled code stays valid)."""
        with torch.no_grad():
            self.model.load_state_dict(state_dict)


def warm_in_subprocess(
    model: TamiyoGNN,
    inputs: tuple[dict[Any, torch.Tensor], dict[Any, torch.Tensor]],
    *,
    out: Path,
    process: dict[str, Any],
    guard_state: str,
    config: PolicyCompileConfig,
    device: torch.device,
    dtype: torch.dtype | None,
    timeout_s: float,
) -> None:
    """Compile ``model`` for ``inputs`` in a child process and store the compiled policy at ``out``.

    The child also fills the shared compiler cache. It takes the serving thread's settings that
    the compiled policy's guards check (``process``: the intra-op thread count, which Inductor
    also bakes into its CPU kernels, matmul precision, determinism, ...) and fails naming the
    difference if Dynamo still sees another global state than ``guard_state``.

    Args:
        model: The served policy network (its config and weights are copied to the child).
        inputs: ``(x_dict, edge_index_dict)`` of the shapes to compile for.
        out: Where the child writes the compiled policy (``precompile.save_policy``).
        process: The serving thread's settings (``precompile.process_state``) the child takes.
        guard_state: Dynamo's global state on the serving thread (``guard_state_under``); the
            child fails if it sees another after taking ``process``.
        config: The compile settings the serving process will use (same mode and dynamic).
        device: Where the policy runs.
        dtype: The autocast dtype, or None.
        timeout_s: Longest the child may take.

    Raises:
        RuntimeError: If the child fails or times out (its error output is quoted).
    """
    x_dict, edge_index_dict = inputs
    job = {
        "gnn": dataclasses.asdict(model.config),
        "state": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "x": {k: v.cpu() for k, v in x_dict.items()},
        "edges": {k: v.cpu() for k, v in edge_index_dict.items()},
        "mode": config.mode,
        "dynamic": config.dynamic,
        "backend": config.backend,
        "device": str(device),
        "dtype": None if dtype is None else str(dtype).removeprefix("torch."),
        "process": process,
        "guard_state": guard_state,
        "out": str(out),
    }
    with tempfile.TemporaryDirectory(prefix="esper-tamiyo-warmup-") as tmp:
        path = Path(tmp) / "job.pt"
        torch.save(job, path)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "esper_core.tamiyo.warmup", str(path)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"the compile warm-up process took over {timeout_s:.0f} s") from e
    if done.returncode != 0:
        raise RuntimeError(f"the compile warm-up process failed: {done.stderr.strip()[-1500:]}")


def policy_graph() -> TamiyoGraph:
    """The ``policy-graph`` workload: 1 global + 40 layers + 6 slots + 4 blueprints = 51 nodes."""
    return build_graph(synthetic_history(num_layers=40, num_slots=6), synthetic_candidates(4), total_epochs=10)


def prepare_policy(model: TamiyoGNN, cfg: TamiyoConfig, *, cache_dir: Path | None = None) -> PreparedPolicy:
    """Apply precision, device, autocast and compilation to ``model``, in that order.

    Eager policies get one dry forward (it checks the model runs on ``cfg.device`` before the
    first decision). Compiled ones (``cfg.compiles``) start compiling on the ``policy-graph``
    workload, in the background unless ``cfg.compile.background`` is False.

    Args:
        model: The policy network (moved and switched to eval mode in place).
        cfg: Service configuration (``device``, ``policy``, ``compile``).
        cache_dir: Compiler cache directory, normally ``<ESPER_HOME>/cache/inductor``; None
            keeps whatever this process uses.

    Returns:
        The callable that serves inference.
    """
    initialise_pytorch_defaults()
    device = torch.device(cfg.device)
    model = model.to(device).eval()
    dtype = autocast_dtype(device)
    _log_precision(str(device), str(dtype))
    if cfg.compiles and cache_dir is not None:
        use_compiler_cache(cache_dir)
    policy = PreparedPolicy(model, device=device, compile_config=cfg.compile if cfg.compiles else None, dtype=dtype)
    example = policy.inputs(policy_graph())
    if not policy.warm(*example):
        policy(*example)
    return policy


_logged: set[tuple[str, str]] = set()


def _log_precision(device: str, dtype: str) -> None:
    if (device, dtype) not in _logged:
        _logged.add((device, dtype))
        reason = "CUDA" if cuda_available() and device.startswith("cuda") else "CPU: autocast off"
        log.info("Tamiyo policy on %s, autocast %s (%s)", device, dtype, reason)
