"""Prepare a Tamiyo policy for inference: the one place performance features are applied.

``prepare_policy`` applies, in this order (seed 002): float32 matmul precision / TF32 once per
process; device and eval mode; the autocast dtype (bf16 on CUDA, fp16 where bf16 is missing,
off on CPU); then ``torch.compile(dynamic=True, mode="reduce-overhead")`` with the compiler
caches under ``<ESPER_HOME>/cache/inductor``. ``TamiyoGNN`` itself stays plain PyTorch.

Never blocking a decision on the compiler: a cold compile costs 30-45 s on 2 busy CPU cores
(5-7 s with the cache directory kept from an earlier process). So eager serves until the
compiled module is ready, and the compile happens off the decision path in two stages: a
low-priority child process (``esper_core.tamiyo.warmup``) compiles the same module and shapes
into the shared on-disk cache, then a background thread compiles in this process against the
now hot cache. A compile on a thread of this process would hold its GIL for the whole cold
compile, and eager decisions made meanwhile took seconds (2.8 s measured). The compiled module is then called under
``torch.compiler.set_stance("fail_on_recompile")``: a graph whose shapes would need a recompile
(e.g. a first graph with one slot after warming up on six) is served eagerly while a background
job compiles that shape too. The stance is process-global, so it is only set while this policy's
lock is held, and the background job compiles only while holding the same lock.

Any other compiler or runtime error disables the compiled path for good: one WARNING,
``fallback_total`` (exported as ``tamiyo.gnn.compile_fallback_total``), eager from then on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from esper_core._capabilities import cuda_available, initialise_pytorch_defaults, one_thread
from esper_core.tamiyo.config import PolicyCompileConfig, TamiyoConfig
from esper_core.tamiyo.graph import EdgeType, NodeType, TamiyoGraph, build_graph
from esper_core.tamiyo.model import PolicyOutput, TamiyoGNN
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history
from esper_core.threads import start_daemon

log = logging.getLogger(__name__)

XDict = dict[NodeType, Tensor]
EdgeDict = dict[EdgeType, Tensor]
_RECOMPILE_MESSAGE = "Detected recompile"  # the RuntimeError text of the fail_on_recompile stance

LOADING_SWITCH_INTERVAL_S = 2e-5
"""The interpreter's thread switch interval while this process compiles against the hot cache.

