"""The step engine: one training-step closure, run eagerly, compiled, or as a CUDA graph replay.

One guarded path (seed 000 change 1, seed 001 WP-99 2.1 / WP-100): the engine runs
``compile_warmup_steps`` eager steps, then (``compile="auto"``) times eager steps, compiles the
closure once, times compiled steps, and keeps the faster — the decision is measured, not assumed
(on CPU small steps are slower compiled: digits MLP 14.8 -> 20.3 ms an epoch). Timings are noisy
(a loaded machine has flipped the choice), so ``auto`` may only pick a compiled step that
reproduces the eager step bit for bit (loss and every gradient, checked on each shadow step):
otherwise which path won the race would change the run's numbers, and the same recipe and seed
would give different results on a busy and an idle machine. The decision is cached per
environment and workload, so later runs skip the measurement. A compile failure falls
back to eager for good, logged once and reported as ``tolaria.compile_fallback``. CUDA graphs
(``enable_graphs``) replay the eager step in the steady state; on a device without CUDA the
request is reported as ``tolaria.graph_fallback`` and training continues eagerly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from esper_core.contracts import MetricPoint, TelemetryEvent, TelemetryLevel
from esper_core.interrupts import DeadlinePassed, raise_at_deadline
from esper_core.tolaria.graphs import GraphRunner, StepFn

log = logging.getLogger(__name__)

COMPILE_CHOICES = ("auto", "on", "off")


@dataclass(kw_only=True, slots=True)
class StepEngineConfig:
    """How the training step runs."""

    compile: str = "auto"
    """``auto``: measure eager vs compiled and keep the faster; ``on``: compile (eager only on
    failure); ``off``: never compile."""
    compile_mode: str | None = None
    """``torch.compile`` mode (None = default, ``reduce-overhead``, ``max-autotune``...)."""
    compile_dynamic: bool | None = False
    """``torch.compile(dynamic=...)``; False: the epoch's short last batch compiles its own graph."""
    compile_backend: str = "inductor"
    """``torch.compile`` backend; ``aot_eager`` skips code generation (fast, for tests)."""
    compile_warmup_steps: int = 2
    """Eager steps before compiling (lets lazy state settle; seed 001 ``compile_warmup_steps``)."""
    measure_steps: int = 8
    """Steps timed on each path when ``compile='auto'`` decides."""
    decision_margin: float = 0.05
    """Compiled must be at least this much faster (fraction) to be chosen."""
    compile_budget: float | None = 0.05
    """Share of the run's expected training time the ``auto`` compile trial may cost. Before
    compiling, the trial's cost is estimated (``estimate_compile_s``: this environment's earlier
    compiles, else a prior) and the run's length from its median eager step x its steps; a trial
    over budget is skipped, eager kept, with the reason (``tolaria.compile_disabled``): a CPU
    compile costs 10-200 s, which a run of a few minutes never earns back (a 12-epoch GPT spent
    30 % of its wall time in one). A trial the estimate let through is stopped when its compile
    and shadow steps reach the budget (on the main thread: ``interrupts.raise_at_deadline``),
    eager kept, and the limit is remembered as a compile at least that long. The choice only ever
    falls back to the eager step, so it cannot change a run's numbers; neither a skipped nor a
    stopped trial is cached as the workload's decision (both depend on the run's length, not the
    workload). None: always measure, without a limit."""
    enable_graphs: bool = False
    """Capture the steady-state eager step as a CUDA graph (CUDA only)."""
    enable_graph_pool_reuse: bool = True
    """Share one graph memory pool across captures in the process (seed 004)."""

    def __post_init__(self) -> None:
        if self.compile not in COMPILE_CHOICES:
            raise ValueError(f"compile must be one of {COMPILE_CHOICES}, got {self.compile!r}")
        if self.compile_warmup_steps < 0:
            raise ValueError(f"compile_warmup_steps must be >= 0, got {self.compile_warmup_steps}")
        if self.measure_steps < 3:
            raise ValueError(f"measure_steps must be >= 3 for a median to mean anything, got {self.measure_steps}")
        if not 0.0 <= self.decision_margin < 1.0:
            raise ValueError(f"decision_margin must lie in [0, 1), got {self.decision_margin}")
        if self.compile_budget is not None and not 0.0 < self.compile_budget <= 1.0:
            raise ValueError(
                f"compile_budget must lie in (0, 1] (a share of the run's training time; None: always measure), "
                f"got {self.compile_budget}"
            )


