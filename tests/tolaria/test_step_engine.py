"""The step engine: measured compile decision, guarded fallback, cached decisions, CUDA guards."""

from __future__ import annotations

import dataclasses
import gc
import json
import time
from pathlib import Path

import pytest
import torch
from torch._dynamo import register_backend

from esper_core.karn.entries import default_catalog
from esper_core.run.build import build_trainer
from esper_core.run.recipes import get_recipe
from esper_core.tolaria import graphs as graphs_module
from esper_core.tolaria.loop import Trainer
from esper_core.tolaria.precision import Precision
from esper_core.tolaria.step import (
    COMPILE_PRIOR_BASE_S,
    COMPILE_PRIOR_PER_TENSOR_S,
    StepEngine,
    StepEngineConfig,
    estimate_compile_s,
)
from tests.helpers.runif import requires_cuda


@register_backend
def esper_test_broken_backend(gm, example_inputs):  # noqa: ANN001, ANN201 - dynamo's backend signature
    raise RuntimeError("deliberately broken compiler backend")


@register_backend
def esper_test_slow_backend(gm, example_inputs):  # noqa: ANN001, ANN201 - dynamo's backend signature
    """A compiler that would take a minute (a CPU compile of a large step can take minutes)."""
    time.sleep(60)
    return gm


@register_backend
def esper_test_inexact_backend(gm, example_inputs):  # noqa: ANN001, ANN201 - dynamo's backend signature
    """Runs the graph as traced but nudges every floating output: fast enough, numerically off."""

    def run(*args):  # noqa: ANN002, ANN202
        outs = gm(*args)
        return type(outs)(o * (1 + 1e-6) if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outs)

    return run


def _trainer(*, home: Path | None = None, recipe: str = "seed-reference", **step: object) -> Trainer:
    config = get_recipe(recipe)
    # compile_budget=None: these runs last milliseconds, and the tests are about measuring.
    fields = {
        "compile_backend": "aot_eager",
        "compile_warmup_steps": 1,
        "measure_steps": 3,
        "compile_budget": None,
        **step,
    }
    config.trainer = dataclasses.replace(config.trainer, step=dataclasses.replace(config.trainer.step, **fields))
    return build_trainer(config, catalog=default_catalog(), run_id="t", home=home)


def _names(trainer: Trainer, epochs: int) -> tuple[list[str], list[float]]:
    names, losses = [], []
    for _ in range(epochs):
        result = trainer.train_epoch()
        names += [e.name for e in result.events]
        losses.append(result.packet.train_loss)
    return names, losses


def test_off_never_compiles() -> None:
    trainer = _trainer(compile="off")
    names, _ = _names(trainer, 2)
    assert trainer.engine.compiled_fn is None and trainer.engine.decided
    assert not [n for n in names if n.startswith("tolaria.compile")]


def _decision_epoch(trainer: Trainer, epochs: int) -> int | None:
    for epoch in range(epochs):
        names = [e.name for e in trainer.train_epoch().events]
        if "tolaria.compile_enabled" in names or "tolaria.compile_disabled" in names:
            return epoch
    return None


def test_auto_measures_both_paths_decides_and_caches(tmp_path: Path) -> None:
    trainer = _trainer(home=tmp_path, compile="auto")
    # 4 steps an epoch: warm-up 1, 3 eager and 3 compiled (shadow) steps, then the next boundary.
    switched_at = _decision_epoch(trainer, 3)
    engine = trainer.engine
    assert switched_at == 2 and engine.decided and engine.warmup_remaining == 0
    assert len(engine._timings["eager"]) == 3 and len(engine._timings["compiled"]) == 3
    assert engine.warmup_ms > 0
    (decision,) = json.loads((tmp_path / "step_decisions.json").read_text()).values()
    assert decision["compiled"] == engine.use_compiled and decision["eager_ms"] > 0

    # A later run reuses the decision without measuring, and switches at the very same step,
    # so both runs take the same path step for step (same losses).
    again = _trainer(home=tmp_path, compile="auto")
    assert not again.engine.decided and again.engine.warmup_remaining == 7
    assert _decision_epoch(again, 3) == switched_at
    assert again.engine.use_compiled == engine.use_compiled
    assert not again.engine._timings["eager"] and not again.engine._timings["compiled"]


