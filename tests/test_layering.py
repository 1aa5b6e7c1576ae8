"""The layering holds: no module imports a layer above its own.

esper_core (library) <- tasks (Prefect tasks) <- flows (chain tasks) <- bench (benchmark entry
points) <- esper_cli (the ``esper`` command, which dispatches to bench). Imports inside functions
and under ``TYPE_CHECKING`` count, and so do the ``"package.module:function"`` strings that tasks
hand to a child process: each is an import that runs later.

Inside the library the run layer is one run only: ``esper_core.run`` never imports
``esper_core.studies``, the code that runs many runs on top of it (episodes, Simic's training,
the growth benchmark, drills). And each subsystem imports only the library packages it is built
on (``SUBSYSTEMS``): Kasmina never reaches up into the trainer, Tamiyo reads packets and knows no
seed manager, and so on; a new package declares its place before it is used.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {"esper_core": 0, "tasks": 1, "flows": 2, "bench": 3, "esper_cli": 4}
"""Top-level package -> rank: a module may import its own rank or a lower one."""

PREFECT = ("prefect", "prefect_dask")
"""Packages the library never imports (DESIGN.md: esper_core is a plain library)."""

INNER = {"esper_core.run": "esper_core.studies"}
"""Inside the library: a package -> the package above it that it may not import."""

FOUNDATION = frozenset(
    {
        "_capabilities",
        "_lazy",
        "child",
        "contracts",
        "data",
        "determinism",
        "interrupts",
        "models",
        "settings",
        "threads",
    }
)
"""Library packages every other one may import: contracts, capabilities, settings and plain helpers."""

SUBSYSTEMS: dict[str, tuple[frozenset[str], str]] = {
    "datasets": (frozenset(), "a data set is built from its generator alone"),
    "fanout": (frozenset(), "the process pool knows nothing of what it runs"),
    "karn": (frozenset(), "the catalogue describes blueprints; it builds modules but loads and runs nothing"),
    "telemetry": (frozenset(), "telemetry takes packets (contracts) from everyone and imports none of them"),
    "tamiyo": (
        frozenset(),
        "Tamiyo decides from packets and candidates (contracts): she never touches a seed manager, a "
        "trainer or a registry; the run layer hands her what she reads",
    ),
    "tezzeret": (frozenset({"karn"}), "the compiler builds Karn's blueprints and nothing else"),
    "urza": (frozenset({"tezzeret"}), "the registry stores Tezzeret's artifacts; it runs no seed"),
    "pipeline": (frozenset({"karn", "tezzeret", "urza"}), "compile and publish: Karn -> Tezzeret -> Urza"),
    "simic": (frozenset({"tamiyo", "urza"}), "Simic trains Tamiyo's policy from records in Urza's database"),
    "kasmina": (
        frozenset({"karn", "tezzeret", "urza"}),
        "Kasmina sits below the trainer and the run: take what it needs through an interface it "
        "defines (kasmina.signals.GrowthSignals, kasmina.kinds.KernelSource) and let the caller pass it in",
    ),
    "hosts": (frozenset({"karn", "kasmina"}), "built-in hosts carry Kasmina's slots and nothing above them"),
    "tolaria": (
        frozenset({"hosts", "kasmina"}),
        "the trainer runs a host and its seed manager; deciding and committing are the run layer's",
    ),
    "run": (
        frozenset(
            {"datasets", "hosts", "karn", "kasmina", "pipeline", "simic", "tamiyo", "telemetry", "tezzeret"}
            | {"tolaria", "urza"}
        ),
        "the run composes every subsystem below it; what runs many runs lives in esper_core/studies/",
    ),
    "zoo": (
        frozenset({"datasets", "run", "tamiyo", "tolaria"}),
        "a zoo member is an ordinary recipe: it names the run layer's configuration, its data and models",
    ),
    "benchmarks": (
        frozenset({"hosts", "karn", "kasmina", "run", "telemetry", "tezzeret", "tolaria"}),
        "the per-epoch benchmarks time one run's parts against bare PyTorch",
    ),
    "studies": (
        frozenset(
            {"fanout", "hosts", "karn", "kasmina", "pipeline", "run", "simic", "tamiyo", "telemetry"}
            | {"tolaria", "urza", "zoo"}
        ),
        "studies run many runs on top of the run layer (Simic's zoo training draws zoo members)",
    ),
}
"""Library package -> (the non-foundation library packages it may import, why)."""

_TARGET = re.compile(r"^([A-Za-z_]\w*)(\.\w+)*:\w+$")

_FIX = {
    "tasks": "move the code it needs into esper_core (e.g. esper_core/benchmarks/) and call it from the task",
    "flows": "a task or flow may only chain lower layers: move the shared code into esper_core or a task",
    "bench": "move the reusable benchmark code into esper_core/benchmarks/ (a study of many runs: esper_core/studies/) and import it from there",
    "esper_cli": "move the shared code into esper_core (or bench/ if only entry points use it)",
}

_INNER_FIX = {
    "esper_core.studies": "the run layer is one run only: move what the run needs out of esper_core/studies/ "
    "into esper_core/run/, or move the caller up into esper_core/studies/",
}


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, imported module) for every import and every ``module:function`` string in ``tree``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _TARGET.match(node.value):
            found.append((node.lineno, node.value.split(":")[0]))
    return found


def _from_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, ``package.name``) for every ``from package import name`` in ``tree``: the name may be a module."""
    return [
        (node.lineno, f"{node.module}.{alias.name}")
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        for alias in node.names
    ]


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _inner_violations(module: str, tree: ast.AST) -> list[str]:
    """Every import by ``module`` (in esper_core) of a library package above its own, one line each."""
    problems: list[str] = []
    for below, above in INNER.items():
        if not _inside(module, below):
            continue
        hits: dict[int, str] = {}  # line -> the shortest name imported there (one report a line)
        for line, imported in _imports(tree) + _from_imports(tree):
            if _inside(imported, above) and len(imported) < len(hits.get(line, imported + ".")):
                hits[line] = imported
        problems += [
            f"{module} (line {line}) imports {imported}: {below} may not import {above} above it; {_INNER_FIX[above]}"
            for line, imported in sorted(hits.items())
        ]
    return problems


