"""The policy server: a child process that compiles Tamiyo's policy, or loads it, and serves it.

Why a process of its own: a cold compile holds an interpreter's GIL for 30-45 s on 2 busy CPU
cores, and even loading a stored compile (``precompile.load_policy``) holds it for ~1.5 s, in
chunks of up to ~55 ms that no thread switch interrupts. Done in the serving process, either one
stalled the eager decisions made meanwhile (2.8 s during a compile; 60-70 ms during a load), and
keeping them fast there took process-wide changes from a background thread: the switch interval,
the garbage collector, a trace function. Here the compiler, the load and the compiled code live in
the child; the serving process keeps the eager network and two pipes, and changes nothing
interpreter-wide. A compiled decision costs a round trip of ~0.1 ms more than the call itself.

The child runs ``nice`` +10 with one compile worker (training and the serving process keep the
CPU first), with the serving thread's settings that change the policy's numerics (matmul
precision, determinism, default dtype: ``precompile.process_state``) and one intra-op thread on
the CPU, where a graph of Tamiyo's size gains nothing from a thread team.

The protocol, one message at a time in each direction over two pipes (``PolicyServer`` is the
parent's end). The child reads a ``Setup`` from a file (the network's weights outgrow a pipe's
buffer, and a write to a child still importing torch would wait for it) and compiles for its
inputs; then the parent sends ``("compile", inputs)``, ``("call", inputs)``, ``("weights",
state)`` or ``("stop",)``. The child answers a compile (the setup's too) with ``("ready",
Timing)`` or ``("failed", reason)``, and a call with ``("out", outputs)``, ``("miss",)`` when no
compiled function's guards accept the inputs, or ``("failed", reason)``; after a failure it exits.
Weights are not answered: the next call sees them. The parent writes only while no compile is in
flight, when the child waits for its next message, so a write never waits for a busy child and a
call is answered in the time the compiled code takes.

Run as ``python -m esper_core.tamiyo.server SETUP READ_FD WRITE_FD``; SETUP is a file the child
removes once read; the compiler cache directory comes from the inherited ``TORCHINDUCTOR_CACHE_DIR``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch import Tensor

from esper_core.tamiyo.config import PolicyCompileConfig
from esper_core.tamiyo.model import PolicyOutput, TamiyoGNN, TamiyoGNNConfig
from esper_core.tamiyo.precompile import (
    CompiledPolicy,
    apply_process_state,
    artifact_path,
    compile_policy,
    compiled_context,
    load_policy,
    record_vec_isa,
    recorded_vec_isa,
    save_policy,
)

NICE = 10
"""Niceness added in the child: the serving process and training keep the CPU first."""

Inputs = tuple[dict[Any, Tensor], dict[Any, Tensor]]
Packed = tuple[str, tuple[int, ...], bytes]
PackedInputs = tuple[dict[Any, Packed], dict[Any, Packed]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Setup:
    """What the child needs to serve the parent's policy (the first message it reads).

    Attributes:
        gnn: The network's configuration.
        state: Its weights (packed, see ``pack_state``).
        config: How to compile.
        device: Where the policy runs (``cpu``, ``cuda:0``).
        dtype: Autocast dtype name (``bfloat16``), or None.
        process: The serving thread's settings (``precompile.process_state``).
        inputs: The first inputs to compile for (packed, see ``pack_inputs``).
    """

    gnn: TamiyoGNNConfig
    state: dict[str, Packed]
    config: PolicyCompileConfig
    device: str
    dtype: str | None
    process: dict[str, Any]
    inputs: PackedInputs


@dataclass(frozen=True, kw_only=True, slots=True)
class Timing:
    """How a compile request was met: compiled here (``compile_s`` > 0) or loaded from the store
    (``load_s`` > 0), in seconds."""

    compile_s: float
    load_s: float


# ------------------------------------------------------------------ tensors over a pipe


def pack(tensor: Tensor) -> Packed:
    """``tensor`` as (dtype, shape, raw bytes): ~15x cheaper to pickle than the tensor itself
    (0.07 vs 1.0 ms for the ``policy-graph`` inputs), which pickles each storage with ``torch.save``."""
    t = tensor.detach().to("cpu").contiguous()
    return str(t.dtype).removeprefix("torch."), tuple(t.shape), t.view(torch.uint8).numpy().tobytes()


def unpack(packed: Packed) -> Tensor:
    """The tensor ``pack`` made, on the CPU."""
    dtype_name, shape, data = packed
    dtype = getattr(torch, dtype_name)
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).view(shape)


def pack_inputs(inputs: Inputs) -> PackedInputs:
    """A graph's ``(x_dict, edge_index_dict)`` packed."""
    x_dict, edge_index_dict = inputs
    return {k: pack(v) for k, v in x_dict.items()}, {k: pack(v) for k, v in edge_index_dict.items()}