def test_auto_does_not_compile_a_run_too_short_to_repay_it(tmp_path: Path) -> None:
    # seed-reference: 6 epochs of 4 steps, a few milliseconds in all.
    trainer = _trainer(home=tmp_path, compile="auto", compile_budget=0.05)
    _, eager = _names(_trainer(compile="off"), 3)
    events, losses = [], []
    for _ in range(3):
        result = trainer.train_epoch()
        events += result.events
        losses.append(result.packet.train_loss)
    engine = trainer.engine
    assert engine.decided and not engine.use_compiled and engine.compiled_fn is None
    assert not engine._timings["compiled"] and losses == eager
    (chosen,) = [e for e in events if e.name.startswith("tolaria.compile")]
    assert chosen.name == "tolaria.compile_disabled" and "compile_budget=0.05" in chosen.message
    assert "(prior)" in chosen.message  # nothing compiled here yet
    # Not cached: the next run of the same workload may be long enough.
    assert not (tmp_path / "step_decisions.json").exists()
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"compile_budget must lie in \(0, 1\]"):
            StepEngineConfig(compile_budget=bad)


def test_the_compile_estimate_learns_this_machines_speed_from_earlier_compiles() -> None:
    prior, basis = estimate_compile_s(30, [])
    assert basis == "prior" and prior == COMPILE_PRIOR_BASE_S + 30 * COMPILE_PRIOR_PER_TENSOR_S
    # Two compiles here took twice the prior: the estimate doubles. Entries without a measured
    # compile (a cached eager choice, an old entry without a tensor count) say nothing.
    twice = [
        {"warmup_ms": 2e3 * (COMPILE_PRIOR_BASE_S + 2 * COMPILE_PRIOR_PER_TENSOR_S), "param_tensors": 2},
        {"warmup_ms": 2e3 * (COMPILE_PRIOR_BASE_S + 8 * COMPILE_PRIOR_PER_TENSOR_S), "param_tensors": 8},
        {"warmup_ms": 0.0, "param_tensors": 4},
        {"warmup_ms": 5e3},
    ]
    estimate, basis = estimate_compile_s(30, twice)
    assert estimate == pytest.approx(2 * prior) and basis == "2 earlier compile(s) here"


def test_a_long_enough_run_is_within_the_compile_budget(tmp_path: Path) -> None:
    # The same workload, 10 000 x the steps: the trial fits 5 % of the run, so it is measured.
    trainer = _trainer(home=tmp_path, compile="auto", compile_budget=0.05)
    trainer.engine.run_steps = 10**9
    for _ in range(3):
        trainer.train_epoch()
    assert trainer.engine._timings["compiled"], "the trial was skipped although it fits the budget"