Dynamo and Inductor run in Python on the background thread; each torch op of an eager decision
releases the GIL and then waits for it for up to the switch interval (5 ms by default), so a
~200-op decision took up to 1 s while loading. At 0.1 ms the worst decision during a load was
still 43-69 ms on a quiet 2-core machine; at 0.02 ms it is 21-24 ms and the load takes the same
~2.7-3.0 s (``esper bench policy``). Process-wide, so it is set only while loading (``_yielding``).
"""
_yield_lock = threading.Lock()
_yield_depth = 0
_yield_previous = 0.0


@contextlib.contextmanager
def _yielding() -> Iterator[None]:
    """Run the block with ``LOADING_SWITCH_INTERVAL_S`` (nested or concurrent blocks share it)."""
    global _yield_depth, _yield_previous
    with _yield_lock:
        if _yield_depth == 0:
            _yield_previous = sys.getswitchinterval()
            sys.setswitchinterval(LOADING_SWITCH_INTERVAL_S)
        _yield_depth += 1
    try:
        yield
    finally:
        with _yield_lock:
            _yield_depth -= 1
            if _yield_depth == 0:
                sys.setswitchinterval(_yield_previous)


def warm_marker(
    model: TamiyoGNN,
    inputs: tuple[dict[Any, Tensor], dict[Any, Tensor]],
    *,
    config: PolicyCompileConfig,
    device: torch.device,
    dtype: torch.dtype | None,
) -> Path | None:
    """Where a completed compile of this policy and these shapes is recorded in the compiler cache.

    Its presence means the on-disk cache already holds the compile, so the warm-up child process
    (3-5 s of start-up and imports on 2 cores) is skipped and this process loads directly. It lives
    inside the cache directory, so removing the cache removes it too.

    Returns:
        The marker's path; None when no cache directory is set (``use_compiler_cache``).
    """
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache is None:
        return None
    x_dict, edge_index_dict = inputs
    shapes = sorted((str(k), tuple(v.shape)) for k, v in (*x_dict.items(), *edge_index_dict.items()))
    key = json.dumps(
        {
            "gnn": dataclasses.asdict(model.config),
            "compile": [config.mode, config.dynamic, config.backend],
            "device": str(device),
            "dtype": str(dtype),
            "shapes": shapes,
            "torch": torch.__version__,
        },
        sort_keys=True,
        default=str,
    )
    return Path(cache) / "tamiyo-warm" / hashlib.sha256(key.encode()).hexdigest()[:32]


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
        """Seconds the last background job then spent compiling in this process (hot cache)."""
        self.stage = "idle"
        """What the background compile is doing: ``idle``, ``warming`` (the child process
        compiles) or ``loading`` (this process compiles against the hot cache)."""
        self.ready_after_s: float | None = None
        """Seconds from the first ``warm`` call until the compiled module was ready."""
        self._started: float | None = None
        self._compiled: Callable[..., PolicyOutput] | None = None
        self._ready = False
        self._lock = threading.Lock()  # held while the compiled module runs or compiles
        self._jobs: queue.SimpleQueue[tuple[XDict, EdgeDict] | None] = queue.SimpleQueue()
        self._shapes: set[tuple[tuple[int, ...], ...]] = set()
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0
        self._state_lock = threading.Lock()
        # Set once the background compiler has stopped; None until it starts.
        self._worker: threading.Event | None = None
        if compile_config is not None:
            try:
                self._compiled = torch.compile(
                    model, dynamic=compile_config.dynamic, mode=compile_config.mode, backend=compile_config.backend
                )
            # torch.compile itself raises only for an unusable setup (no compiler, bad mode).
            except Exception as e:  # noqa: BLE001
                self._fall_back(e)

    @property
    def compile_enabled(self) -> bool:
        """True once a compiled module is ready and has not fallen back."""
        return self._ready and self._compiled is not None

    def inputs(self, graph: TamiyoGraph) -> tuple[XDict, EdgeDict]:
        """The graph's ``(x_dict, edge_index_dict)`` on the policy's device (pinned copies on CUDA)."""
        x_dict = {nt: host_to_device(x, self.device) for nt, x in graph.data.x_dict.items()}
        edge_index_dict = {et: host_to_device(ei, self.device) for et, ei in graph.data.edge_index_dict.items()}
        return x_dict, edge_index_dict

    def __call__(self, x_dict: XDict, edge_index_dict: EdgeDict) -> PolicyOutput:
        """One inference under ``inference_mode`` (and autocast on CUDA); never waits on a compile."""
        if self.compile_enabled and self._lock.acquire(blocking=False):
            needs_compile = False
            try:
                with torch.compiler.set_stance("fail_on_recompile"), self._context():
                    assert self._compiled is not None
                    out = self._compiled(x_dict, edge_index_dict)
                self.compiled_calls += 1
                self.last_call_compiled = True
                return out
            # A recompile request is a RuntimeError; anything else raised by compiled code
            # (Inductor, Triton, CUDA graph errors come in many types) retires the compiled path.
            except Exception as e:  # noqa: BLE001
                needs_compile = isinstance(e, RuntimeError) and _RECOMPILE_MESSAGE in str(e)
                if not needs_compile:
                    self._fall_back(e)
            finally:
                self._lock.release()
            if needs_compile:  # after releasing the lock: the compile job takes it
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
        # compiles, so it changes only under the lock a compile holds; while one runs, the
        # decision keeps the process's threads rather than wait.
        if self.device.type == "cpu" and self._lock.acquire(blocking=False):
            try:
                with one_thread(), self._context():
                    return self.model(x_dict, edge_index_dict)
            finally:
                self._lock.release()
        with self._context():
            return self.model(x_dict, edge_index_dict)

    def warm(self, x_dict: XDict, edge_index_dict: EdgeDict) -> bool:
        """Compile for these inputs' shapes: in the background, or now when not ``background``.

        Returns:
            True when a compile was started or queued; False when compiling is off, has fallen
            back, the shapes were seen before, or ``max_shapes`` is reached.
        """
        if self._compiled is None or self.config is None:
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
        self._jobs.put((x_dict, edge_index_dict))
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

    @contextlib.contextmanager
    def _context(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode())
            if self.dtype is not None:
                stack.enter_context(torch.autocast(self.device.type, dtype=self.dtype))
            yield

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._compile_isolated(*job)
            finally:
                with self._state_lock:
                    self._pending -= 1
                    if self._pending == 0:
                        self._idle.set()

    def _compile_isolated(self, x_dict: XDict, edge_index_dict: EdgeDict) -> None:
        """The background job: the cold compile in a child process (skipped when ``warm_marker``
        says the cache already holds it), then the hot one here, yielding the GIL often."""
        assert self.config is not None
        start = time.perf_counter()
        inputs = (x_dict, edge_index_dict)
        marker = warm_marker(self.model, inputs, config=self.config, device=self.device, dtype=self.dtype)
        if marker is None or not marker.exists():
            self.stage = "warming"
            try:
                warm_in_subprocess(
                    self.model,
                    inputs,
                    config=self.config,
                    device=self.device,
                    dtype=self.dtype,
                    timeout_s=self.config.warmup_timeout_s,
                )
            # A child that failed to compile would fail here too (and cold): serve eagerly for good.
            except RuntimeError as e:
                with self._lock:
                    self._fall_back(e)
                self.stage = "idle"
                return
        loaded = time.perf_counter()
        self.cache_warm_s = loaded - start
        self.stage = "loading"
        with _yielding():
            self._compile(x_dict, edge_index_dict)
        self.load_s = time.perf_counter() - loaded
        if marker is not None and self._compiled is not None:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        self.stage = "idle"

    def _compile(self, x_dict: XDict, edge_index_dict: EdgeDict) -> None:
        with self._lock:
            if self._compiled is None:
                return
            try:
                with self._context():
                    self._compiled(x_dict, edge_index_dict)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                self._ready = True
                if self.ready_after_s is None and self._started is not None:
                    self.ready_after_s = time.perf_counter() - self._started
            # Compiler failures surface as many exception types (BackendCompilerFailed,
            # Unsupported, InductorError, ...): each means "serve eagerly", not "crash".
            except Exception as e:  # noqa: BLE001
                self._fall_back(e)

    def _fall_back(self, error: BaseException) -> None:
        self.fallback_total += 1
        self._compiled = None
        self._ready = False
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
    config: PolicyCompileConfig,
    device: torch.device,
    dtype: torch.dtype | None,
    timeout_s: float,
) -> None:
    """Compile ``model`` for ``inputs`` in a child process, filling the shared compiler cache.

    Args:
        model: The served policy network (its config and weights are copied to the child).
        inputs: ``(x_dict, edge_index_dict)`` of the shapes to compile for.
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