def _library_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "esper_core" and len(parts) > 1 else None


def subsystem_violations(root: Path) -> list[str]:
    """Every import by a library package of one it is not built on (``SUBSYSTEMS``), and every
    library package the table does not declare, one line each."""
    problems: list[str] = []
    library = root / "esper_core"
    declared = FOUNDATION | set(SUBSYSTEMS)
    for child in sorted(library.iterdir()):
        name = child.stem if child.suffix == ".py" else child.name
        if (child.suffix == ".py" or (child / "__init__.py").exists()) and name != "__init__" and name not in declared:
            problems.append(
                f"esper_core.{name} is not in tests/test_layering.py's SUBSYSTEMS (nor FOUNDATION): declare what it "
                "may import, and why"
            )
    for path in sorted(library.rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        own = _library_package(module)
        if own is None or own not in declared:
            continue
        allowed, why = SUBSYSTEMS.get(
            own, (FOUNDATION, "the foundation imports only itself: everything else builds on it")
        )
        for line, imported in _imports(ast.parse(path.read_text(), filename=str(path))):
            other = _library_package(imported)
            if other is not None and other != own and other not in FOUNDATION and other not in allowed:
                problems.append(
                    f"{module} (line {line}) imports {imported}: esper_core.{own} is not built on esper_core.{other}; "
                    f"{why}"
                )
    return problems


def violations(root: Path) -> list[str]:
    """Every upward import (and every Prefect import in the library) under ``root``, one line each."""
    problems: list[str] = []
    for package, rank in LAYERS.items():
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            tree = ast.parse(path.read_text(), filename=str(path))
            if package == "esper_core":
                problems += _inner_violations(module, tree)
            for line, imported in _imports(tree):
                top = imported.split(".")[0]
                where = f"{module} (line {line}) imports {imported}"
                if LAYERS.get(top, -1) > rank:
                    problems.append(f"{where}: {package} may not import the {top} layer above it; {_FIX[top]}")
                elif package == "esper_core" and top in PREFECT:
                    problems.append(f"{where}: esper_core never imports Prefect; wrap the call in a task under tasks/")
    return problems


def test_no_module_imports_a_layer_above_its_own() -> None:
    problems = violations(ROOT)
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_each_library_package_imports_only_what_it_is_built_on() -> None:
    problems = subsystem_violations(ROOT)
    assert not problems, "imports across the library's subsystems:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        (
            "kasmina/manager.py",
            "def f():\n    from esper_core.tolaria.loop import Trainer\n",
            "esper_core.kasmina.manager (line 2) imports esper_core.tolaria.loop: esper_core.kasmina is not built on "
            "esper_core.tolaria; Kasmina sits below the trainer",
        ),
        (
            "tamiyo/graph.py",
            "from esper_core.kasmina.slot import SeedSlot\n",
            "esper_core.tamiyo is not built on esper_core.kasmina; Tamiyo decides from packets",
        ),
        ("newthing.py", "X = 1\n", "esper_core.newthing is not in tests/test_layering.py's SUBSYSTEMS"),
        (
            "contracts/messages.py",
            "from esper_core.run.config import RunConfig\n",
            "esper_core.contracts is not built on esper_core.run; the foundation imports only itself",
        ),
    ],
)
def test_a_subsystem_reaching_past_what_it_is_built_on_is_reported(
    tmp_path: Path, module: str, source: str, expected: str
) -> None:
    path = tmp_path / "esper_core" / module
    path.parent.mkdir(parents=True)
    path.write_text(source)
    # The foundation and declared neighbours are fine.
    (tmp_path / "esper_core" / "karn").mkdir()
    (tmp_path / "esper_core" / "karn" / "ok.py").write_text("from esper_core.contracts import SeedStage\n")
    (problem,) = subsystem_violations(tmp_path)
    assert expected in problem