def test_a_compile_trial_past_its_budget_is_stopped_and_the_run_trains_on_eagerly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Earlier compiles here were very fast (the estimate scales down to milliseconds), so the
    # trial is let through; the compiler then takes a minute, and the trial is stopped at
    # compile_budget of the run's eager time (pinned at 10 s: a limit of 0.5 s) instead.
    monkeypatch.setattr(StepEngine, "_eager_run_s", lambda self: 10.0)
    probe = _trainer(home=tmp_path, compile="auto", compile_budget=0.05)
    history = {"warmup_ms": 1.0, "param_tensors": 2, "compiled": False, "eager_ms": 0.1, "compiled_ms": 1.0}
    (tmp_path / "step_decisions.json").write_text(json.dumps({probe.engine._environment + "another": history}))
    _, eager = _names(_trainer(compile="off"), 4)
    trainer = _trainer(home=tmp_path, compile="auto", compile_budget=0.05, compile_backend="esper_test_slow_backend")
    start = time.monotonic()
    names, losses = [], []
    for _ in range(4):
        result = trainer.train_epoch()
        names += [f"{e.name}: {e.message}" for e in result.events]
        losses.append(result.packet.train_loss)
    assert time.monotonic() - start < 40, "the minute-long compile was waited out"
    (chosen,) = [n for n in names if n.startswith("tolaria.compile")]
    assert chosen.startswith(
        "tolaria.compile_disabled: eager step chosen: the compile trial ran past its limit of 0.5 s"
    ), chosen
    assert "compile_budget=0.05 of the run's ~10 s" in chosen
    assert losses == eager and not trainer.engine.use_compiled and trainer.engine.compiled_fn is None
    # Not the workload's decision (a longer run has a larger budget), but a compile at least that
    # long, which the next estimate learns from.
    cache = json.loads((tmp_path / "step_decisions.json").read_text())
    assert trainer.engine.cache_key not in cache
    assert cache[trainer.engine.cache_key + "|overran"]["warmup_ms"] == pytest.approx(500.0)
    # The interrupted compile left Dynamo usable in this process.
    doubled = torch.compile(lambda t: t * 2, backend="aot_eager")(torch.ones(3))
    assert doubled.tolist() == [2.0, 2.0, 2.0]


def test_the_compile_trial_leaves_no_trace_in_batchnorm_statistics_or_dropout_masks(tmp_path: Path) -> None:
    # Whether a trial runs depends on timings (the budget's estimate), so its shadow steps must
    # not change the run: a BatchNorm's running statistics and the random stream (dropout) are as
    # if it never ran, and the run equals the one that never compiles.
    recipe = "tests.helpers.user_models:cnn_with_dropout"
    # One after the other: the two runs draw from the process's one random stream, which each
    # build seeds.
    eager = _trainer(recipe=recipe, compile="off")
    expected = [(r.packet.train_loss, r.packet.val_loss) for r in (eager.train_epoch() for _ in range(3))]
    trial = _trainer(home=tmp_path, recipe=recipe, compile="auto", decision_margin=0.0)
    assert [(r.packet.train_loss, r.packet.val_loss) for r in (trial.train_epoch() for _ in range(3))] == expected
    assert trial.engine._timings["compiled"], "no trial ran"
    buffers = dict(eager.model.named_buffers())
    assert all(torch.equal(buffers[name], b) for name, b in trial.model.named_buffers())


def test_auto_never_chooses_a_compiled_step_that_changes_the_numbers(tmp_path: Path) -> None:
    # Whatever the timings say (on a loaded machine they flip), an inexact compiled step is
    # never kept: the run's losses are the eager run's, bit for bit.
    _, eager = _names(_trainer(compile="off"), 3)
    trainer = _trainer(home=tmp_path, compile="auto", compile_backend="esper_test_inexact_backend", decision_margin=0.0)
    names, losses = _names(trainer, 3)
    assert "tolaria.compile_disabled" in names and not trainer.engine.use_compiled
    assert losses == eager
    (decision,) = json.loads((tmp_path / "step_decisions.json").read_text()).values()
    assert decision["exact"] is False and decision["compiled"] is False


def test_a_cached_compiled_choice_without_an_exactness_check_is_measured_again(tmp_path: Path) -> None:
    trainer = _trainer(home=tmp_path, compile="auto", compile_backend="esper_test_inexact_backend")
    cache = tmp_path / "step_decisions.json"
    # What an earlier version left after a noisy measurement: "compiled is faster", unchecked.
    cache.write_text(
        json.dumps(
            {trainer.engine.cache_key: {"compiled": True, "eager_ms": 9.0, "compiled_ms": 1.0, "warmup_ms": 1.0}}
        )
    )
    again = _trainer(home=tmp_path, compile="auto", compile_backend="esper_test_inexact_backend")
    _names(again, 3)
    assert not again.engine.use_compiled and len(again.engine._timings["compiled"]) == 3
    assert json.loads(cache.read_text())[again.engine.cache_key]["exact"] is False


