"""prepare_policy / PreparedPolicy and its policy server: eager serving, the compile in a child
process, fallback, the stored policy, CUDA guards on CPU.

The server is a real child process throughout. Tests that need a compile use the ``eager``
backend (Dynamo traces, no code generation: seconds); the slow ones use Inductor.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._inductor.config as inductor_config
from torch._dynamo import register_backend
from torch._inductor import cpu_vec_isa

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
from esper_core.tamiyo.precompile import artifact_path, recorded_vec_isa, vec_isa_record
from esper_core.tamiyo.server import pack, unpack
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history
from tests.helpers.waiting import wait_for

CPU = torch.device("cpu")
SMALL = TamiyoGNNConfig(hidden_dim=8, num_layers=1)
QUICK = PolicyCompileConfig(backend="eager", mode=None)
"""A real compile without code generation: Dynamo traces and guards, the ``eager`` backend runs."""


def _model() -> TamiyoGNN:
    torch.manual_seed(0)
    return TamiyoGNN(SMALL).eval()


def _inputs(num_slots: int = 2) -> tuple[dict, dict]:
    return build_graph(synthetic_history(num_slots=num_slots), synthetic_candidates(3)).inputs(CPU)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty compiler cache for this test (the server inherits it)."""
    path = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(path))
    return path


@pytest.fixture
def policies() -> Iterator[list[PreparedPolicy]]:
    """Policies the test makes; their servers are stopped after it, pass or fail."""
    made: list[PreparedPolicy] = []
    yield made
    for policy in made:
        policy.close(timeout=10)


def _policy(policies: list[PreparedPolicy], config: PolicyCompileConfig | None = QUICK) -> PreparedPolicy:
    policy = PreparedPolicy(_model(), device=CPU, compile_config=config, dtype=None)
    policies.append(policy)
    return policy


def _server_pid(policy: PreparedPolicy) -> int:
    assert policy._server is not None, "no policy server is running"
    return policy._server.process.pid


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie not yet reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _same_outputs(a: tuple, b: tuple) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


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
def test_tensors_cross_the_pipe_unchanged() -> None:
    for t in (torch.randn(3, 4), torch.arange(6).view(2, 3), torch.ones(2, dtype=torch.bool), torch.empty(2, 0)):
        back = unpack(pack(t))
        assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)


def test_a_compiled_decision_comes_from_the_server_and_equals_eager(
    cache: Path, policies: list[PreparedPolicy]
) -> None:
    policy = _policy(policies)
    inputs = _inputs()
    eager = policy(*inputs)
    assert policy.warm(*inputs) and policy.wait_until_idle(300), policy.fallback_reason
    assert policy.compile_enabled and policy.ready_after_s is not None and policy.compile_s > 0
    compiled = policy(*inputs)
    assert policy.last_call_compiled and policy.compiled_calls == 1 and policy.eager_calls == 1
    _same_outputs(eager, compiled)


def test_a_decision_never_waits_for_the_server(cache: Path, policies: list[PreparedPolicy]) -> None:
    policy = _policy(policies)
    assert policy.warm(*_inputs())
    pid = _server_pid(policy)
    os.kill(pid, signal.SIGSTOP)  # a server that takes as long as it likes to compile
    try:
        for _ in range(3):
            policy(*_inputs())
            assert not policy.last_call_compiled and policy.compiling
    finally:
        os.kill(pid, signal.SIGCONT)
    assert policy.wait_until_idle(300), policy.fallback_reason
    policy(*_inputs())
    assert policy.last_call_compiled and policy.eager_calls == 3


def test_serving_changes_no_interpreter_wide_state(cache: Path, policies: list[PreparedPolicy]) -> None:
    interval, collecting, tracer, threads = (
        sys.getswitchinterval(),
        gc.isenabled(),
        sys.gettrace(),
        torch.get_num_threads(),
    )
    policy = _policy(policies)
    policy.warm(*_inputs())
    while policy.compiling:
        policy(*_inputs())
        assert (sys.getswitchinterval(), gc.isenabled(), sys.gettrace(), torch.get_num_threads()) == (
            interval,
            collecting,
            tracer,
            threads,
        )
        policy.wait_until_idle(0.05)
    assert policy.compile_enabled, policy.fallback_reason


