"""How a compiled policy loading on a background thread shares the interpreter with decisions.

Loading a stored policy (``precompile.load_policy``) is ~1.5 s of GIL-held Python on a thread of
the serving process, while eager decisions go on. Three things keep them fast; ``loading`` sets
them up for the loading thread, ``deciding`` marks a decision:

- the interpreter's thread switch interval drops to ``LOADING_SWITCH_INTERVAL_S``: each torch op
  of an eager decision releases the GIL and then waits up to the switch interval to get it back;
- the cyclic GC is off, since a full collection walks every object of the process with the GIL
  held;
- the loading thread pauses at each module it imports while a decision is in flight. A first load
  imports ~740 modules (Inductor's code generators, networkx through functorch's partitioner, redis
  through Inductor's remote cache), and executing them held the GIL in chunks of up to ~55 ms;
  those chunks were most of the slow decisions. An import is a point where the loader holds no
  lock a decision needs, and pausing there costs the load nothing measurable.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.abc
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

LOADING_SWITCH_INTERVAL_S = 2e-5
"""The interpreter's thread switch interval while this process loads a compiled policy.

At 5 ms (the default) a ~200-op decision took up to 1 s while loading; at 0.02 ms the worst
decision during a load was 21-24 ms on a quiet 2-core machine (``esper bench policy``).
Process-wide, so it is set only while loading.
"""

IMPORT_PAUSE_MAX_S = 0.05
"""The longest a loading thread waits at one import for decisions to end.

Bounded because a decision could itself wait for the loading thread: importing a module that the
loader is half-way through importing waits for that module's lock. The pause then ends after this
long and both go on; a decision never waits for the pause.
"""

_loading_lock = threading.Lock()
_loading_depth = 0
_loading_restore: Callable[[], None] | None = None
_decisions_lock = threading.Lock()
_decisions_in_flight = 0
_no_decision = threading.Event()
_no_decision.set()
_thread = threading.local()


class _PauseForDecisions(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path`` while a policy loads: a loading thread that imports a module
    while a decision runs waits for it here, then the ordinary finders find the module."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        # A thread that decides and loads at once (a synchronous compile) must not wait for itself.
        if not _no_decision.is_set() and getattr(_thread, "loading", 0) and not getattr(_thread, "deciding", 0):
            _no_decision.wait(IMPORT_PAUSE_MAX_S)
        return None


_PAUSE = _PauseForDecisions()


@contextlib.contextmanager
def deciding() -> Iterator[None]:
    """Run the block as a decision: a load on another thread pauses at its next import until
    no decision is in flight. Costs a lock and an event, a few microseconds."""
    global _decisions_in_flight
    with _decisions_lock:
        _decisions_in_flight += 1
        _no_decision.clear()
    _thread.deciding = getattr(_thread, "deciding", 0) + 1
    try:
        yield
    finally:
        _thread.deciding -= 1
        with _decisions_lock:
            _decisions_in_flight -= 1
            if _decisions_in_flight == 0:
                _no_decision.set()


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
    - imports pause for decisions (``_PauseForDecisions``), on the threads inside this block only.
    """
    global _loading_depth, _loading_restore
    with _loading_lock:
        if _loading_depth == 0:
            interval = sys.getswitchinterval()
            collecting = gc.isenabled()
            sys.setswitchinterval(LOADING_SWITCH_INTERVAL_S)
            gc.disable()
            sys.meta_path.insert(0, _PAUSE)

            def restore() -> None:
                sys.meta_path.remove(_PAUSE)
                sys.setswitchinterval(interval)
                if gc.get_freeze_count() == 0:
                    gc.freeze()
                    gc.unfreeze()
                if collecting:
                    gc.enable()

            _loading_restore = restore
        _loading_depth += 1
    _thread.loading = getattr(_thread, "loading", 0) + 1
    try:
        yield
    finally:
        _thread.loading -= 1
        with _loading_lock:
            _loading_depth -= 1
            if _loading_depth == 0 and _loading_restore is not None:
                _loading_restore()
                _loading_restore = None
