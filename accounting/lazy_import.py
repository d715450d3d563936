"""Modules imported on first use, so that `import dpledger`, `dpledger --help`, `dpledger account` and
`dpledger calibrate` start without torch (~1-2 s to import) and numba (~0.5 s, plus its compiler).

A module that needs torch only inside its functions binds `torch = lazy_module("torch")` at its top
(with a real `import torch` under TYPE_CHECKING for the type checker): the name is a stand-in module
whose first attribute read imports torch and copies its namespace in, so every later read is an
ordinary module-dictionary lookup. The import happens on the first call that uses torch, never at
import time; a command that never touches a tensor never pays for it.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Callable, Mapping


class LazyModule(types.ModuleType):
    """A stand-in for module `name`: reading any attribute imports the real module (once) and returns
    the real attribute; after that the stand-in's namespace holds the real module's, so attribute reads
    cost what they cost on the real module."""

    def __init__(self, name: str) -> None:
        super().__init__(name, f"stand-in for {name}, imported on first use")
        self.__dict__["_lazy_target"] = name

    def __getattr__(self, attribute: str) -> object:
        """The real module's attribute, importing the module on the first read (attributes the real
        module creates lazily itself, as torch's submodules, are read through on every miss).

        Args:
            attribute: the attribute's name.

        Returns:
            The real module's attribute.

        Raises:
            AttributeError: the real module has no such attribute.
        """
        module = importlib.import_module(self.__dict__["_lazy_target"])
        if "_lazy_loaded" not in self.__dict__:
            self.__dict__.update({key: value for key, value in vars(module).items() if key not in ("__name__", "__doc__")})
            self.__dict__["_lazy_loaded"] = True
        return getattr(module, attribute)


def lazy_module(name: str) -> types.ModuleType:
    """A stand-in for module `name` that imports it on first attribute access; the module itself when
    it is already imported (nothing is deferred then).

    Args:
        name: the module's import name, e.g. "torch".

    Returns:
        The module, or a LazyModule standing in for it.
    """
    module = sys.modules.get(name)
    return module if module is not None else LazyModule(name)


def lazy_attributes(package: str, sources: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """A package's `__getattr__` and `__dir__` (PEP 562) that import each re-exported name's module on first
    access, so importing the package (or one light module inside it) does not load its heavy modules.

    Args:
        package: the package's `__name__`, for the error message.
        sources: each re-exported name mapped to the module that defines it.

    Returns:
        (`__getattr__`, `__dir__`) to bind at the package's top level.
    """

    def __getattr__(name: str) -> object:
        if name not in sources:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(sources[name]), name)
        # bound on the package: importing a submodule of the same name (reports.render) sets the attribute
        # to the submodule, which must not shadow the re-exported function
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(sources) | set(vars(sys.modules[package])))

    return __getattr__, __dir__
