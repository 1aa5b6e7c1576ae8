"""Re-exports a package resolves on first use (PEP 562), so importing it imports none of them.

A package's ``__init__`` that imported every submodule it re-exports made any import below it
pay for all of them: reading ``esper_core.tamiyo.config`` imported torch-geometric (and with it
Dynamo) through ``tamiyo.actions``, and any ``esper_core.run`` submodule imported the whole run
layer, the registry's SQLAlchemy included. ``from esper_core.run import Run`` still works: the
name is looked up in its submodule when first asked for. The package also imports the same
names under ``TYPE_CHECKING``, for type checkers; ``tests/test_lazy_exports.py`` keeps the two
lists equal.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, which re-exports names from its submodules.

    Args:
        package: The package's ``__name__``.
        exports: Submodule -> the names the package re-exports from it, as its imports read.

    Returns:
        ``(__getattr__, __dir__)``, to assign at the package's top level.
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        # Kept on the package: the next lookup is a plain attribute, without this function.
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