def unpack_inputs(packed: PackedInputs, device: torch.device) -> Inputs:
    """``pack_inputs``'s graph on ``device``."""
    x_dict, edge_index_dict = packed
    return (
        {k: unpack(v).to(device) for k, v in x_dict.items()},
        {k: unpack(v).to(device) for k, v in edge_index_dict.items()},
    )


def pack_state(model: TamiyoGNN) -> dict[str, Packed]:
    """``model``'s state dict packed."""
    return {k: pack(v) for k, v in model.state_dict().items()}


def send(conn: Connection, message: tuple[Any, ...] | Setup) -> None:
    """Write one message (plain pickle: ``Connection.send``'s pickler would hand tensors over by
    shared memory, which needs a multiprocessing-started child)."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:  # noqa: ANN401 - a message of the protocol above
    """Read one message (``EOFError`` once the other end is closed)."""
    return pickle.loads(conn.recv_bytes())


# ------------------------------------------------------------------ the parent's end


class PolicyServer:
    """The serving process's handle on a policy server child: start it, talk to it, stop it.

    Args:
        setup: What the child serves.
    """

    def __init__(self, setup: Setup) -> None:
        with tempfile.NamedTemporaryFile(prefix="esper-tamiyo-setup-", suffix=".pkl", delete=False) as file:
            pickle.dump(setup, file, protocol=pickle.HIGHEST_PROTOCOL)
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        # The child's error output goes to a file: a pipe nobody reads during a 40 s compile
        # could fill up and stall it. Its tail is quoted when the child fails.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - open as long as the child runs
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "esper_core.tamiyo.server", file.name, str(child_read), str(child_write)],
                pass_fds=(child_read, child_write),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
            )
        except OSError:
            Path(file.name).unlink()
            raise
        finally:
            os.close(child_read)
            os.close(child_write)
        self._in = Connection(parent_read, writable=False)
        self._out = Connection(parent_write, readable=False)

    def post(self, *message: Any) -> None:  # noqa: ANN401 - see the protocol
        """Send one message (``OSError`` if the child is gone)."""
        send(self._out, message)

    def answer(self, timeout_s: float | None) -> tuple[Any, ...] | None:
        """The child's next message, waiting up to ``timeout_s`` (0: only if one is there).

        Returns:
            The message; None if none came in time.

        Raises:
            EOFError: The child exited (its error output is in ``last_words``).
        """
        if not self._in.poll(timeout_s):
            return None
        return receive(self._in)

    def last_words(self) -> str:
        """The tail of the child's error output."""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace").strip()[-1500:]

    def stop(self, timeout_s: float) -> None:
        """Ask the child to exit; kill it if it has not within ``timeout_s`` (it may be compiling)."""
        with contextlib.suppress(OSError):
            self.post("stop")
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._in.close()
        self._out.close()
        self._stderr.close()


# ------------------------------------------------------------------ the child