def test_compiled_step_matches_eager_numerics() -> None:
    _, eager = _names(_trainer(compile="off"), 3)
    compiled_trainer = _trainer(compile="on")
    _, compiled = _names(compiled_trainer, 3)
    assert compiled_trainer.engine.use_compiled
    assert compiled == pytest.approx(eager, rel=1e-5)


def test_compiled_step_leaves_the_growth_signals_eager() -> None:
    """Train accuracy and the slot bottleneck probe run eagerly after the compiled steps (no
    hook or count enters the compiled graph), so both match the eager run."""
    eager = _trainer(compile="off")
    compiled = _trainer(compile="on")
    for _ in range(3):
        a, b = eager.train_epoch().packet, compiled.train_epoch().packet
        assert b.train_accuracy is not None and b.train_accuracy == pytest.approx(a.train_accuracy, abs=0.02)
        assert [s.activation_grad_norm for s in b.seeds] == pytest.approx([s.activation_grad_norm for s in a.seeds])
    assert compiled.engine.use_compiled and compiled.engine.compiled_epochs >= 1
    assert all(not slot._forward_hooks for slot in compiled.manager.slots.values())


def test_compiler_failure_falls_back_to_eager_once(caplog: pytest.LogCaptureFixture) -> None:
    _, eager = _names(_trainer(compile="off"), 2)
    trainer = _trainer(compile="on", compile_backend="esper_test_broken_backend")
    with caplog.at_level("WARNING", logger="esper_core.tolaria.step"):
        names, losses = _names(trainer, 2)
    assert names.count("tolaria.compile_fallback") == 1
    assert "deliberately broken" in (trainer.engine.fallback_reason or "")
    assert sum("compile failed" in r.message for r in caplog.records) == 1
    assert losses == pytest.approx(eager, rel=1e-6)  # the fallback step is the eager step
    result = trainer.train_epoch()
    assert result.metrics and next(m for m in result.metrics if m.name == "tolaria.train.compile_enabled").value == 0.0


def test_cuda_graphs_requested_on_cpu_are_reported_and_skipped() -> None:
    if torch.cuda.is_available():
        pytest.skip("this checks the guard on a machine without CUDA")
    trainer = _trainer(compile="off", enable_graphs=True)
    result = trainer.train_epoch()
    fallback = [e for e in result.events if e.name == "tolaria.graph_fallback"]
    assert fallback and fallback[0].attributes["reason"] == "no_cuda"
    assert next(m for m in result.metrics if m.name == "tolaria.train.graph_enabled").value == 0.0
    assert trainer.engine.graphs is None


def test_precision_resolves_fp32_on_cpu_and_refuses_half_without_cuda() -> None:
    cpu = Precision(torch.device("cpu"), "auto")
    assert not cpu.enabled and cpu.scaler is None and "fp32" in cpu.describe()
    with pytest.raises(ValueError, match="needs a CUDA device"):
        Precision(torch.device("cpu"), "bf16")
    with pytest.raises(ValueError, match="amp must be one of"):
        Precision(torch.device("cpu"), "fp8")


def test_engine_config_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="compile must be one of"):
        StepEngineConfig(compile="maybe")
    with pytest.raises(ValueError, match="measure_steps must be >= 3"):
        StepEngineConfig(measure_steps=1)


@requires_cuda("CUDA graph capture and replay of the training step")
def test_cuda_graph_replay_matches_eager() -> None:
    eager = _trainer(recipe="digits-mlp", compile="off")
    eager_packets = [eager.train_epoch().packet for _ in range(2)]
    eager_losses = [p.train_loss for p in eager_packets]
    graphed = _trainer(recipe="digits-mlp", compile="off", enable_graphs=True)
    result = graphed.train_epoch()
    assert any(e.name == "tolaria.graph_enabled" for e in result.events)
    assert any(e.name == "tolaria.graph_fallback" and e.attributes["reason"] == "shape_change" for e in result.events)
    second = graphed.train_epoch()
    assert next(m for m in second.metrics if m.name == "tolaria.graph.replays_total").value > 0
    assert [result.packet.train_loss, second.packet.train_loss] == pytest.approx(eager_losses, rel=1e-4)
    # Train accuracy is measured after the epoch, outside the graph (a near-tie's argmax may flip
    # with the graph's float order: allow two samples).
    assert second.packet.train_accuracy == pytest.approx(eager_packets[1].train_accuracy, abs=2 / 512)


