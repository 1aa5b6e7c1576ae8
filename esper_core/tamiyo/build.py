"""Prepare a Tamiyo policy for inference: the one place performance features are applied.

``prepare_policy`` applies, in this order (seed 002): float32 matmul precision / TF32 once per
process; device and eval mode; the autocast dtype (bf16 on CUDA, fp16 where bf16 is missing,
off on CPU); then an ahead-of-time ``torch.compile(dynamic=True, mode="reduce-overhead",
fullgraph=True)`` with the compiler caches under ``<ESPER_HOME>/cache/inductor``. ``TamiyoGNN``
itself stays plain PyTorch.

Never blocking a decision on the compiler: a cold compile costs 30-45 s on 2 busy CPU cores, and
loading a stored one ~1.5 s of GIL-held Python. Both happen in a policy server process
(``esper_core.tamiyo.server``) that then serves the compiled policy; this process serves eagerly
until the server is ready, and changes no interpreter-wide state for it. A policy compiled once is
stored (``esper_core.tamiyo.precompile``) and the next server loads it without compiling.

Each compiled policy carries the guards of its compile (shapes, dtypes, grad mode); a decision
whose inputs no compiled policy accepts (e.g. a first graph with one slot after compiling on six)
is served eagerly while the server compiles for those inputs too. Any other compiler or runtime
error, or a server that exits or stops answering, disables the compiled path for good: one
WARNING, ``fallback_total`` (exported as ``tamiyo.gnn.compile_fallback_total``), eager from then on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import weakref
from pathlib import Path

import torch
from torch import Tensor

from esper_core._capabilities import cuda_available, initialise_pytorch_defaults, one_thread
from esper_core.tamiyo.config import PolicyCompileConfig, TamiyoConfig
from esper_core.tamiyo.graph import EdgeType, NodeType, TamiyoGraph, build_graph
from esper_core.tamiyo.model import PolicyOutput, TamiyoGNN
from esper_core.tamiyo.precompile import process_state
from esper_core.tamiyo.server import PolicyServer, Setup, Timing, pack_inputs, pack_state, unpack
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history

log = logging.getLogger(__name__)

XDict = dict[NodeType, Tensor]
EdgeDict = dict[EdgeType, Tensor]

CALL_TIMEOUT_S = 30.0
"""Longest a decision waits for the policy server's compiled answer (it takes ~1 ms) before
compiling is given up for good: a server that hangs must not hang the run."""


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
    """The policy as Tamiyo calls it: compiled when its server is ready, eager otherwise, never
    waiting for a compile.

    The compiled policy lives in a policy server process (``esper_core.tamiyo.server``), started by
    the first ``warm``. This process serves eagerly until the server says a compile is ready, then
    sends it each decision's inputs while no compile is in flight. Weights changed here (by
    ``load_state_dict`` or an optimiser step, seen by the parameters' version counters) reach the
    server before the next compiled decision.

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
        self.compile_s = 0.0
        """Seconds the server spent compiling for the last ready shapes (0: loaded from the store)."""
        self.load_s = 0.0
        """Seconds the server spent loading the stored policy for the last ready shapes."""
        self.ready_after_s: float | None = None
        """Seconds from the first ``warm`` until a compiled policy was ready (the server's start included)."""
        self._enabled = compile_config is not None
        self._server: PolicyServer | None = None
        self._stop_server: weakref.finalize | None = None
        self._ready = 0  # compiles the server has finished
        self._pending: float | None = None  # when the compile in flight was asked for
        self._queued: list[tuple[XDict, EdgeDict]] = []  # compiles waiting for the one in flight
        self._shapes: set[tuple[tuple[int, ...], ...]] = set()
        self._started: float | None = None
        self._weights_version = -1  # the parameters' version the server holds
        self._tensors: tuple[Tensor, ...] | None = None

    @property
    def compile_enabled(self) -> bool:
        """True once a compiled policy is ready and compiling has not fallen back."""
        return self._enabled and self._ready > 0

    @property
    def compiling(self) -> bool:
        """True while the server compiles (or loads) for new shapes."""
        return self._enabled and self._pending is not None

    def inputs(self, graph: TamiyoGraph) -> tuple[XDict, EdgeDict]:
        """The graph's ``(x_dict, edge_index_dict)`` on the policy's device (pinned copies on CUDA)."""
        x_dict = {nt: host_to_device(x, self.device) for nt, x in graph.x_dict.items()}
        edge_index_dict = {et: host_to_device(ei, self.device) for et, ei in graph.edge_index_dict.items()}
        return x_dict, edge_index_dict

    def __call__(self, x_dict: XDict, edge_index_dict: EdgeDict) -> PolicyOutput:
        """One inference; never waits on a compile.

        Compiled when the server is idle and one of its compiled functions accepts these inputs;
        otherwise eager under ``inference_mode`` (and autocast on CUDA). Inputs the server's guards
        reject are queued for a compile of their own.
        """
        self._hear(0)
        if self._enabled and self._server is not None and self._ready and self._pending is None:
            out = self._served(x_dict, edge_index_dict)
            if out is not None:
                self.compiled_calls += 1
                self.last_call_compiled = True
                return out
        out = self._eager(x_dict, edge_index_dict)
        self.eager_calls += 1
        self.last_call_compiled = False
        return out

    def _eager(self, x_dict: XDict, edge_index_dict: EdgeDict) -> PolicyOutput:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode())
            if self.dtype is not None:
                stack.enter_context(torch.autocast(self.device.type, dtype=self.dtype))
            if self.device.type == "cpu":
                # A graph of Tamiyo's size gains nothing from a thread team, and while the server
                # compiles on another core each op's team waits for it (measured on 2 cores: 75 ms
                # median decisions with two threads, 4.1 ms on one).
                stack.enter_context(one_thread())
            return self.model(x_dict, edge_index_dict)

    def _served(self, x_dict: XDict, edge_index_dict: EdgeDict) -> PolicyOutput | None:
        """The server's compiled answer; None when its guards reject the inputs (a compile for
        them is queued) or the server failed (compiling falls back for good)."""
        assert self._server is not None
        try:
            self._send_weights()
            self._server.post("call", pack_inputs((x_dict, edge_index_dict)))
            answer = self._server.answer(CALL_TIMEOUT_S)
        except (OSError, EOFError) as e:
            self._fall_back(f"the policy server exited ({e}): {self._server.last_words() or 'no error output'}")
            return None
        if answer is None:
            self._fall_back(f"the policy server did not answer a decision within {CALL_TIMEOUT_S:.0f} s")
            return None
        if answer[0] == "out":
            return PolicyOutput(*(unpack(t).to(self.device) for t in answer[1]))
        if answer[0] == "miss":
            self.warm(x_dict, edge_index_dict)
            return None
        self._fall_back(answer[1])
        return None

    def warm(self, x_dict: XDict, edge_index_dict: EdgeDict) -> bool:
        """Compile for these inputs' shapes: in the policy server, waited for unless ``background``.

        Returns:
            True when a compile was started or queued; False when compiling is off, has fallen
            back, the shapes were seen before, or ``max_shapes`` is reached.
        """
        if not self._enabled or self.config is None:
            return False
        shapes = tuple(tuple(t.shape) for t in (*x_dict.values(), *edge_index_dict.values()))
        if shapes in self._shapes or len(self._shapes) >= self.config.max_shapes:
            return False
        self._shapes.add(shapes)
        if self._started is None:
            self._started = time.perf_counter()
        self._queued.append((x_dict, edge_index_dict))
        self._next_compile()
        if not self.config.background:
            self.wait_until_idle(self.config.warmup_timeout_s)
        return True

    def wait_until_idle(self, timeout: float | None = None) -> bool:
        """Block until no compile is queued or in flight (tests, benchmarks, shutdown).

        Returns:
            False if ``timeout`` seconds passed first.
        """
        deadline = None if timeout is None else time.perf_counter() + timeout
        while self.compiling:
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left <= 0:
                return False
            self._hear(left)
        return True

    def load_state_dict(self, state_dict: dict[str, Tensor]) -> None:
        """Copy new weights into the served network in place (the server gets them before its next call)."""
        with torch.no_grad():
            self.model.load_state_dict(state_dict)

    def close(self, timeout: float | None = None) -> None:
        """Stop the policy server (killed if it has not exited after ``timeout`` s, default 10)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(10.0 if timeout is None else timeout)
        if self._stop_server is not None:
            self._stop_server.detach()
        self._ready = 0
        self._pending = None
        self._queued.clear()

    # ------------------------------------------------------------------ internals

    def _next_compile(self) -> None:
        """Start the next queued compile if none is in flight (the server does one thing at a time)."""
        if self._pending is not None or not self._queued or not self._enabled:
            return
        assert self.config is not None
        inputs = pack_inputs(self._queued.pop(0))
        try:
            if self._server is None:
                self._server = PolicyServer(
                    Setup(
                        gnn=self.model.config,
                        state=pack_state(self.model),
                        config=self.config,
                        device=str(self.device),
                        dtype=None if self.dtype is None else str(self.dtype).removeprefix("torch."),
                        # Read here, on the serving thread: the intra-op thread count is per thread.
                        process=process_state(),
                        inputs=inputs,
                    )
                )
                self._weights_version = self._version()
                # A policy dropped without ``close`` does not leave its server behind.
                self._stop_server = weakref.finalize(self, self._server.stop, 10.0)
            else:
                self._server.post("compile", inputs)
        except OSError as e:
            self._fall_back(f"the policy server could not be started or reached: {e}")
            return
        self._pending = time.perf_counter()

    def _hear(self, timeout_s: float | None) -> None:
        """Take in what the server said about its compile (``ready`` or ``failed``), waiting up
        to ``timeout_s``; a compile past ``warmup_timeout_s`` gives compiling up for good."""
        if self._server is None or self._pending is None:
            return
        assert self.config is not None
        try:
            answer = self._server.answer(timeout_s)
        except (OSError, EOFError) as e:
            self._fall_back(f"the policy server exited ({e}): {self._server.last_words() or 'no error output'}")
            return
        if answer is None:
            if time.perf_counter() - self._pending > self.config.warmup_timeout_s:
                self._fall_back(f"the policy server's compile took over {self.config.warmup_timeout_s:.0f} s")
            return
        if answer[0] != "ready":
            self._fall_back(answer[1])
            return
        timing: Timing = answer[1]
        self.compile_s, self.load_s = timing.compile_s, timing.load_s
        self._ready += 1
        self._pending = None
        if self.ready_after_s is None and self._started is not None:
            self.ready_after_s = time.perf_counter() - self._started
        self._next_compile()

    def _version(self) -> int:
        """A number that changes whenever a parameter or buffer of the network changes in place."""
        if self._tensors is None:  # the network's structure is fixed; walking it cost 0.05 ms a call
            self._tensors = (*self.model.parameters(), *self.model.buffers())
        return sum(t._version for t in self._tensors)

    def _send_weights(self) -> None:
        assert self._server is not None
        version = self._version()
        if version != self._weights_version:
            self._server.post("weights", pack_state(self.model))
            self._weights_version = version

    def _fall_back(self, reason: str) -> None:
        self.fallback_total += 1
        self._enabled = False
        self._ready = 0
        if self.fallback_reason is None:
            self.fallback_reason = reason.splitlines()[0][:500]
            log.warning("Tamiyo policy compile disabled, serving eager from now on: %s", self.fallback_reason)
        self.close(timeout=1.0)


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
