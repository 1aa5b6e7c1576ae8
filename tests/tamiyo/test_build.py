"""prepare_policy / PreparedPolicy: eager path, background compile, fallback, CUDA guards on CPU."""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._inductor.config as inductor_config
from torch._dynamo import register_backend
from torch._inductor import cpu_vec_isa

from esper_core.tamiyo import yielding
from esper_core.tamiyo.build import (
    PreparedPolicy,
    autocast_dtype,
    host_to_device,
    prepare_policy,
    use_compiler_cache,
)
from esper_core.tamiyo.config import PolicyCompileConfig, TamiyoConfig
from esper_core.tamiyo.graph import build_graph
from esper_core.tamiyo.model import TamiyoGNN, TamiyoGNNConfig
from esper_core.tamiyo.precompile import (
    artifact_path,
    process_state,
    recorded_vec_isa,
    vec_isa_record,
)
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history
from esper_core.tamiyo.yielding import LOADING_SWITCH_INTERVAL_S, deciding, loading

CPU = torch.device("cpu")
SMALL = TamiyoGNNConfig(hidden_dim=8, num_layers=1)


def _model() -> TamiyoGNN:
    torch.manual_seed(0)
    return TamiyoGNN(SMALL).eval()


def _inputs(num_slots: int = 2) -> tuple[dict, dict]:
    return build_graph(synthetic_history(num_slots=num_slots), synthetic_candidates(3)).inputs(CPU)


class _Compiled:
    """A stand-in for a compiled policy: ``call`` serves the inputs ``accepts`` lets through."""

    def __init__(self, call: Callable[..., Any], accepts: Callable[[dict], bool] = lambda x_dict: True) -> None:
        self.call, self.accepts = call, accepts

    def guard_check(self, model: TamiyoGNN, x_dict: dict, edge_index_dict: dict) -> bool:
        return self.accepts(x_dict)

    def __call__(self, model: TamiyoGNN, x_dict: dict, edge_index_dict: dict) -> Any:
        return self.call(x_dict, edge_index_dict)


def _fake_compile(monkeypatch: pytest.MonkeyPatch, fn: Callable[[TamiyoGNN], _Compiled]) -> None:
    """Make this process's compiles return ``fn(model)`` (the real compiler runs in the slow
    tests and in warm-up child processes, which do not see the fake). No compiler cache: a fake
    is not stored."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr("esper_core.tamiyo.build.compile_policy", lambda model, inputs, **_: fn(model))


def test_eager_policy_serves_the_model_and_reports_compile_off() -> None:
    model = _model()
    policy = prepare_policy(model, TamiyoConfig(policy="heuristic", gnn=SMALL))
    x, e = _inputs()
    out = policy(x, e)
    with torch.inference_mode():
        expected = model(x, e)
    assert torch.equal(out.action_logits, expected.action_logits)
    assert not policy.compile_enabled and not policy.last_call_compiled and policy.fallback_total == 0
    assert out.action_logits.is_inference()  # served under torch.inference_mode()


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The process on two intra-op threads for the test, its own count restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def _policy_seeing_threads() -> tuple[PreparedPolicy, list[int]]:
    """An eager CPU policy, and torch's thread count at each forward of its model."""
    model = _model()
    seen: list[int] = []
    model.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    return PreparedPolicy(model, device=CPU, compile_config=None, dtype=None), seen


@pytest.mark.usefixtures("two_threads")
def test_an_eager_cpu_decision_runs_on_one_thread_and_gives_the_process_its_threads_back() -> None:
    policy, seen = _policy_seeing_threads()
    policy(*_inputs())
    assert seen == [1] and torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_while_a_compile_holds_the_lock_an_eager_decision_leaves_the_thread_count_alone() -> None:
    # Inductor reads the process's thread count while it compiles: a decision made meanwhile
    # must not change it under the compiler's feet (nor wait for the compile).
    policy, seen = _policy_seeing_threads()
    with policy._lock:
        policy(*_inputs())
    assert seen == [2] and torch.get_num_threads() == 2


