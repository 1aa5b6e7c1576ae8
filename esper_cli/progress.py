"""Progress of the CLI's long commands on stderr (rich), and the ``-v`` logging switch.

A display appears only where a person watches: stderr is a terminal and the command was not asked
for ``--json``. Otherwise every call is a no-op, so stdout (a table, or one JSON object) and a
redirected stderr stay exactly what they were.

The display never refreshes on its own: it redraws when the work reports a step, which the
benchmarks do between timed regions, never inside them. Only waits in which this process does no
measured work (a child process compiling, a drill) may ``tick``: a thread then redraws the
spinner and the elapsed time twice a second.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from types import TracebackType

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

LOGGERS = ("esper_core", "esper_cli", "bench")
"""Loggers ``-v`` turns up; every other library keeps its own level."""
_TICK_S = 0.5


def stderr_is_terminal() -> bool:
    """Whether a person can watch stderr (a progress display would be noise in a file or pipe)."""
    return sys.stderr.isatty()


class ProgressDisplay:
    """One task's progress bar on stderr, or nothing when ``enabled`` is False.

    Use as a context manager; the work calls the object as ``display(description, completed,
    total)`` (``total`` None: no bar, a spinner and the step count). The bar disappears when the
    context exits, so it leaves nothing in the terminal's scroll-back but the command's output.
    """

    def __init__(self, title: str, *, enabled: bool) -> None:
        self.title = title
        self.enabled = enabled
        self._progress: Progress | None = None
        self._task = None
        self._lock = threading.Lock()
        self._rerouted: list[Callable[[], None]] = []

    def __enter__(self) -> ProgressDisplay:
        if self.enabled:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("[bold]{task.fields[title]}[/bold] {task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                auto_refresh=False,  # a refresh thread would share the CPU with timed work
                transient=True,
                # stdout is the command's result: never divert it into the display on stderr.
                redirect_stdout=False,
            )
            terminal = sys.stderr
            self._progress.start()  # from here on sys.stderr is rich's proxy
            self._rerouted = _route_handlers(terminal, sys.stderr)
            self._task = self._progress.add_task("starting", total=None, title=self.title)
            self._progress.refresh()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            for restore in self._rerouted:
                restore()
            self._rerouted = []

    @property
    def console(self) -> Console | None:
        """The console the live display draws on (print through it to appear above the bar)."""
        return None if self._progress is None else self._progress.console

    def __call__(self, description: str, completed: int, total: int | None) -> None:
        """Show ``description`` and ``completed`` of ``total`` steps, and redraw once."""
        if self._progress is None or self._task is None:
            return
        with self._lock:
            self._progress.update(self._task, description=description, completed=completed, total=total)
            self._progress.refresh()

    @contextlib.contextmanager
    def ticking(self) -> Iterator[None]:
        """Redraw twice a second until the block ends: only around waits with no timed work in
        this process (the spinner and elapsed time show that it is alive)."""
        if self._progress is None:
            yield
            return
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(_TICK_S):
                with self._lock:
                    if self._progress is not None:
                        self._progress.refresh()

        thread = threading.Thread(target=tick, name="esper-progress-tick", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _route_handlers(terminal: object, proxy: object) -> list[Callable[[], None]]:
    """Point log handlers that write to ``terminal`` at ``proxy``; returns how to undo it.

    While the display is live, rich replaces ``sys.stderr`` with a proxy that prints above the bar,
    but a handler created earlier (Prefect's console handler among them) holds the terminal itself
    and would tear the display. Handlers that print through a rich ``Console`` (Prefect's) have
    that console's file switched instead.
    """
    undo: list[Callable[[], None]] = []
    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    seen: set[int] = set()
    for handler in (h for logger in loggers for h in logger.handlers):
        if id(handler) in seen:
            continue
        seen.add(id(handler))
        console = getattr(handler, "console", None)
        if isinstance(console, Console) and console.file is terminal:
            console.file = proxy  # type: ignore[assignment]
            undo.append(lambda c=console: setattr(c, "file", terminal))
        elif isinstance(handler, logging.StreamHandler) and handler.stream is terminal:
            handler.setStream(proxy)  # type: ignore[arg-type]
            undo.append(lambda h=handler: h.setStream(terminal))
    return undo


def progress(title: str, *, json_output: bool = False) -> ProgressDisplay:
    """A display for ``title`` that is on only when stderr is a terminal and not ``json_output``."""
    return ProgressDisplay(title, enabled=stderr_is_terminal() and not json_output)


def configure_logging(verbosity: int) -> None:
    """``-v``: INFO, ``-vv``: DEBUG for Esper's own loggers; 0 leaves logging as it is (WARNING).

    A handler on stderr is added to the root logger only when it has none, so Prefect's console
    handler (which replaces the root's handlers when Prefect is imported) is not doubled.
    """
    if verbosity <= 0:
        return
    level = logging.INFO if verbosity == 1 else logging.DEBUG
    for name in LOGGERS:
        logging.getLogger(name).setLevel(level)
    root = logging.getLogger()
    if root.handlers:
        return
    if stderr_is_terminal():
        handler: logging.Handler = RichHandler(console=Console(stderr=True), show_path=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root.addHandler(handler)


class _TaskRunCounter(logging.Handler):
    """Counts finished task runs of a flow running in this process, by task name.

    The Prefect engine logs one record per finished task run on ``prefect.task_runs`` with the
    task's name in ``record.task_name`` and a message starting "Finished in state".
    """

    def __init__(self, display: ProgressDisplay, labels: dict[str, str]) -> None:
        super().__init__(level=logging.INFO)
        self.display = display
        self.labels = labels
        self.counts = dict.fromkeys(labels, 0)

    def emit(self, record: logging.LogRecord) -> None:
        name = getattr(record, "task_name", None)
        if name not in self.counts or not record.getMessage().startswith("Finished in state"):
            return
        self.counts[name] += 1
        text = ", ".join(f"{self.counts[n]} {label}" for n, label in self.labels.items())
        self.display(text, sum(self.counts.values()), None)


@contextlib.contextmanager
def follow_task_runs(display: ProgressDisplay, labels: dict[str, str]) -> Iterator[None]:
    """Advance ``display`` as task runs finish: ``labels`` maps task names to what they did
    (``{"compile-blueprint": "compiled"}``). Nothing is attached when the display is off."""
    if not display.enabled:
        yield
        return
    handler = _TaskRunCounter(display, labels)
    logger = logging.getLogger("prefect.task_runs")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def with_bar(cli: Callable[..., int], args: argparse.Namespace, name: str) -> int:
    """Run a long command ``cli(args, progress=...)`` (a benchmark, a policy tuning: minutes to an
    hour) with a bar on stderr while it runs; stdout keeps only the report. No bar with ``--json``
    or when stderr is no terminal."""
    if args.json or not sys.stderr.isatty():
        return cli(args)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(name, total=None)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total)

        return cli(args, progress=progress)
