"""Packages whose public names are imported on first use (PEP 562): tools that need only
plain records (`partir.session.results`, read by the daemon's protocol and the language
server) import `partir` without importing JAX."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any


def exports(package: str, namespace: MutableMapping[str, Any],
            names_by_module: Mapping[str, tuple[str, ...]]
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of a package exporting, from each module, its names;
    a name (or a submodule) is imported when first read, then kept in the package's
    namespace."""
    module_of = {name: module for module, names in names_by_module.items() for name in names}

    def getattr_(name: str) -> Any:
        module = module_of.get(name)
        if module is None:  # a submodule, as `import partir; partir.sim` always gave
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
            namespace[name] = value
            return value
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *module_of})

    return getattr_, dir_