def test_compile_failure_falls_back_once_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(model: TamiyoGNN) -> _Compiled:
        def call(*args: Any) -> Any:
            raise RuntimeError("inductor exploded")

        return _Compiled(call)

    _fake_compile(monkeypatch, broken)
    config = PolicyCompileConfig(background=False)
    with caplog.at_level(logging.WARNING, logger="esper_core.tamiyo.build"):
        policy = PreparedPolicy(_model(), device=CPU, compile_config=config, dtype=None)
        policy.warm(*_inputs())
        policy.warm(*_inputs(num_slots=3))  # nothing left to compile: no second warning
        out = policy(*_inputs())
    assert policy.fallback_total == 1 and not policy.compile_enabled
    assert "inductor exploded" in (policy.fallback_reason or "")
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert torch.isfinite(out.action_logits).all() and policy.eager_calls == 1


def test_a_decision_is_never_blocked_by_the_background_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # cold: the child runs
    release, loading_now = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow_load(path: Path, *, model: TamiyoGNN) -> _Compiled:
        assert path.is_file()  # what the child stored
        loading_now.set()
        release.wait(10)  # the "load"
        return _Compiled(lambda *args: calls.append("compiled") or model(*args))

    monkeypatch.setattr("esper_core.tamiyo.build.load_policy", slow_load)
    # The child process compiles for real (it does not see the fake), with a backend that is quick.
    config = PolicyCompileConfig(backend="eager", mode=None)
    policy = PreparedPolicy(_model(), device=CPU, compile_config=config, dtype=None)
    assert policy.warm(*_inputs())
    assert loading_now.wait(300)
    assert policy.stage == "loading" and policy.cache_warm_s > 0
    policy(*_inputs())  # served while loading: eager, immediately
    assert not policy.last_call_compiled and not policy.compile_enabled
    release.set()
    assert policy.wait_until_idle(10)
    policy(*_inputs())
    assert policy.compile_enabled and policy.last_call_compiled and calls == ["compiled", "compiled"]
    assert policy.stage == "idle" and policy.ready_after_s is not None and policy.ready_after_s >= policy.cache_warm_s
    policy.close(timeout=10)