@register_backend
def esper_test_in_process_only_backend(gm, example_inputs):  # noqa: ANN001, ANN201 - dynamo's signature
    return gm.forward


def test_a_compile_the_server_cannot_do_falls_back_once_with_one_warning(
    cache: Path, policies: list[PreparedPolicy], caplog: pytest.LogCaptureFixture
) -> None:
    # Registered in this process only: the server cannot compile with it.
    policy = _policy(policies, PolicyCompileConfig(backend="esper_test_in_process_only_backend", mode=None))
    with caplog.at_level(logging.WARNING, logger="esper_core.tamiyo.build"):
        assert policy.warm(*_inputs())
        assert policy.wait_until_idle(300)
        assert not policy.warm(*_inputs(num_slots=3))  # compiling is off for good: no second warning
    assert policy.fallback_total == 1 and not policy.compile_enabled and policy._server is None
    assert "esper_test_in_process_only_backend" in (policy.fallback_reason or "")
    assert sum("compile disabled" in r.message for r in caplog.records) == 1
    out = policy(*_inputs())
    assert torch.isfinite(out.action_logits).all() and not policy.last_call_compiled


def test_a_server_that_dies_while_serving_falls_back_once_and_the_decision_is_still_made(
    cache: Path, policies: list[PreparedPolicy], caplog: pytest.LogCaptureFixture
) -> None:
    policy = _policy(policies)
    inputs = _inputs()
    assert policy.warm(*inputs) and policy.wait_until_idle(300)
    expected = policy(*inputs)
    pid = _server_pid(policy)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: _gone(pid), timeout_s=30, what="the killed server to exit")
    with caplog.at_level(logging.WARNING, logger="esper_core.tamiyo.build"):
        out = policy(*inputs)
        policy(*inputs)
    assert not policy.last_call_compiled and policy.fallback_total == 1 and not policy.compile_enabled
    assert "policy server exited" in (policy.fallback_reason or "")
    assert sum("compile disabled" in r.message for r in caplog.records) == 1
    _same_outputs(expected, out)


def test_a_shape_the_guards_reject_is_served_eagerly_and_compiled_for(
    cache: Path, policies: list[PreparedPolicy]
) -> None:
    # One slot specialises a dimension (0/1) that two left dynamic: the guards reject it.
    policy = _policy(policies)
    assert policy.warm(*_inputs(num_slots=2)) and policy.wait_until_idle(300)
    policy(*_inputs(num_slots=2))
    assert policy.last_call_compiled
    policy(*_inputs(num_slots=1))
    assert not policy.last_call_compiled and policy.fallback_total == 0 and policy.compiling
    assert policy.wait_until_idle(300)
    policy(*_inputs(num_slots=1))
    policy(*_inputs(num_slots=2))  # the first compile still serves its shapes
    assert policy.last_call_compiled and policy.compiled_calls == 3 and policy.fallback_total == 0


def test_max_shapes_caps_the_shapes_compiled(cache: Path, policies: list[PreparedPolicy]) -> None:
    policy = _policy(policies, PolicyCompileConfig(backend="eager", mode=None, max_shapes=1))
    assert policy.warm(*_inputs(num_slots=2))
    assert not policy.warm(*_inputs(num_slots=2))  # seen
    assert not policy.warm(*_inputs(num_slots=3))  # over the cap


def test_a_stored_policy_is_loaded_by_the_next_server_without_compiling(
    cache: Path, policies: list[PreparedPolicy]
) -> None:
    inputs = _inputs()
    first = _policy(policies)
    assert first.warm(*inputs) and first.wait_until_idle(300)
    assert first.compile_s > 0 and first.load_s == 0
    stored = list((cache / "tamiyo-aot").glob("*.bin"))
    assert len(stored) == 1
    again = _policy(policies)
    assert again.warm(*inputs) and again.wait_until_idle(300)
    assert again.compile_s == 0 and again.load_s > 0, "the second server compiled instead of loading"
    again(*inputs)
    assert again.last_call_compiled
    assert artifact_path(first.model, inputs, config=QUICK, device=CPU, dtype=None, process={}) is not None


