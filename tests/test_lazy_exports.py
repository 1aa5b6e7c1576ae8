"""Packages that re-export their submodules' names lazily (``esper_core._lazy``) export what they say.

Each such ``__init__`` lists its re-exports twice: as imports under ``TYPE_CHECKING`` (what type
checkers read) and as the ``lazy_exports`` table (what runs). Both lists and ``__all__`` must
agree, and every name must resolve to the very object its submodule defines.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAZY = sorted(
    ".".join(path.parent.relative_to(ROOT).parts)
    for path in (ROOT / "esper_core").rglob("__init__.py")
    if "lazy_exports(" in path.read_text()
)


def _declared(package: str) -> tuple[dict[str, str], dict[str, str]]:
    """(name -> module) as imported under ``TYPE_CHECKING``, and as the ``lazy_exports`` table."""
    tree = ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())
    typed: dict[str, str] = {}
    table: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module, "only `from module import names` here"
                typed |= {alias.name: imp.module for alias in imp.names}
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            call = node.value
            if isinstance(call.func, ast.Name) and call.func.id == "lazy_exports":
                exports = ast.literal_eval(call.args[1])
                table |= {name: module for module, names in exports.items() for name in names}
    return typed, table


def test_some_packages_are_lazy() -> None:
    assert {"esper_core.run", "esper_core.tamiyo"} <= set(LAZY)


@pytest.mark.parametrize("package", LAZY)
def test_lazy_exports_match_the_typed_imports_and_all(package: str) -> None:
    typed, table = _declared(package)
    assert table == typed, f"{package}/__init__.py: the lazy_exports table and the TYPE_CHECKING imports differ"
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(table), f"{package}.__all__ and its lazy_exports table differ"
    for name, source in table.items():
        assert getattr(module, name) is getattr(importlib.import_module(source), name)
    assert set(table) <= set(dir(module))
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


def test_reading_and_planning_a_recipe_imports_no_policy_network_flow_or_database() -> None:
    # A fresh interpreter: this one has imported everything. What `esper recipes list` and
    # `esper recipes show` pay for.
    probe = (
        "import sys; from esper_core.run.recipes import RECIPES, get_recipe; [get_recipe(n) for n in RECIPES]; "
        "from esper_core.run.plan import check_recipe; check_recipe(get_recipe('mnist1d-cnn')); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch_geometric', 'prefect', 'sqlalchemy'}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]", (
        f"reading or planning the built-in recipes imports {done.stdout.strip()}: import it where it is used, "
        "not from a package __init__ or a module that only needs its types (TYPE_CHECKING)"
    )