class _Served:
    """The child's state: the network, its compiled functions, how it compiles."""

    def __init__(self, setup: Setup) -> None:
        self.config = setup.config
        self.device = torch.device(setup.device)
        self.dtype = None if setup.dtype is None else getattr(torch, setup.dtype)
        self.process = setup.process
        self.model = TamiyoGNN(setup.gnn)
        self.load_weights(setup.state)
        self.model = self.model.to(self.device).eval()
        self.compiled: list[CompiledPolicy] = []

    def load_weights(self, state: dict[str, Packed]) -> None:
        with torch.no_grad():
            self.model.load_state_dict({k: unpack(v) for k, v in state.items()})

    def compile(self, inputs: Inputs) -> Timing:
        """Load the policy stored for these shapes, or compile and store it; then call it once
        on its own inputs (lazy initialisation, CUDA graph capture) so a decision does not."""
        start = time.perf_counter()
        stored = artifact_path(
            self.model, inputs, config=self.config, device=self.device, dtype=self.dtype, process=self.process
        )
        with recorded_vec_isa():
            fn = _load_stored(stored, self.model)
        load_s = time.perf_counter() - start if fn is not None else 0.0
        compile_s = 0.0
        if fn is None:
            with compiled_context(self.device, self.dtype):
                fn = compile_policy(self.model, inputs, config=self.config)
            if stored is not None:
                save_policy(fn, stored, model=self.model)
            record_vec_isa()
            compile_s = time.perf_counter() - start
        with compiled_context(self.device, self.dtype):
            if not fn.guard_check(self.model, *inputs):
                raise RuntimeError(
                    "the compiled policy's guards reject the inputs it was compiled for, so it would never serve"
                )
            fn(self.model, *inputs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.compiled.append(fn)
        return Timing(compile_s=compile_s, load_s=load_s)

    def call(self, inputs: Inputs) -> PolicyOutput | None:
        """The compiled forward, if one compiled function accepts ``inputs``."""
        with compiled_context(self.device, self.dtype):
            fn = next((f for f in self.compiled if f.guard_check(self.model, *inputs)), None)
            return None if fn is None else fn(self.model, *inputs)


def _load_stored(path: Path | None, model: TamiyoGNN) -> CompiledPolicy | None:
    """The policy stored at ``path``; None when there is none or it does not load (another
    PyTorch or machine wrote it, or the file is damaged: it is removed, to be compiled again)."""
    if path is None or not path.exists():
        return None
    try:
        return load_policy(path, model=model)
    except Exception as e:  # noqa: BLE001 - unpickling and PyTorch's compatibility checks raise many types
        print(f"the stored compiled policy {path} did not load ({e}); compiling it again", file=sys.stderr)
        path.unlink(missing_ok=True)
        return None


def serve(setup: Setup, conn_in: Connection, conn_out: Connection) -> int:
    """The child: compile for the setup's inputs, then answer messages until ``stop`` or the
    parent is gone."""
    os.nice(NICE)
    inductor_config.compile_threads = 1  # one compile worker: training keeps the other cores
    process = dict(setup.process)
    if torch.device(setup.device).type == "cpu":
        process["threads"] = 1
    apply_process_state(process)
    # The stored policy's key holds the settings it was compiled under: these, not the parent's.
    served = _Served(dataclasses.replace(setup, process=process))
    message: tuple[Any, ...] = ("compile", setup.inputs)
    while True:
        kind = message[0]
        try:
            if kind == "stop":
                return 0
            if kind == "weights":
                served.load_weights(message[1])
            elif kind == "compile":
                send(conn_out, ("ready", served.compile(unpack_inputs(message[1], served.device))))
            elif kind == "call":
                out = served.call(unpack_inputs(message[1], served.device))
                send(conn_out, ("miss",) if out is None else ("out", tuple(pack(t) for t in out)))
            else:
                raise ValueError(f"unknown message {kind!r}")
        # Compilers and compiled code fail in many exception types (Inductor, CUDA graphs,
        # guards): each one means "serve eagerly from now on", said to the parent with its reason.
        except Exception as e:  # noqa: BLE001
            with contextlib.suppress(OSError):
                send(conn_out, ("failed", f"{type(e).__name__}: {e}".splitlines()[0][:500]))
            return 1
        try:
            message = receive(conn_in)
        except EOFError:  # the serving process is gone
            return 0


def main(setup_path: str, read_fd: str, write_fd: str) -> int:
    """Serve the setup in ``setup_path`` (removed once read) on the two inherited pipe ends."""
    path = Path(setup_path)
    with path.open("rb") as file:
        setup: Setup = pickle.load(file)
    path.unlink()
    return serve(setup, Connection(int(read_fd), writable=False), Connection(int(write_fd), readable=False))


if __name__ == "__main__":
    # Through the module's own name: messages pickle ``Timing`` as esper_core.tamiyo.server.Timing,
    # which the parent can find (``__main__.Timing`` it cannot).
    from esper_core.tamiyo import server

    sys.exit(server.main(*sys.argv[1:4]))