@requires_cuda("a CUDA graph capture that fails, and the device's random numbers after it")
def test_a_failed_capture_trains_eagerly_and_leaves_the_cuda_generator_usable() -> None:
    model = torch.nn.Linear(4, 2, device="cuda")

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        # A host sync: fine on the warm-up's side stream, refused while the stream captures.
        return loss.detach() * (1.0 if loss.item() >= 0 else 0.0)

    engine = StepEngine(
        step,
        zero_grad=lambda: model.zero_grad(set_to_none=True),
        parameters=model.parameters,
        config=StepEngineConfig(compile="off", enable_graphs=True),
        device=torch.device("cuda"),
        workload="sync-inside-the-step",
    )
    x, y = torch.randn(8, 4, device="cuda"), torch.randn(8, 2, device="cuda")
    loss = engine.run(x, y)
    _, events = engine.end_epoch()
    assert engine.graphs is None and engine.describe() == "eager"
    assert [e.attributes["reason"] for e in events if e.name == "tolaria.graph_fallback"] == ["capture_failed"]
    assert torch.isfinite(loss) and model.weight.grad is not None
    # Before the generator was restored, both raised "Offset increment outside graph capture
    # encountered unexpectedly" (a width seed's initialisation, an Inductor-compiled dropout).
    torch.nn.init.kaiming_uniform_(torch.empty(4, 4, device="cuda"))
    assert torch.nn.functional.dropout(torch.ones(64, device="cuda"), 0.5).sum() > 0
    assert engine.run(x, y).isfinite()


@requires_cuda("captures into the process's shared graph pool after a failed one and after its graphs were dropped")
def test_the_shared_pool_takes_new_captures_after_a_failure_and_after_every_earlier_graph_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A pool of this test's own: the failed capture below is then its first, whatever ran before.
    monkeypatch.setattr(graphs_module, "_SHARED_POOL", None)
    monkeypatch.setattr(graphs_module, "_POOL_KEEPER", None)

    def engine(*, sync: bool) -> tuple[StepEngine, torch.nn.Linear]:
        model = torch.nn.Linear(4, 2, device="cuda")

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            if sync:
                float(loss)  # a host sync: refused while the stream captures
            return loss.detach()

        config = StepEngineConfig(compile="off", enable_graphs=True, enable_graph_pool_reuse=True)
        built = StepEngine(
            step,
            zero_grad=lambda: model.zero_grad(set_to_none=True),
            parameters=model.parameters,
            config=config,
            device=torch.device("cuda"),
            workload="shared-pool",
        )
        return built, model

    def captured(built: StepEngine) -> bool:
        _, events = built.end_epoch()
        assert built.graphs is not None and built.graphs.captured, [e.message for e in events]
        return True

    x, y = torch.randn(8, 4, device="cuda"), torch.randn(8, 2, device="cuda")
    failed, _ = engine(sync=True)
    failed.run(x, y)
    assert failed.graphs is None  # its capture failed: the pool's only capture so far
    del failed
    gc.collect()
    first, _ = engine(sync=False)
    first.run(x, y)
    assert captured(first)
    # A growth event: the structure changes, the graph is dropped and the step captured again.
    first.start_epoch(("grown",))
    first.run(x, y)
    assert captured(first)
    del first
    gc.collect()
    # A second trainer in the same process (the training bench's next path or recipe).
    second, model = engine(sync=False)
    second.run(x, y)
    assert captured(second)
    assert model.weight.grad is not None and torch.isfinite(second.run(x, y))


@requires_cuda("bf16/fp16 autocast and GradScaler")
def test_amp_is_enabled_on_cuda() -> None:
    precision = Precision(torch.device("cuda"), "auto")
    assert precision.enabled
    assert (precision.scaler is None) == (precision.dtype is torch.bfloat16)