def _count_children(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Record each warm-up child started from now on (each still runs)."""
    from esper_core.tamiyo import build

    children: list[object] = []
    real = build.warm_in_subprocess

    def counted(*args: Any, **kwargs: Any) -> None:
        children.append(args)
        real(*args, **kwargs)

    monkeypatch.setattr(build, "warm_in_subprocess", counted)
    return children


@pytest.mark.slow
def test_a_stored_compiled_policy_is_loaded_without_a_warmup_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    config = PolicyCompileConfig(backend="eager", mode=None)
    first = PreparedPolicy(_model(), device=CPU, compile_config=config, dtype=None)
    inputs = _inputs()
    stored = artifact_path(first.model, inputs, config=config, device=CPU, dtype=None, process=process_state())
    assert stored is not None and not stored.exists()
    assert first.warm(*inputs) and first.wait_until_idle(300)
    assert first.compile_enabled and stored.is_file()
    other = artifact_path(
        first.model, _inputs(num_slots=3), config=config, device=CPU, dtype=None, process=process_state()
    )
    assert other != stored  # another shape signature is another compile
    children = _count_children(monkeypatch)
    again = PreparedPolicy(_model(), device=CPU, compile_config=config, dtype=None)
    assert again.warm(*inputs) and again.wait_until_idle(300)
    assert again.compile_enabled and children == []  # loaded here, no child process
    again(*inputs)
    assert again.last_call_compiled
    first.close(timeout=10)
    again.close(timeout=10)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert artifact_path(first.model, inputs, config=config, device=CPU, dtype=None, process=process_state()) is None


def test_a_stored_policy_that_does_not_load_is_compiled_again_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    config = PolicyCompileConfig(backend="eager", mode=None)
    policy = PreparedPolicy(_model(), device=CPU, compile_config=config, dtype=None)
    inputs = _inputs()
    stored = artifact_path(policy.model, inputs, config=config, device=CPU, dtype=None, process=process_state())
    assert stored is not None
    stored.parent.mkdir(parents=True)
    stored.write_bytes(b"written by another PyTorch, or cut short")
    children = _count_children(monkeypatch)
    with caplog.at_level(logging.INFO, logger="esper_core.tamiyo.build"):
        assert policy.warm(*inputs) and policy.wait_until_idle(300)
    assert len(children) == 1 and policy.fallback_total == 0 and policy.compile_enabled
    assert any("did not load" in r.message for r in caplog.records)
    policy(*inputs)
    assert policy.last_call_compiled
    policy.close(timeout=10)


def test_loading_yields_the_interpreter_often_pauses_the_collector_and_restores_both() -> None:
    before = sys.getswitchinterval()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with loading():
        assert sys.getswitchinterval() == pytest.approx(LOADING_SWITCH_INTERVAL_S)
        assert not gc.isenabled()  # no full collection walks the process during the load
        loaded = [[] for _ in range(1000)]  # the load's objects
        with loading():  # a second policy loading at the same time
            pass
        assert sys.getswitchinterval() == pytest.approx(LOADING_SWITCH_INTERVAL_S) and not gc.isenabled()
    assert sys.getswitchinterval() == before and gc.isenabled() and gc.get_freeze_count() == 0
    assert gc.get_count()[0] < len(loaded)  # aged into the oldest generation, not left young


_UNTRACED = pytest.mark.skipif(
    sys.gettrace() is not None or threading.gettrace() is not None,
    reason="a tracer (coverage, a debugger) is installed: a loading thread keeps it and does not pause",
)


@_UNTRACED
def test_a_load_pauses_while_a_decision_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Long enough that the load cannot go on by the bound instead.
    monkeypatch.setattr(yielding, "PAUSE_MAX_S", 60.0)
    go, progressed = threading.Event(), threading.Event()

    def load() -> None:
        with loading():
            go.wait()
            progressed.set()  # a Python call: the load pauses before it while a decision runs

    loader = threading.Thread(target=load)
    loader.start()
    try:
        with deciding():
            go.set()
            assert not progressed.wait(0.5)
            assert _Compiled(lambda: 1).call() == 1  # the deciding thread's own calls never pause
        assert progressed.wait(30)
    finally:
        go.set()
        loader.join(30)
    assert sys.gettrace() is None


def test_a_thread_that_decides_while_it_loads_does_not_wait_for_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float | None] = []
    monkeypatch.setattr(yielding._no_decision, "wait", lambda timeout=None: waits.append(timeout) or True)
    with loading(), deciding():
        assert _Compiled(lambda: 1).call() == 1
    assert waits == []


@_UNTRACED
def test_a_loading_thread_keeps_a_trace_function_it_already_has() -> None:
    def tracer(frame: Any, event: str, arg: object) -> None:  # noqa: ANN401 - sys.settrace's signature
        return None

    with loading():
        assert sys.gettrace() is yielding._pause_for_decisions
        with loading():  # nested: the outer block restores
            pass
        assert sys.gettrace() is yielding._pause_for_decisions
    assert sys.gettrace() is None
    sys.settrace(tracer)
    try:
        with loading():
            assert sys.gettrace() is tracer
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)


def _tracked(obj: object) -> bool:
    """Whether the collector walks ``obj`` (frozen objects are in none of its generations)."""
    return any(o is obj for o in gc.get_objects())


def test_loading_keeps_a_freeze_the_process_made_and_a_collector_it_turned_off() -> None:
    # Marked objects, not the freeze count: other threads free frozen objects meanwhile (on a busy
    # machine the count fell by 45 during the block), which says nothing about this code.
    frozen_before = [object()]
    gc.freeze()
    gc.disable()
    young = [object()]
    try:
        with loading():
            pass
        assert not _tracked(frozen_before), "the process's freeze was undone"
        assert _tracked(young), "the load froze objects the process had not frozen"
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_recorded_isa_probe_skips_the_probe_only_when_it_vouches_for_this_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    cpu_vec_isa.valid_vec_isa_list.cache_clear()  # as in a process that has not compiled yet
    with inductor_config.patch({"cpp.vec_isa_ok": None}):  # Inductor's default: probe
        with recorded_vec_isa():
            assert inductor_config.cpp.vec_isa_ok is None  # nothing recorded: Inductor probes
        with inductor_config.patch({"cpp.vec_isa_ok": True}):
            listed = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list.__wrapped__()]
        record = vec_isa_record()
        assert record is not None
        record.parent.mkdir(parents=True)
        record.write_text(json.dumps(listed))  # the child's probe passed every ISA this CPU lists
        with recorded_vec_isa():
            assert inductor_config.cpp.vec_isa_ok is True
        record.write_text(json.dumps([*listed[1:], "an ISA this CPU lacks"]))  # another CPU's, or one failed
        with recorded_vec_isa():
            assert inductor_config.cpp.vec_isa_ok is None
        assert inductor_config.cpp.vec_isa_ok is None
    assert cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 0  # checking fixed no answer


@register_backend
def esper_test_in_process_only_backend(gm, example_inputs):  # noqa: ANN001, ANN201 - dynamo's signature
    return gm.forward


def test_a_failing_warmup_process_falls_back_to_eager_once(caplog: pytest.LogCaptureFixture) -> None:
    # Registered in this process only: the child process cannot compile with it and exits 1.
    config = PolicyCompileConfig(backend="esper_test_in_process_only_backend", mode=None)
    policy = PreparedPolicy(_model(), device=CPU, compile_config=config, dtype=None)
    with caplog.at_level("WARNING", logger="esper_core.tamiyo.build"):
        assert policy.warm(*_inputs())
        assert policy.wait_until_idle(300)
    assert policy.fallback_total == 1 and not policy.compile_enabled
    assert "warm-up process failed" in (policy.fallback_reason or "")
    assert sum("compile disabled" in r.message for r in caplog.records) == 1
    policy(*_inputs())
    assert not policy.last_call_compiled and policy.eager_calls == 1
    policy.close(timeout=10)


def test_a_shape_that_needs_a_recompile_is_served_eagerly_and_compiled_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[int] = []
    compiles = iter([2, 3])  # the slot counts the fake compiles are for, in turn

    def guarded(model: TamiyoGNN) -> _Compiled:
        compiled_for = next(compiles)

        def call(x_dict: dict, edge_index_dict: dict) -> Any:
            seen.append(x_dict["slot"].shape[0])
            return model(x_dict, edge_index_dict)

        return _Compiled(call, accepts=lambda x_dict: x_dict["slot"].shape[0] == compiled_for)

    _fake_compile(monkeypatch, guarded)
    policy = PreparedPolicy(_model(), device=CPU, compile_config=PolicyCompileConfig(background=False), dtype=None)
    policy.warm(*_inputs(num_slots=2))
    policy(*_inputs(num_slots=2))
    assert policy.last_call_compiled
    policy(*_inputs(num_slots=3))  # new shape: eager now, compiled by the (here synchronous) job
    assert not policy.last_call_compiled and policy.fallback_total == 0
    policy(*_inputs(num_slots=3))
    assert policy.last_call_compiled and seen == [2, 2, 3, 3]  # each compile's first call, then served


def test_an_in_process_compile_is_stored_and_the_next_one_loads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    config = PolicyCompileConfig(backend="eager", mode=None, background=False)
    first = PreparedPolicy(_model(), device=CPU, compile_config=config, dtype=None)
    assert first.warm(*_inputs())
    stored = artifact_path(first.model, _inputs(), config=config, device=CPU, dtype=None, process=process_state())
    assert stored is not None and stored.is_file()
    compiles: list[object] = []
    monkeypatch.setattr("esper_core.tamiyo.build.compile_policy", lambda *a, **k: compiles.append(a))
    again = PreparedPolicy(_model(), device=CPU, compile_config=config, dtype=None)
    assert again.warm(*_inputs())
    again(*_inputs())
    assert again.last_call_compiled and compiles == [], again.fallback_reason


def test_max_shapes_caps_the_shapes_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_compile(monkeypatch, lambda model: _Compiled(model))
    policy = PreparedPolicy(
        _model(), device=CPU, compile_config=PolicyCompileConfig(background=False, max_shapes=1), dtype=None
    )
    assert policy.warm(*_inputs(num_slots=2))
    assert not policy.warm(*_inputs(num_slots=2))  # seen
    assert not policy.warm(*_inputs(num_slots=3))  # over the cap


def test_swapping_weights_in_place_changes_the_served_outputs() -> None:
    policy = prepare_policy(_model(), TamiyoConfig(gnn=SMALL))
    before = policy(*_inputs()).action_logits.clone()
    torch.manual_seed(1)
    policy.load_state_dict(TamiyoGNN(SMALL).state_dict())
    assert not torch.equal(before, policy(*_inputs()).action_logits)


# ------------------------------------------------------------------ CUDA-only paths, guarded


def test_autocast_is_off_on_cpu_and_bf16_or_fp16_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    assert autocast_dtype(CPU) is None
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert autocast_dtype(torch.device("cuda")) is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert autocast_dtype(torch.device("cuda")) is torch.float16


def test_inputs_are_neither_pinned_nor_copied_on_cpu() -> None:
    x = torch.ones(3, 4)
    assert host_to_device(x, CPU) is x and not x.is_pinned()
    graph = build_graph(synthetic_history(), synthetic_candidates())
    policy = PreparedPolicy(_model(), device=CPU, compile_config=None, dtype=None)
    x_dict, _ = policy.inputs(graph)
    assert x_dict["global"] is graph.data["global"].x


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: pinned non_blocking copies")
def test_inputs_are_pinned_copies_on_cuda() -> None:
    x = torch.ones(3, 4)
    y = host_to_device(x, torch.device("cuda"))
    assert y.device.type == "cuda" and torch.equal(y.cpu(), x)


def test_compiler_cache_dir_is_set_for_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "before" / "triton"))
    cache = use_compiler_cache(tmp_path / "cache" / "inductor")
    assert cache.is_dir() and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache)
    assert os.environ["TRITON_CACHE_DIR"] == str(cache / "triton")


def test_compile_is_only_configured_when_the_gnn_decides() -> None:
    assert TamiyoConfig(policy="gnn").compiles
    assert not TamiyoConfig(policy="heuristic").compiles
    assert not TamiyoConfig(policy="gnn", compile=PolicyCompileConfig(enabled=False)).compiles


def test_compile_config_rejects_unknown_modes() -> None:
    with pytest.raises(ValueError, match="compile mode"):
        PolicyCompileConfig(mode="turbo")


# ------------------------------------------------------------------ the real compiler


@pytest.mark.slow
# Two real compiles in a child process: ~90 s alone on 2 cores, three times that beside other
# test workers, so the suite's 300 s default would cut it off mid-compile.
@pytest.mark.timeout(900)
def test_real_compile_matches_eager_without_graph_breaks_and_never_blocks(tmp_path: Path) -> None:
    """One small real compile: eager while compiling, then compiled == eager, no graph breaks."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    use_compiler_cache(tmp_path / "inductor")
    policy = PreparedPolicy(_model(), device=CPU, compile_config=PolicyCompileConfig(), dtype=None)
    x, e = _inputs()
    policy.warm(x, e)
    eager = policy(x, e)  # the compile has only just started: eager serves
    assert not policy.last_call_compiled
    assert policy.wait_until_idle(600), "the background compile did not finish"
    assert policy.cache_warm_s > 0 and policy.load_s > 0  # cold in the child, hot here
    compiled = policy(x, e)
    assert policy.compile_enabled and policy.last_call_compiled, policy.fallback_reason
    for a, b in zip(eager, compiled, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    # A graph with one slot specialises a dimension (0/1): served eagerly, compiled in the background.
    policy(*_inputs(num_slots=1))
    assert not policy.last_call_compiled and policy.fallback_total == 0 and policy.compile_enabled
    assert policy.wait_until_idle(600)
    policy(*_inputs(num_slots=1))
    assert policy.last_call_compiled
    policy.close(timeout=60)


def test_the_warmup_child_takes_the_serving_process_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Dynamo's guards check process-wide settings at every call: a child compiling under others
    # would store a policy that never serves here.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium" if precision != "medium" else "high")
    try:
        policy = PreparedPolicy(
            _model(), device=CPU, compile_config=PolicyCompileConfig(backend="eager", mode=None), dtype=None
        )
        assert policy.warm(*_inputs()) and policy.wait_until_idle(300)
        policy(*_inputs())
        assert policy.last_call_compiled, policy.fallback_reason
        policy.close(timeout=10)
    finally:
        torch.set_float32_matmul_precision(precision)


@pytest.mark.usefixtures("two_threads")
def test_the_child_gets_the_calling_threads_settings_not_the_background_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A thread started after another set one intra-op thread (as an eager decision does) takes
    # that count; the serving thread keeps two, and its calls are what the guards will check.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    setter = threading.Thread(target=torch.set_num_threads, args=(1,))
    setter.start()
    setter.join()
    seen: list[int] = []
    monkeypatch.setattr(
        "esper_core.tamiyo.build.warm_in_subprocess", lambda *a, process, **k: seen.append(process["threads"])
    )
    policy = PreparedPolicy(_model(), device=CPU, compile_config=PolicyCompileConfig(backend="eager"), dtype=None)
    assert torch.get_num_threads() == 2
    assert policy.warm(*_inputs()) and policy.wait_until_idle(60)
    assert seen == [2]
    policy.close(timeout=10)


def test_a_compiled_policy_that_rejects_its_own_inputs_falls_back_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # What a stored policy compiled under other process settings looks like here: it loads and
    # runs, but no decision would ever pass its guards. Said once, rather than eager in silence.
    _fake_compile(monkeypatch, lambda model: _Compiled(model, accepts=lambda x_dict: False))
    policy = PreparedPolicy(_model(), device=CPU, compile_config=PolicyCompileConfig(background=False), dtype=None)
    with caplog.at_level(logging.WARNING, logger="esper_core.tamiyo.build"):
        assert policy.warm(*_inputs())
    assert not policy.compile_enabled and policy.fallback_total == 1
    assert "guards reject the inputs it was compiled for" in (policy.fallback_reason or "")
    assert len(caplog.records) == 1


def test_a_warmup_child_that_cannot_match_the_serving_state_says_so(tmp_path: Path) -> None:
    from esper_core.tamiyo.build import guard_state_under, warm_in_subprocess

    # A serving thread with a setting the child cannot copy: its policy would never pass its guards.
    unmatched = guard_state_under(CPU, None).replace('"num_threads":', '"num_threads":99999, "was":')
    with pytest.raises(RuntimeError, match="global state differs from the serving process"):
        warm_in_subprocess(
            _model(),
            _inputs(),
            out=tmp_path / "p.bin",
            process=process_state(),
            guard_state=unmatched,
            config=PolicyCompileConfig(backend="eager", mode=None),
            device=CPU,
            dtype=None,
            timeout_s=300,
        )
    assert not (tmp_path / "p.bin").exists()