COMPILE_PRIOR_BASE_S = 10.0
COMPILE_PRIOR_PER_TENSOR_S = 3.0
"""A compile's cost before any was measured here: base + per parameter tensor of the step (its
backward graph grows with them). Fitted to this project's 2-core CPU machine: 10-40 s for the
small recipes (2-8 tensors), 93 s for ``chars-gpt`` (30), 150-190 s for a 4-layer nanoGPT."""


def estimate_compile_s(param_tensors: int, history: Iterable[dict[str, Any]]) -> tuple[float, str]:
    """Expected seconds to compile a step over ``param_tensors`` parameter tensors, and how it was estimated.

    ``history``: decision-cache entries of this environment (torch version and device). Those
    that recorded their compile scale the prior to this machine's speed (the median ratio of
    measured to prior cost); without any, the prior stands.
    """

    def prior(tensors: int) -> float:
        return COMPILE_PRIOR_BASE_S + COMPILE_PRIOR_PER_TENSOR_S * tensors

    ratios = [
        e["warmup_ms"] / 1e3 / prior(int(e["param_tensors"]))
        for e in history
        if e.get("warmup_ms", 0.0) > 0.0 and "param_tensors" in e
    ]
    if not ratios:
        return prior(param_tensors), "prior"
    return prior(param_tensors) * statistics.median(ratios), f"{len(ratios)} earlier compile(s) here"


class DecisionCache:
    """Compile decisions per (environment, workload) in a JSON file, shared by later runs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached decision for ``key``, if any."""
        if not self.path.exists():
            return None
        return json.loads(self.path.read_text()).get(key)

    def entries(self, prefix: str) -> list[dict[str, Any]]:
        """Every cached decision whose key starts with ``prefix`` (e.g. one environment's)."""
        if not self.path.exists():
            return []
        return [v for k, v in json.loads(self.path.read_text()).items() if k.startswith(prefix)]

    def put(self, key: str, decision: dict[str, Any]) -> None:
        """Record ``decision`` for ``key`` (atomic replace; the last writer wins)."""
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        data[key] = decision
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, self.path)