def test_a_stored_policy_that_does_not_load_is_compiled_again(cache: Path, policies: list[PreparedPolicy]) -> None:
    inputs = _inputs()
    first = _policy(policies)
    assert first.warm(*inputs) and first.wait_until_idle(300)
    (stored,) = (cache / "tamiyo-aot").glob("*.bin")
    stored.write_bytes(b"written by another PyTorch, or cut short")
    again = _policy(policies)
    assert again.warm(*inputs) and again.wait_until_idle(300)
    assert again.fallback_total == 0 and again.compile_s > 0 and again.compile_enabled
    assert stored.stat().st_size > 100  # replaced by the new compile
    again(*inputs)
    assert again.last_call_compiled


def test_no_cache_directory_means_nothing_is_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert artifact_path(_model(), _inputs(), config=QUICK, device=CPU, dtype=None, process={}) is None


def test_new_weights_are_served_eagerly_and_compiled(cache: Path, policies: list[PreparedPolicy]) -> None:
    eager = prepare_policy(_model(), TamiyoConfig(gnn=SMALL))
    compiled = _policy(policies, PolicyCompileConfig(backend="eager", mode=None, background=False))
    inputs = _inputs()
    assert compiled.warm(*inputs)
    before = compiled(*inputs).action_logits.clone()
    torch.manual_seed(1)
    weights = TamiyoGNN(SMALL).state_dict()
    for policy in (eager, compiled):
        policy.load_state_dict(weights)
    after = compiled(*inputs)
    assert compiled.last_call_compiled and not torch.equal(before, after.action_logits)
    _same_outputs(eager(*inputs), after)
    with torch.no_grad():  # an optimiser's step changes them in place too
        for p in compiled.model.parameters():
            p.mul_(0.5)
    stepped = compiled(*inputs)
    with torch.inference_mode():
        _same_outputs(compiled.model(*inputs), stepped)
    assert compiled.last_call_compiled


def test_a_policy_dropped_without_close_stops_its_server(cache: Path) -> None:
    policy = PreparedPolicy(_model(), device=CPU, compile_config=QUICK, dtype=None)
    policy.warm(*_inputs())
    pid = _server_pid(policy)
    del policy
    gc.collect()
    wait_for(lambda: _gone(pid), timeout_s=30, what="the dropped policy's server to exit")


def test_close_stops_a_server_that_does_not_answer(cache: Path) -> None:
    policy = PreparedPolicy(_model(), device=CPU, compile_config=QUICK, dtype=None)
    policy.warm(*_inputs())
    pid = _server_pid(policy)
    os.kill(pid, signal.SIGSTOP)  # deaf to "stop": close must kill it
    policy.close(timeout=0.5)
    wait_for(lambda: _gone(pid), timeout_s=30, what="the stopped server to be killed")
    assert policy._server is None and not policy.compiling


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
    assert x_dict["global"] is graph.x_dict["global"]


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
# Two real compiles in the server: ~90 s alone on 2 cores, three times that beside other test
# workers, so the suite's 300 s default would cut it off mid-compile.
@pytest.mark.timeout(900)
def test_real_compile_matches_eager_without_graph_breaks_and_never_blocks(tmp_path: Path) -> None:
    """One small real compile: eager while compiling, then compiled == eager, no graph breaks
    (``fullgraph=True``: a break fails the compile, and the policy would fall back)."""
    use_compiler_cache(tmp_path / "inductor")
    policy = PreparedPolicy(_model(), device=CPU, compile_config=PolicyCompileConfig(), dtype=None)
    try:
        x, e = _inputs()
        policy.warm(x, e)
        eager = policy(x, e)  # the compile has only just started: eager serves
        assert not policy.last_call_compiled
        assert policy.wait_until_idle(600), "the background compile did not finish"
        assert policy.compile_s > 0, policy.fallback_reason
        compiled = policy(x, e)
        assert policy.compile_enabled and policy.last_call_compiled, policy.fallback_reason
        for a, b in zip(eager, compiled, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        # A graph with one slot specialises a dimension (0/1): served eagerly, compiled in the background.
        policy(*_inputs(num_slots=1))
        assert not policy.last_call_compiled and policy.fallback_total == 0 and policy.compile_enabled
        assert policy.wait_until_idle(600)
        policy(*_inputs(num_slots=1))
        assert policy.last_call_compiled, policy.fallback_reason
    finally:
        policy.close(timeout=60)