def test_every_layer_is_scanned() -> None:
    # A renamed or moved package would make the check above pass on nothing.
    for package in LAYERS:
        assert any((ROOT / package).rglob("*.py")), f"no modules under {package}/"


@pytest.mark.parametrize(
    ("package", "source", "expected"),
    [
        ("tasks", "from bench.sweep import run_case\n", "tasks.mod (line 1) imports bench.sweep"),
        ("flows", "def f():\n    import esper_cli.main\n", "flows.mod (line 2) imports esper_cli.main"),
        ("tasks", 'X = in_child("bench", "bench.sweep:run_case")\n', "tasks.mod (line 1) imports bench.sweep"),
        ("esper_core", "from tasks._runtime import settings\n", "esper_core.mod (line 1) imports tasks._runtime"),
        ("esper_core", "import prefect\n", "esper_core never imports Prefect"),
        ("bench", "from esper_cli.args import local_flow_settings\n", "bench.mod (line 1) imports esper_cli.args"),
    ],
)
def test_an_upward_import_is_reported_with_its_fix(tmp_path: Path, package: str, source: str, expected: str) -> None:
    for name in LAYERS:
        (tmp_path / name).mkdir()
    (tmp_path / package / "mod.py").write_text(source)
    (tmp_path / "bench" / "ok.py").write_text("from flows.morphogenesis import morphogenesis\nimport prefect\n")
    (problem,) = violations(tmp_path)
    assert expected in problem
    assert "move" in problem or "wrap" in problem


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "from esper_core.studies.episodes import run_episode\n",
            "esper_core.run.mod (line 1) imports esper_core.studies.episodes",
        ),
        ("def f():\n    from esper_core import studies\n", "esper_core.run.mod (line 2) imports esper_core.studies"),
        ("import esper_core.studies.growth\n", "esper_core.run.mod (line 1) imports esper_core.studies.growth"),
        (
            'X = "esper_core.studies.simic_jobs:episode_ids"\n',
            "esper_core.run.mod (line 1) imports esper_core.studies.simic_jobs",
        ),
    ],
)
def test_the_run_layer_importing_studies_is_reported_with_its_fix(tmp_path: Path, source: str, expected: str) -> None:
    for name in LAYERS:
        (tmp_path / name).mkdir()
    (tmp_path / "esper_core" / "run").mkdir()
    (tmp_path / "esper_core" / "studies").mkdir()
    (tmp_path / "esper_core" / "run" / "mod.py").write_text(source)
    # Studies import the run layer, and other library packages are not bound by this rule.
    (tmp_path / "esper_core" / "studies" / "ok.py").write_text("from esper_core.run.session import Run\n")
    (tmp_path / "esper_core" / "other.py").write_text("from esper_core.studies.episodes import run_episode\n")
    (problem,) = violations(tmp_path)
    assert expected in problem
    assert "esper_core.run may not import esper_core.studies" in problem
    assert "move" in problem