class StepEngine:
    """Runs the step closure on the path the configuration and measurements choose.

    Args:
        step_fn: forward + loss + backward on ``(x, y)``, returning a detached tensor of the
            batch's statistics (Tolaria's: loss sum, correct, counted), compared bit for bit
            between the eager and compiled paths.
        zero_grad: clears gradients before an eager or compiled step.
        parameters: the parameters the step computes gradients for (read at each check, so
            seeds added later count): ``auto`` compares the compiled step's gradients with eager's.
        buffers: the model's buffers (a BatchNorm's running statistics), which a shadow step
            would update: they are put back after it.
        config: engine settings.
        device: where the step runs (graphs need CUDA).
        workload: identifies the model and batch shape for the decision cache.
        cache: where decisions are remembered; None measures every time.
        run_steps: steps of the whole run, if known (``compile_budget`` needs it).
    """

    def __init__(
        self,
        step_fn: StepFn,
        *,
        zero_grad: Callable[[], None],
        parameters: Callable[[], Iterable[torch.Tensor]],
        buffers: Callable[[], Iterable[torch.Tensor]] = tuple,
        config: StepEngineConfig,
        device: torch.device,
        workload: str,
        cache: DecisionCache | None = None,
        run_steps: int | None = None,
    ) -> None:
        self.step_fn = step_fn
        self.run_steps = run_steps
        self.zero_grad = zero_grad
        self.parameters = parameters
        self.buffers = buffers
        self.config = config
        self.device = device
        self.cache = cache
        self._environment = f"{torch.__version__}|{_device_name(device)}|"
        self.cache_key = "|".join(
            [
                torch.__version__,
                _device_name(device),
                workload,
                config.compile_backend,
                str(config.compile_mode),
                str(config.compile_dynamic),
            ]
        )
        self.steps = 0
        self.compiled_fn: StepFn | None = None
        self.use_compiled = False
        self.decided = config.compile == "off"
        self.fallback_reason: str | None = None
        self.warmup_ms = 0.0
        self._trial_s = 0.0  # what the auto compile trial has cost so far (compile, shadow steps)
        self._timings: dict[str, list[float]] = {"eager": [], "compiled": []}
        self._events: list[TelemetryEvent] = []
        self._compiled_epoch = False
        self.backend = TracingBackend(config.compile_backend, mode=config.compile_mode, dynamic=config.compile_dynamic)
        self.compiled_epochs = 0
        self.graphs: GraphRunner | None = None
        self._graph_fallback_shapes: set[tuple] = set()
        self._signature: Hashable = None
        # A cached choice is applied where a measured one would be: same switch point, same path.
        self._cached_choice: tuple[bool, str] | None = None
        # A measured decision waiting for the next epoch boundary: (compiled?, reason).
        self._pending: tuple[bool, str] | None = None
        # The first difference between a shadow compiled step and the eager step, if any.
        self._mismatch: str | None = None
        self._setup_graphs()
        self._apply_cached_decision()

    # ------------------------------------------------------------------ setup

    def _setup_graphs(self) -> None:
        if not self.config.enable_graphs:
            return
        if self.device.type != "cuda":
            self._event(
                "tolaria.graph_fallback",
                TelemetryLevel.WARNING,
                f"CUDA graphs need a CUDA device; training on {self.device} runs the eager step",
                reason="no_cuda",
            )
            return
        self.graphs = GraphRunner(
            self.step_fn, parameters=self.parameters, reuse_pool=self.config.enable_graph_pool_reuse
        )

    def _apply_cached_decision(self) -> None:
        if self.config.compile != "auto" or self.cache is None:
            return
        cached = self.cache.get(self.cache_key)
        # A compiled choice is only trusted when its exactness was checked (entries written
        # before the check existed are measured again).
        if cached is None or (cached["compiled"] and not cached.get("exact", False)):
            return
        log.info("step engine: cached decision for this workload: %s", "compiled" if cached["compiled"] else "eager")
        self._cached_choice = (
            bool(cached["compiled"]),
            f"cached decision (eager {cached['eager_ms']:.3f} ms vs compiled {cached['compiled_ms']:.3f} ms)",
        )

    # ------------------------------------------------------------------ running

    @property
    def warmup_remaining(self) -> int:
        """Steps until the engine has made its compile decision (it applies at the next epoch)."""
        if self.decided:
            return 0
        return max(0, self._decision_step - self.steps)

    @property
    def _decision_step(self) -> int:
        """The step at which the path is chosen: fixed by the configuration, never by timings."""
        cfg = self.config
        if cfg.compile == "on":
            return cfg.compile_warmup_steps + 1
        return cfg.compile_warmup_steps + 2 * cfg.measure_steps

    def start_epoch(self, signature: Hashable) -> None:
        """Apply a decision reached during the last epoch, and note the model's structure (seed
        stages): a change invalidates a captured graph."""
        if self._pending is not None:
            compiled, reason = self._pending
            self._pending = None
            self._choose(compiled=compiled, reason=reason)
        if signature != self._signature and self.graphs is not None and self.graphs.captured:
            self.graphs.reset()
        self._signature = signature
        self._compiled_epoch = False

    def run(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One training step on ``(x, y)``; returns the step function's detached statistics."""
        self.steps += 1
        if self.decided:
            return self._decided_step(x, y)
        return self._deciding_step(x, y)

    def epoch_step(self) -> StepFn:
        """What each step of the epoch just started calls: ``run``, or, once the eager step is
        chosen and no graph replays it, the eager step itself (a path changes only at an epoch
        boundary, so it holds for the whole epoch)."""
        if self.decided and not self.use_compiled and self.graphs is None:
            return self._counted_eager
        return self.run

    def _counted_eager(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        self.zero_grad()
        return self.step_fn(x, y)

    def _decided_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.use_compiled:
            compiled = self._compiled(x, y)
            if compiled is not None:
                self._compiled_epoch = True
                self.zero_grad()
                return compiled(x, y)
        return self._eager_or_graph(x, y)

    def _deciding_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Warm-up and measurement. Every update here is the eager update: compiled steps are
        timed in the shadow and their gradients discarded, so a retried epoch reproduces exactly
        whatever the timings say, and the choice takes effect at an epoch boundary."""
        cfg = self.config
        if self.steps <= cfg.compile_warmup_steps or self._pending is not None:
            return self._eager(x, y)
        if cfg.compile == "on":
            # No measuring: switch at a fixed step index, which a retry reproduces.
            compiled = self._compiled(x, y)
            if compiled is not None:
                self._choose(compiled=True, reason="compile='on'")
                return self._decided_step(x, y)
            return self._eager(x, y)
        if self._cached_choice is not None:
            if self.steps >= self._decision_step:
                self._pending = self._cached_choice
            return self._eager(x, y)
        if len(self._timings["eager"]) < cfg.measure_steps:
            return self._timed("eager", self._eager, x, y)
        if not self._timings["compiled"] and (short := self._too_short_to_compile()) is not None:
            self._pending = (False, short)
            return self._eager(x, y)
        compiled = self._compiled(x, y)
        if compiled is None or len(self._timings["compiled"]) >= cfg.measure_steps:
            return self._eager(x, y)
        try:
            # Under what is left of the trial's limit: a shadow step can compile again (the
            # epoch's short last batch), and that counts as the trial's cost too.
            with self._trial_step():
                shadow_loss = self._timed("compiled", lambda a, b: self._run_fn(compiled, a, b), x, y)
        except DeadlinePassed as e:
            self._over_limit(str(e))
            return self._eager(x, y)
        self._trial_s += self._timings["compiled"][-1] / 1e3
        shadow_grads = [None if p.grad is None else p.grad.clone() for p in self.parameters()]
        loss = self._eager(x, y)
        if self._mismatch is None:
            self._mismatch = _first_mismatch(shadow_loss, loss, shadow_grads, [p.grad for p in self.parameters()])
        # Decided after the full measurement even when a mismatch shows early: the decision
        # step stays fixed by the configuration, like a cached decision's.
        if len(self._timings["compiled"]) == cfg.measure_steps:
            self._decide()
        return loss

    def _eager_run_s(self) -> float | None:
        """The run's expected eager training time (median eager step x its steps), once measured."""
        if self.run_steps is None or not self._timings["eager"]:
            return None
        return statistics.median(self._timings["eager"]) * self.run_steps / 1e3

    def _trial_limit_s(self) -> float | None:
        """The most the ``auto`` compile trial may take (``compile_budget`` of the run's expected
        eager time), or None: no budget, an unknown run length, or no trial (``on``, a cached choice)."""
        budget, run_s = self.config.compile_budget, self._eager_run_s()
        if self.config.compile != "auto" or budget is None or run_s is None:
            return None
        return budget * run_s

    def _too_short_to_compile(self) -> str | None:
        """Why the compile trial would cost more than ``compile_budget`` of the run, or None if
        it would not (or the run's length is unknown)."""
        budget, run_s = self.config.compile_budget, self._eager_run_s()
        if run_s is None or budget is None:
            return None
        history = self.cache.entries(self._environment) if self.cache is not None else []
        cost_s, basis = estimate_compile_s(sum(1 for _ in self.parameters()), history)
        if cost_s <= budget * run_s:
            return None
        return (
            f"a compile is expected to take ~{cost_s:.0f} s ({basis}), over compile_budget={budget:g} of the "
            f"run's ~{run_s:.0f} s of eager steps: it could not pay for itself"
        )

    def _eager(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self._run_fn(self.step_fn, x, y)

    def _run_fn(self, fn: StepFn, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.zero_grad()
        return fn(x, y)

    def _eager_or_graph(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        graphs = self.graphs
        if graphs is None:
            return self._eager(x, y)
        shape = (tuple(x.shape), tuple(y.shape))
        if graphs.captured and graphs.shape == shape:
            return graphs.replay(x, y)
        if not graphs.captured:
            try:
                loss = graphs.capture(x, y, self.zero_grad)
            except RuntimeError as e:  # capture refused (e.g. a host sync inside the step): stay eager
                self.graphs = None
                self._event("tolaria.graph_fallback", TelemetryLevel.WARNING, str(e)[:300], reason="capture_failed")
                return self._eager(x, y)
            self._event(
                "tolaria.graph_enabled", TelemetryLevel.INFO, "captured the training step", capture_ms=graphs.capture_ms
            )
            return loss
        if shape not in self._graph_fallback_shapes:
            self._graph_fallback_shapes.add(shape)
            self._event(
                "tolaria.graph_fallback",
                TelemetryLevel.INFO,
                f"batch shape {shape[0]} differs from the captured {graphs.shape[0] if graphs.shape else None}; eager step",
                reason="shape_change",
            )
        return self._eager(x, y)

    def _compiled(self, x: torch.Tensor, y: torch.Tensor) -> StepFn | None:
        """The compiled step, built on first use by one shadow call on ``(x, y)`` (its gradients
        are discarded); None after a compile failure, which switches the engine to eager for good."""
        if self.compiled_fn is None and self.fallback_reason is None:
            self._build(x, y)
        return self.compiled_fn

    def _build(self, x: torch.Tensor, y: torch.Tensor) -> None:
        cfg = self.config
        start = time.perf_counter()
        try:
            # The first call compiles (forward graphs while tracing, the backward's at its first
            # backward), all of it under the trial's limit. Its effects are a shadow step's:
            # gradients the next step clears.
            with self._trial_step():
                # The mode travels inside the backend (torch.compile takes a mode for its own inductor only).
                compiled = torch.compile(self.step_fn, dynamic=cfg.compile_dynamic, backend=self.backend)
                self.zero_grad()
                compiled(x, y)
                _sync(self.device)
        except DeadlinePassed as e:
            self._over_limit(str(e))
            return
        except Exception as e:  # noqa: BLE001 - any compiler failure is a hard failure: run eager
            self._fall_back(f"{type(e).__name__}: {e}")
            return
        self.warmup_ms = (time.perf_counter() - start) * 1e3
        self._trial_s += self.warmup_ms / 1e3
        self.compiled_fn = compiled

    def _trial_left_s(self) -> float | None:
        """What is left of the trial's limit (``_trial_limit_s``) after what it has cost so far
        (the compile and the shadow steps), or None: no limit."""
        limit = self._trial_limit_s()
        return None if limit is None else max(limit - self._trial_s, 1e-3)

    def _over_limit(self, message: str) -> None:
        """The trial reached its limit: eager from the next epoch on, as any decision. Not cached as
        this workload's decision (a longer run has a larger budget), but as a compile that took at
        least the limit, which ``estimate_compile_s`` learns this machine's speed from."""
        limit_s = self._trial_limit_s()
        assert limit_s is not None
        self.fallback_reason = message  # never built again
        self.compiled_fn = None
        reason = (
            f"{message} (compile_budget={self.config.compile_budget:g} of the run's "
            f"~{self._eager_run_s():.0f} s of eager steps)"
        )
        self._pending = (False, reason)
        log.warning("step engine: %s; training eagerly", reason)
        if self.cache is not None:
            self.cache.put(
                self.cache_key + "|overran",
                {
                    "compiled": False,
                    "overran": True,
                    "warmup_ms": limit_s * 1e3,
                    "param_tensors": sum(1 for _ in self.parameters()),
                },
            )

    @contextlib.contextmanager
    def _trial_step(self) -> Iterator[None]:
        """A shadow step of the trial: without trace, and stopped at what is left of its limit."""
        with self._without_trace(), raise_at_deadline(self._trial_left_s(), what="the compile trial"):
            yield

    @contextlib.contextmanager
    def _without_trace(self) -> Iterator[None]:
        """Undo a shadow step's effects beyond its gradients (which the next step clears): the
        buffers it updated and the random numbers it drew (dropout) are put back. Whether a trial
        runs depends on timings (``compile_budget``'s estimate), so it must not change the run;
        and the eager step after a shadow one draws the same masks, so the two compare exactly."""
        # Each buffer by identity: one a lazy module adds during the step is the eager step's too.
        saved = [(b, b.detach().clone()) for b in self.buffers()]
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            try:
                yield
            finally:
                with torch.no_grad():
                    for buffer, value in saved:
                        buffer.copy_(value)

    def _timed(self, path: str, fn: StepFn, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        _sync(self.device)
        start = time.perf_counter()
        loss = fn(x, y)
        _sync(self.device)
        self._timings[path].append((time.perf_counter() - start) * 1e3)
        return loss

    def _decide(self) -> None:
        """Choose the path (applied at the next epoch boundary); a compiled step that is not
        exact is never chosen, however fast, so the choice cannot change the run's numbers."""
        exact, mismatch = self._mismatch is None, self._mismatch
        eager = statistics.median(self._timings["eager"])
        compiled = statistics.median(self._timings["compiled"])
        faster = exact and compiled < eager * (1.0 - self.config.decision_margin)
        reason = f"median step eager {eager:.3f} ms vs compiled {compiled:.3f} ms"
        if not exact:
            reason = f"compiled step differs from eager ({mismatch}), eager kept so timings cannot change the numbers"
        self._pending = (faster, reason)
        if self.cache is not None:
            self.cache.put(
                self.cache_key,
                {
                    "compiled": faster,
                    "exact": exact,
                    "eager_ms": eager,
                    "compiled_ms": compiled,
                    "warmup_ms": self.warmup_ms,
                    # What estimate_compile_s scales this machine's compiles by.
                    "param_tensors": sum(1 for _ in self.parameters()),
                },
            )

    def _choose(self, *, compiled: bool, reason: str) -> None:
        self.decided = True
        self.use_compiled = compiled
        name = "tolaria.compile_enabled" if compiled else "tolaria.compile_disabled"
        self._event(
            name,
            TelemetryLevel.INFO,
            f"{'compiled' if compiled else 'eager'} step chosen: {reason}",
            warmup_ms=self.warmup_ms,
        )
        log.info("step engine: %s step (%s)", "compiled" if compiled else "eager", reason)

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason[:500]
        self.decided = True
        self.use_compiled = False
        self.compiled_fn = None
        self._pending = None
        log.warning("step engine: compile failed, training eagerly from now on: %s", self.fallback_reason)
        self._event("tolaria.compile_fallback", TelemetryLevel.WARNING, self.fallback_reason)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The path decision and step count, so a restored run takes the same path per step."""
        return {
            "steps": self.steps,
            "decided": self.decided,
            "use_compiled": self.use_compiled,
            "pending": self._pending,
            "fallback_reason": self.fallback_reason,
            "compiled_epochs": self.compiled_epochs,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of ``state_dict`` (a compiled function already built in this process is kept)."""
        self.steps = int(state["steps"])
        self.decided = bool(state["decided"])
        self.use_compiled = bool(state["use_compiled"])
        pending = state["pending"]
        self._pending = None if pending is None else (bool(pending[0]), str(pending[1]))
        self.fallback_reason = state["fallback_reason"]
        self.compiled_epochs = int(state["compiled_epochs"])
        self._timings = {"eager": [], "compiled": []}
        self._mismatch = None

    # ------------------------------------------------------------------ telemetry

    def end_epoch(self) -> tuple[list[MetricPoint], list[TelemetryEvent]]:
        """This epoch's engine metrics and the events since the last call."""
        if self._compiled_epoch:
            self.compiled_epochs += 1
        graphs = self.graphs
        graph_on = graphs is not None and graphs.captured
        metrics = [
            MetricPoint(
                name="tolaria.train.compile_enabled", value=float(self.use_compiled and self.compiled_fn is not None)
            ),
            MetricPoint(name="tolaria.train.graph_enabled", value=float(graph_on)),
            MetricPoint(name="tolaria.compile_warmup_remaining", value=float(self.warmup_remaining)),
            MetricPoint(name="tolaria.compile.warmup_ms", value=self.warmup_ms, unit="ms"),
            MetricPoint(name="tolaria.compile.epochs_total", value=1.0 if self._compiled_epoch else 0.0),
            MetricPoint(name="tolaria.compile.traces", value=float(self.backend.drain())),
        ]
        if graphs is not None:
            metrics += [
                MetricPoint(name="tolaria.graph.capture_ms", value=graphs.capture_ms, unit="ms"),
                MetricPoint(name="tolaria.graph.replay_ms", value=graphs.drain_replay_ms(), unit="ms"),
                MetricPoint(name="tolaria.graph.stage_copy_ms", value=graphs.stage_copy_ms, unit="ms"),
                MetricPoint(name="tolaria.graph.replays_total", value=float(graphs.replays)),
                MetricPoint(name="tolaria.graph.captures_total", value=float(graphs.captures)),
            ]
            graphs.stage_copy_ms = 0.0
            graphs.replays = 0
            graphs.captures = 0
        events, self._events = self._events, []
        return metrics, events

    def describe(self) -> str:
        """Where the engine stands, for logs and reports."""
        if self.fallback_reason:
            return f"eager (compile fell back: {self.fallback_reason})"
        if not self.decided:
            return f"deciding ({self.warmup_remaining} steps left)"
        path = "compiled" if self.use_compiled else "eager"
        return path + (" + CUDA graph" if self.graphs is not None and self.graphs.captured else "")

    def _event(self, name: str, level: TelemetryLevel, message: str, **attributes: str | float | bool) -> None:
        self._events.append(TelemetryEvent(name=name, level=level, message=message, attributes=attributes))


def _first_mismatch(
    shadow_loss: torch.Tensor,
    loss: torch.Tensor,
    shadow_grads: list[torch.Tensor | None],
    grads: list[torch.Tensor | None],
) -> str | None:
    """Where the compiled (shadow) step's result differs from the eager step's, or None when
    the loss and every gradient are bitwise equal."""
    if not torch.equal(shadow_loss, loss):
        return f"step result {shadow_loss.tolist()} vs {loss.tolist()}"
    for i, (a, b) in enumerate(zip(shadow_grads, grads, strict=True)):
        if (a is None) != (b is None) or (a is not None and b is not None and not torch.equal(a, b)):
            diff = "missing" if a is None or b is None else f"max |diff| {float((a - b).abs().max()):.3g}"
            return f"gradient of parameter {i}: {diff}"
    return None


class TracingBackend:
    """The configured ``torch.compile`` backend, counting the graphs it is handed.

    Dynamo calls its backend once per graph it traces: at the first compile, and again whenever a
    guard fails, e.g. when growth changed a parameter's shape or the model's code path (a seed
    went in, a width merged). The count per epoch (``tolaria.compile.traces``) shows that a run
    re-traces at its growth events and not in between; Dynamo's own counters are global to the
    process, shared with every other compile in it. ``mode`` is applied here, as ``torch.compile``
    applies it to its inductor backend, because ``torch.compile`` ignores a mode for any other
    backend, this wrapper included.
    """

    def __init__(self, backend: str, *, mode: str | None, dynamic: bool | None) -> None:
        if mode is not None and backend != "inductor":
            raise ValueError(f"compile_mode {mode!r} needs compile_backend 'inductor', got {backend!r}")
        self.name = backend
        self.mode = mode
        self.dynamic = dynamic
        self.traces = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        """Compile ``gm`` with the configured backend (and mode), counting it."""
        self.traces += 1
        if self.mode is None:
            return torch._dynamo.lookup_backend(self.name)(gm, example_inputs)
        # Imported here: inductor's import is heavy, and only a compile with a mode needs it.
        from torch._inductor import list_mode_options
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs, config_patches=list_mode_options(self.mode, self.dynamic))

    def drain(self) -> int:
        """Graphs traced since the last drain."""
        traces, self.traces = self.traces, 0
        return traces


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu-{os.cpu_count()}"
