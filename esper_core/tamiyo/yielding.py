"""How a compiled policy loading on a background thread shares the interpreter with decisions.

Loading a stored policy (``precompile.load_policy``) is ~1.5 s of GIL-held Python on a thread of
the serving process, while eager decisions go on. Three things keep them fast; ``loading`` sets
them up for the loading thread, ``deciding`` marks a decision:

- the interpreter's thread switch interval drops to ``LOADING_SWITCH_INTERVAL_S``: each torch op
  of an eager decision releases the GIL and then waits up to the switch interval to get it back;
- the cyclic GC is off, since a full collection walks every object of the process with the GIL
  held;
- the loading thread pauses at each Python call while a decision is in flight (a call-only trace
  function, ``_pause_for_decisions``). Even with the short switch interval, the load held the GIL
  in chunks of up to ~55 ms: a first load imports ~740 modules (Inductor's code generators,
  networkx through functorch's partitioner, redis through Inductor's remote cache) and builds the
  guard tree, and both run C calls (compiling and unmarshalling code) that no switch interrupts.
  A decision that met two or three of them took 30-65 ms. Paused, the loader starts no new chunk
  while a decision runs. ``esper bench policy``, three runs each way interleaved on a 2-core
  machine: worst decision during warm-up 60.7-68.6 ms before, 7.3-8.7 ms after; cached warm-up
  1.26-1.76 s before, 1.92-2.20 s after (the trace function's cost: it is called at every call).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

LOADING_SWITCH_INTERVAL_S = 2e-5
"""The interpreter's thread switch interval while this process loads a compiled policy.

At 5 ms (the default) a ~200-op decision took up to 1 s while loading; at 0.02 ms the worst
decision during a load was 21-24 ms on a quiet 2-core machine (``esper bench policy``).
Process-wide, so it is set only while loading.
"""

PAUSE_MAX_S = 0.05
"""The longest a loading thread waits at one call for decisions to end.

Bounded because a decision could itself wait for the paused loader: importing a module the loader
is half-way through importing waits for that module's lock, say. The pause then ends after this
long and both go on; a decision never waits for the pause itself.
"""

_loading_lock = threading.Lock()
_loading_depth = 0
_loading_restore: Callable[[], None] | None = None
_decisions_lock = threading.Lock()
_decisions_in_flight = 0
_no_decision = threading.Event()
_no_decision.set()
_thread = threading.local()


def _pause_for_decisions(frame: FrameType, event: str, arg: object) -> None:
    """The trace function of a loading thread: called at each Python call it makes (and nothing
    else: it returns no local tracer), it waits while a decision runs on another thread."""
    # A thread that decides and loads at once (a synchronous compile) must not wait for itself.
    if _decisions_in_flight and not getattr(_thread, "deciding", 0):
        _no_decision.wait(PAUSE_MAX_S)


@contextlib.contextmanager
def deciding() -> Iterator[None]:
    """Run the block as a decision: a load on another thread pauses at its next Python call
    until no decision is in flight. Costs a lock and an event, a few microseconds."""
    global _decisions_in_flight
    # Marked first and unmarked last: the event's own methods are Python calls, which a trace
    # function on this thread (one that also loads) would otherwise see as another's decision.
    _thread.deciding = getattr(_thread, "deciding", 0) + 1
    with _decisions_lock:
        _decisions_in_flight += 1
        _no_decision.clear()
    try:
        yield
    finally:
        with _decisions_lock:
            _decisions_in_flight -= 1
            if _decisions_in_flight == 0:
                _no_decision.set()
        _thread.deciding -= 1


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Run the block as a load that must not stall decisions (nested or concurrent blocks share it).

    Process-wide settings, restored when the last block ends:

    - the switch interval is ``LOADING_SWITCH_INTERVAL_S``;
    - the cyclic GC is off. A load allocates enough objects to set off full collections: 180-185
      ms, the worst decision of a load, before this; 20-47 ms with the process's older objects
      frozen out of the walk. At the end the load's objects are moved to the oldest generation
      unwalked (``gc.freeze`` then ``gc.unfreeze``), to be collected at the process's next full
      collection, as if they had aged there. A process that froze objects itself keeps its
      freeze, and its young generation walks the load's objects at its next collection instead;
    - the threads inside this block pause for decisions (``_pause_for_decisions``). A thread that
      already has a trace function (a debugger, coverage) keeps it and does not pause.
    """
    global _loading_depth, _loading_restore
    with _loading_lock:
        if _loading_depth == 0:
            interval = sys.getswitchinterval()
            collecting = gc.isenabled()
            sys.setswitchinterval(LOADING_SWITCH_INTERVAL_S)
            gc.disable()

            def restore() -> None:
                sys.setswitchinterval(interval)
                if gc.get_freeze_count() == 0:
                    gc.freeze()
                    gc.unfreeze()
                if collecting:
                    gc.enable()

            _loading_restore = restore
        _loading_depth += 1
    tracer = sys.gettrace()
    if tracer is None:
        sys.settrace(_pause_for_decisions)
    try:
        yield
    finally:
        if tracer is None:
            sys.settrace(None)
        with _loading_lock:
            _loading_depth -= 1
            if _loading_depth == 0 and _loading_restore is not None:
                _loading_restore()
                _loading_restore = None
